//! Call results, numbered as the CUDA driver API's `CUresult`, so the guest
//! library can hand them to programs unchanged.

/// A call's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// CUDA_SUCCESS
    Success = 0,
    /// CUDA_ERROR_INVALID_VALUE
    InvalidValue = 1,
    /// CUDA_ERROR_OUT_OF_MEMORY
    OutOfMemory = 2,
    /// CUDA_ERROR_NOT_INITIALIZED
    NotInitialized = 3,
    /// CUDA_ERROR_NO_DEVICE
    NoDevice = 100,
    /// CUDA_ERROR_INVALID_IMAGE
    InvalidImage = 200,
    /// CUDA_ERROR_INVALID_CONTEXT
    InvalidContext = 201,
    /// CUDA_ERROR_INVALID_PTX
    InvalidPtx = 218,
    /// CUDA_ERROR_INVALID_HANDLE
    InvalidHandle = 400,
    /// CUDA_ERROR_NOT_FOUND
    NotFound = 500,
    /// CUDA_ERROR_NOT_READY
    NotReady = 600,
    /// CUDA_ERROR_ILLEGAL_ADDRESS
    IllegalAddress = 700,
    /// CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    LaunchOutOfResources = 701,
    /// CUDA_ERROR_LAUNCH_FAILED
    LaunchFailed = 719,
    /// CUDA_ERROR_NOT_SUPPORTED
    NotSupported = 801,
    /// CUDA_ERROR_UNKNOWN
    Unknown = 999,
}

impl Status {
    /// From a raw code; unknown codes map to `Unknown`.
    pub fn from_code(c: u32) -> Status {
        use Status::*;
        match c {
            0 => Success,
            1 => InvalidValue,
            2 => OutOfMemory,
            3 => NotInitialized,
            100 => NoDevice,
            200 => InvalidImage,
            201 => InvalidContext,
            218 => InvalidPtx,
            400 => InvalidHandle,
            500 => NotFound,
            600 => NotReady,
            700 => IllegalAddress,
            701 => LaunchOutOfResources,
            719 => LaunchFailed,
            801 => NotSupported,
            _ => Unknown,
        }
    }

    /// The raw code.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// Whether the error leaves the context (on a real GPU: every context
    /// of the process) unusable: a kernel faulted. Only a new process
    /// recovers.
    pub fn is_sticky(self) -> bool {
        matches!(self, Status::IllegalAddress | Status::LaunchFailed)
    }
}
