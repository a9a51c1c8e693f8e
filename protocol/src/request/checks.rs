//! The checks the request table names for its fields. Each takes the
//! field's name, its raw value (see [`Wire::Raw`](super::wire::Wire::Raw))
//! and any arguments the row gives (earlier fields, limits), and refuses
//! a value the host must not see with the field's name and why.

use crate::{
    bad, launch_flags, Dim3, ProtoError, MAX_CLUSTER_BLOCKS, MAX_FUNC_ATTRIBUTE, MAX_LEN,
    VMM_GRANULARITY,
};

type Check = Result<(), ProtoError>;

/// At most `max`.
pub(super) fn at_most<T: Copy + Into<u64>>(
    field: &'static str,
    v: &T,
    max: impl Into<u64>,
) -> Check {
    let (v, max) = ((*v).into(), max.into());
    if v > max {
        return Err(bad(field, format!("{v} exceeds {max}")));
    }
    Ok(())
}

/// At most `max`, and not 0 (`empty` says why 0 is refused).
pub(super) fn some_at_most(field: &'static str, v: &u64, max: u64, empty: &str) -> Check {
    at_most(field, v, max)?;
    if *v == 0 {
        return Err(bad(field, empty));
    }
    Ok(())
}

/// A token or pool handle: never 0 (0 names nothing the host hands out).
pub(super) fn nonzero(field: &'static str, v: &u64) -> Check {
    if *v == 0 {
        return Err(bad(field, "0 names nothing"));
    }
    Ok(())
}

/// A VMM size (at most [`MAX_LEN`]) or address: nonzero, a multiple of
/// [`VMM_GRANULARITY`].
pub(super) fn vmm(field: &'static str, v: &u64) -> Check {
    let max = if field == "size" { MAX_LEN } else { u64::MAX };
    if *v == 0 || !v.is_multiple_of(VMM_GRANULARITY) || *v > max {
        return Err(bad(
            field,
            format!("{v:#x} is not a nonzero multiple of 2 MiB"),
        ));
    }
    Ok(())
}

/// A reservation's alignment: 0 (the default) or a power of two, at most
/// [`MAX_LEN`].
pub(super) fn vmm_align(field: &'static str, v: &u64) -> Check {
    if *v != 0 && (!v.is_power_of_two() || *v > MAX_LEN) {
        return Err(bad(field, format!("{v:#x}")));
    }
    Ok(())
}

/// A reservation's address hint: 0, or a granular address; either way
/// the reservation within the user address space (47 bits).
pub(super) fn vmm_hint(field: &'static str, addr: &u64, size: u64) -> Check {
    if *addr != 0 {
        vmm(field, addr)?;
    }
    if addr.checked_add(size).is_none_or(|end| end > 1 << 47) {
        return Err(bad(field, format!("{addr:#x} + {size:#x} past 2^47")));
    }
    Ok(())
}

/// An offset in a VMM handle's memory: granular, at most [`MAX_LEN`].
pub(super) fn vmm_offset(field: &'static str, v: &u64) -> Check {
    if !v.is_multiple_of(VMM_GRANULARITY) || *v > MAX_LEN {
        return Err(bad(field, format!("{v:#x}")));
    }
    Ok(())
}

/// `CU_MEM_ALLOCATION_COMP_NONE` or `_GENERIC`, nothing else.
pub(super) fn comp_type(field: &'static str, v: &u32) -> Check {
    if *v > 1 {
        return Err(bad(field, format!("{v} is no CUmemAllocationCompType")));
    }
    Ok(())
}

/// `CUmemAccess_flags`: read (1) or read-write (3).
pub(super) fn access_flags(field: &'static str, v: &u32) -> Check {
    if !matches!(v, 1 | 3) {
        return Err(bad(field, format!("access flags {v:#x}")));
    }
    Ok(())
}

/// A memset's element width: 1, 2 or 4 bytes.
pub(super) fn elem_width(field: &'static str, v: &u32) -> Check {
    if !matches!(v, 1 | 2 | 4) {
        return Err(bad(field, format!("{v} is not 1, 2 or 4")));
    }
    Ok(())
}

/// Threads per block: 1 to 1024.
pub(super) fn threads(field: &'static str, v: &u32) -> Check {
    if *v == 0 || *v > 1024 {
        return Err(bad(field, format!("{v} threads")));
    }
    Ok(())
}

/// Blocks per multiprocessor: 1 to 2048.
pub(super) fn blocks(field: &'static str, v: &u32) -> Check {
    if *v == 0 || *v > 2048 {
        return Err(bad(field, format!("{v} blocks")));
    }
    Ok(())
}

/// Dynamic shared memory per block: at most 256 KiB.
pub(super) fn smem(field: &'static str, v: &u32) -> Check {
    if *v > 256 << 10 {
        return Err(bad(field, format!("{v} bytes")));
    }
    Ok(())
}

/// A launch's grid, block and (as the field checked) dynamic shared
/// memory: the limits of CUDA's devices.
pub(super) fn shape(_: &'static str, shared_mem: &u32, grid: Dim3, block: Dim3) -> Check {
    if grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > i32::MAX as u32 {
        return Err(bad("grid", format!("{grid:?} out of range")));
    }
    if grid.y > 65_535 || grid.z > 65_535 {
        return Err(bad(
            "grid",
            format!("{grid:?}: y and z are limited to 65535"),
        ));
    }
    if block.x == 0 || block.y == 0 || block.z == 0 || block.count() > 1024 || block.z > 64 {
        return Err(bad("block", format!("{block:?} out of range")));
    }
    smem("shared_mem", shared_mem)
}

/// An occupancy question's shape: a launch's, and any cluster of at most
/// 1024 blocks (a question, not a launch: the driver answers for sizes
/// it cannot run).
pub(super) fn occupancy_shape(
    field: &'static str,
    shared_mem: &u32,
    grid: Dim3,
    block: Dim3,
    cluster: Dim3,
) -> Check {
    shape(field, shared_mem, grid, block)?;
    if cluster.count() > 1024 {
        return Err(bad("cluster", format!("{cluster:?}")));
    }
    Ok(())
}

/// A launch's cluster shape: none (all zero), or every dimension set, at
/// most [`MAX_CLUSTER_BLOCKS`] blocks, dividing the grid.
pub(super) fn divides(_: &'static str, cluster: &Dim3, grid: Dim3) -> Check {
    if *cluster == Dim3::default() {
        return Ok(());
    }
    let dims = [
        (grid.x, cluster.x),
        (grid.y, cluster.y),
        (grid.z, cluster.z),
    ];
    if cluster.count() > MAX_CLUSTER_BLOCKS || dims.iter().any(|&(g, c)| c == 0 || g % c != 0) {
        return Err(bad("cluster", format!("{cluster:?} for grid {grid:?}")));
    }
    Ok(())
}

/// [`launch_flags`] only.
pub(super) fn launch_flags(field: &'static str, v: &u32) -> Check {
    if v & !launch_flags::COOPERATIVE != 0 {
        return Err(bad(field, format!("unknown launch flags {v:#x}")));
    }
    Ok(())
}

/// `CU_STREAM_DEFAULT` or `CU_STREAM_NON_BLOCKING`.
pub(super) fn stream_flags(field: &'static str, v: &u32) -> Check {
    if *v > 1 {
        return Err(bad(field, format!("unknown stream flags {v:#x}")));
    }
    Ok(())
}

/// A stream priority the driver could clamp: -64 to 64.
pub(super) fn stream_priority(field: &'static str, v: &i32) -> Check {
    if !(-64..=64).contains(v) {
        return Err(bad(field, format!("{v}")));
    }
    Ok(())
}

/// `CU_EVENT_WAIT_DEFAULT` or `_EXTERNAL`.
pub(super) fn wait_flags(field: &'static str, v: &u32) -> Check {
    if *v > 1 {
        return Err(bad(field, format!("unknown wait flags {v:#x}")));
    }
    Ok(())
}

/// 0, or `CU_GRAPH_COND_ASSIGN_DEFAULT`.
pub(super) fn cond_flags(field: &'static str, v: &u32) -> Check {
    if *v > 1 {
        return Err(bad(field, format!("conditional handle flags {v}")));
    }
    Ok(())
}

/// A `CUfunction_attribute` up to [`MAX_FUNC_ATTRIBUTE`].
pub(super) fn known_func_attr(field: &'static str, v: &u32) -> Check {
    if *v > MAX_FUNC_ATTRIBUTE {
        return Err(bad(field, format!("function attribute {v} unknown")));
    }
    Ok(())
}

/// The range of a settable function attribute (`None`: read-only).
fn func_attr_range(attr: u32) -> Option<std::ops::RangeInclusive<i32>> {
    Some(match attr {
        8 => 0..=256 << 10,
        9 => -1..=100,
        11..=13 => 0..=i32::try_from(MAX_CLUSTER_BLOCKS).unwrap_or(i32::MAX),
        14 => 0..=1,
        15 => 0..=2,
        _ => return None,
    })
}

/// A function attribute the guest may set.
pub(super) fn settable_func_attr(field: &'static str, v: &u32) -> Check {
    if func_attr_range(*v).is_none() {
        return Err(bad(field, format!("function attribute {v} is read-only")));
    }
    Ok(())
}

/// A value in the range of function attribute `attr`.
pub(super) fn func_attr_value(field: &'static str, v: &i32, attr: u32) -> Check {
    if !func_attr_range(attr).is_some_and(|range| range.contains(v)) {
        return Err(bad(field, format!("{v} for function attribute {attr}")));
    }
    Ok(())
}

/// One of [`crate::stream_attr::id::ALL`].
pub(super) fn stream_attr_id(field: &'static str, v: &u32) -> Check {
    if !crate::stream_attr::id::ALL.contains(v) {
        return Err(bad(field, format!("unknown stream attribute {v}")));
    }
    Ok(())
}
