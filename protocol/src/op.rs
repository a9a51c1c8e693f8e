//! Opcodes on the wire.

#![allow(missing_docs)]

pub const HELLO: u32 = 1;
pub const JOIN: u32 = 5;
pub const CTX_SYNCHRONIZE: u32 = 2;
pub const MEM_ALLOC: u32 = 10;
pub const MEM_FREE: u32 = 11;
pub const MEM_GET_INFO: u32 = 12;
pub const MEM_FREE_ASYNC: u32 = 17;
pub const PINNED_ALLOC: u32 = 18;
pub const PINNED_FREE: u32 = 19;
pub const MEMCPY_HTOD_PINNED: u32 = 6;
pub const MEMCPY_DTOH_PINNED: u32 = 7;
pub const MEMCPY_HTOD: u32 = 13;
pub const MEMCPY_DTOH: u32 = 14;
pub const MEMCPY_DTOD: u32 = 15;
pub const MEMSET: u32 = 16;
pub const MODULE_LOAD: u32 = 20;
pub const MODULE_UNLOAD: u32 = 21;
pub const MODULE_GET_FUNCTION: u32 = 22;
pub const FUNC_GET_ATTRIBUTE: u32 = 23;
pub const OCCUPANCY: u32 = 24;
pub const MODULE_GET_GLOBAL: u32 = 25;
pub const OCCUPANCY_SMEM: u32 = 28;
pub const OCCUPANCY_CLUSTERS: u32 = 29;
pub const TENSOR_MAP_ENCODE: u32 = 90;
pub const MODULE_LOAD_CACHED: u32 = 91;
pub const LINK: u32 = 26;
pub const FUNC_SET_ATTRIBUTE: u32 = 27;
pub const CTX_GET_LIMIT: u32 = 3;
pub const CTX_SET_LIMIT: u32 = 4;
pub const LAUNCH: u32 = 30;
pub const STREAM_CREATE: u32 = 40;
pub const STREAM_DESTROY: u32 = 41;
pub const STREAM_SYNCHRONIZE: u32 = 42;
pub const STREAM_QUERY: u32 = 43;
pub const STREAM_WAIT_EVENT: u32 = 44;
pub const HOST_FN: u32 = 45;
pub const WAIT_HOST_FN: u32 = 46;
pub const HOST_FN_DONE: u32 = 47;
pub const EVENT_CREATE: u32 = 50;
pub const EVENT_DESTROY: u32 = 51;
pub const EVENT_RECORD: u32 = 52;
pub const EVENT_SYNCHRONIZE: u32 = 53;
pub const EVENT_QUERY: u32 = 54;
pub const EVENT_ELAPSED_TIME: u32 = 55;
pub const VMM_RESERVE: u32 = 80;
pub const VMM_ADDRESS_FREE: u32 = 81;
pub const VMM_CREATE: u32 = 82;
pub const VMM_RELEASE: u32 = 83;
pub const VMM_MAP: u32 = 84;
pub const VMM_UNMAP: u32 = 85;
pub const VMM_SET_ACCESS: u32 = 86;
pub const VMM_RETAIN: u32 = 87;
/// A continuation chunk of the previous message's data.
pub const DATA: u32 = 100;
