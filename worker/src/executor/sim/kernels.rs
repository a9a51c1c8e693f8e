//! The kernels of `kernels/fairvgpu.ptx`, `kernels/faults.ptx` and
//! `kernels/conditional.ptx`,
//! implemented in Rust on the model's memory and found by entry name; each
//! returns its modeled time.

use protocol::{Dim3, Status};

use super::context::SimContext;

pub(super) type Kernel = fn(&mut SimContext, Dim3, Dim3, &[u8]) -> Result<u64, Status>;

pub(super) fn kernel_by_name(name: &str) -> Option<Kernel> {
    Some(match name {
        "vector_add" => k_vector_add,
        "saxpy" => k_saxpy,
        "spin_ns" => k_spin,
        "empty" => k_empty,
        "atomic_count" => k_atomic_count,
        "list_inc" => k_list_inc,
        "list_sum" => k_list_sum,
        "spin_blocks" => k_spin_blocks,
        "fvg_printf" => k_printf,
        "fvg_assert" => k_assert,
        "fvg_trap" => k_trap,
        "cond_set" => k_cond_set,
        "cond_countdown" => k_cond_countdown,
        _ => return None,
    })
}

fn u64_at(p: &[u8], off: usize) -> u64 {
    p.get(off..off + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
}
fn u32_at(p: &[u8], off: usize) -> u32 {
    p.get(off..off + 4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap_or([0; 4])))
}

fn threads(grid: Dim3, block: Dim3) -> u64 {
    u64::from(grid.x) * u64::from(block.x)
}

fn k_vector_add(c: &mut SimContext, grid: Dim3, block: Dim3, p: &[u8]) -> Result<u64, Status> {
    let (a, b, out, n) = (u64_at(p, 0), u64_at(p, 8), u64_at(p, 16), u32_at(p, 24));
    let n = crate::usize_from(u64::from(n).min(threads(grid, block)));
    let x = c.read_f32s(a, n)?;
    let y = c.read_f32s(b, n)?;
    let z: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p + q).collect();
    c.write_f32s(out, &z)?;
    Ok(c.mem_ns(12 * n as u64))
}

fn k_saxpy(c: &mut SimContext, grid: Dim3, block: Dim3, p: &[u8]) -> Result<u64, Status> {
    let a = f32::from_bits(u32_at(p, 0));
    let (x, y, n) = (u64_at(p, 4), u64_at(p, 12), u32_at(p, 20));
    let n = crate::usize_from(u64::from(n).min(threads(grid, block)));
    let xs = c.read_f32s(x, n)?;
    let mut ys = c.read_f32s(y, n)?;
    for (yi, xi) in ys.iter_mut().zip(&xs) {
        *yi = a.mul_add(*xi, *yi);
    }
    c.write_f32s(y, &ys)?;
    Ok(c.mem_ns(12 * n as u64))
}

/// Walks the linked list at `head` (nodes {u64 next; f32 value; u32 pad}),
/// at most `n` nodes, calling `f` on each node's value.
fn walk_list(
    c: &mut SimContext,
    head: u64,
    n: u32,
    mut f: impl FnMut(&mut [u8]),
) -> Result<u64, Status> {
    let (mut node, mut seen) = (head, 0u64);
    while node != 0 && seen < u64::from(n) {
        let (mut buf, off) = c.locate(node, 16)?;
        f(&mut buf[off + 8..off + 12]);
        node = u64::from_le_bytes(
            buf[off..off + 8]
                .try_into()
                .map_err(|_| Status::IllegalAddress)?,
        );
        seen += 1;
    }
    // A dependent load per node.
    Ok(seen * 400)
}

fn k_list_inc(c: &mut SimContext, _g: Dim3, _b: Dim3, p: &[u8]) -> Result<u64, Status> {
    walk_list(c, u64_at(p, 0), u32_at(p, 8), |v| {
        let x = f32::from_le_bytes([v[0], v[1], v[2], v[3]]) + 1.0;
        v.copy_from_slice(&x.to_le_bytes());
    })
}

fn k_list_sum(c: &mut SimContext, _g: Dim3, _b: Dim3, p: &[u8]) -> Result<u64, Status> {
    let (head, out, n) = (u64_at(p, 0), u64_at(p, 8), u32_at(p, 16));
    let mut sum = 0.0f32;
    let ns = walk_list(c, head, n, |v| {
        sum += f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
    })?;
    c.write_f32s(out, &[sum])?;
    Ok(ns)
}

/// Every block spins `ns`, in waves of 132 SMs x 32 blocks; out[b] = b.
fn k_spin_blocks(c: &mut SimContext, grid: Dim3, _b: Dim3, p: &[u8]) -> Result<u64, Status> {
    let (out, ns) = (u64_at(p, 0), u64_at(p, 8).min(10_000_000_000));
    let blocks = grid.x;
    let (mut buf, off) = c.locate(out, u64::from(blocks) * 4)?;
    for b in 0..blocks {
        let at = off + 4 * crate::usize_from(u64::from(b));
        buf[at..at + 4].copy_from_slice(&b.to_le_bytes());
    }
    let waves = u64::from(blocks).div_ceil(132 * 32);
    Ok(waves.saturating_mul(ns).min(10_000_000_000))
}

fn k_spin(_c: &mut SimContext, _g: Dim3, _b: Dim3, p: &[u8]) -> Result<u64, Status> {
    Ok(u64_at(p, 0).min(10_000_000_000))
}

fn k_atomic_count(c: &mut SimContext, grid: Dim3, block: Dim3, p: &[u8]) -> Result<u64, Status> {
    let ptr = u64_at(p, 0);
    // Saturating: grid and block sizes are the guest's.
    let threads = grid.count().saturating_mul(block.count());
    let (mut buf, off) = c.locate(ptr, 4)?;
    let v = u32::from_le_bytes(
        buf[off..off + 4]
            .try_into()
            .map_err(|_| Status::IllegalAddress)?,
    );
    // The count wraps at 2^32, as a GPU's 32-bit atomicAdd would: keeping
    // the low 32 bits of the threads is the point.
    #[allow(clippy::cast_possible_truncation)]
    let added = v.wrapping_add(threads as u32);
    buf[off..off + 4].copy_from_slice(&added.to_le_bytes());
    Ok(threads.min(10_000_000_000))
}

fn k_empty(_c: &mut SimContext, _g: Dim3, _b: Dim3, _p: &[u8]) -> Result<u64, Status> {
    Ok(0)
}

/// A kernel of the program's own, which the model cannot run.
pub(super) fn k_unmodeled(
    _c: &mut SimContext,
    _g: Dim3,
    _b: Dim3,
    _p: &[u8],
) -> Result<u64, Status> {
    Err(Status::NotSupported)
}

/// The parameters of `vector_add(a, b, c, n)`, packed as a launch takes
/// them (the unit tests of the model's files share it).
#[cfg(test)]
pub(super) fn vector_add_params(a: u64, b: u64, c: u64, n: u32) -> Vec<u8> {
    let mut p = Vec::new();
    for x in [a, b, c] {
        p.extend_from_slice(&x.to_le_bytes());
    }
    p.extend_from_slice(&n.to_le_bytes());
    p
}

/// `printf("kernel %d thread %d\n", tag, threadIdx.x)` in every thread of
/// one block (the model prints the first block's threads, in order).
fn k_printf(c: &mut SimContext, _grid: Dim3, block: Dim3, p: &[u8]) -> Result<u64, Status> {
    let tag = i32::from_le_bytes(u32_at(p, 0).to_le_bytes());
    let mut text = Vec::new();
    for t in 0..block.x {
        text.extend_from_slice(format!("kernel {tag} thread {t}\n").as_bytes());
    }
    c.print(0, &text);
    Ok(2_000)
}

/// `assert(p == nullptr)`: a non-null `p` fails the assert, with the
/// driver's message, and poisons the device (`CUDA_ERROR_ASSERT`).
fn k_assert(c: &mut SimContext, _grid: Dim3, _block: Dim3, p: &[u8]) -> Result<u64, Status> {
    if u64_at(p, 0) == 0 {
        return Ok(1_000);
    }
    c.print(
        1,
        b"faults.cu:6: void fvg_assert(const int *): block: [0,0,0], thread: [0,0,0] \
          Assertion `p == nullptr` failed.\n",
    );
    Err(Status::from_code(710))
}

/// A `trap` instruction: the launch fails (`CUDA_ERROR_LAUNCH_FAILED`).
fn k_trap(_c: &mut SimContext, _grid: Dim3, _block: Dim3, _p: &[u8]) -> Result<u64, Status> {
    Err(Status::from_code(719))
}

/// `cond_set(handle, const unsigned *flag)`: sets the conditional handle to
/// `*flag` (`cudaGraphSetConditional`).
fn k_cond_set(c: &mut SimContext, _grid: Dim3, _block: Dim3, p: &[u8]) -> Result<u64, Status> {
    let (handle, flag) = (u64_at(p, 0), u64_at(p, 8));
    let v = read_u32(c, flag)?;
    c.set_conditional(handle, v)?;
    Ok(1_000)
}

/// `cond_countdown(handle, unsigned *counter)`: decrements `*counter` (when
/// not 0) and sets the handle to 0 once it reaches 0 (the body of a loop
/// that runs `*counter` times).
fn k_cond_countdown(
    c: &mut SimContext,
    _grid: Dim3,
    _block: Dim3,
    p: &[u8],
) -> Result<u64, Status> {
    let (handle, counter) = (u64_at(p, 0), u64_at(p, 8));
    let v = read_u32(c, counter)?.saturating_sub(1);
    c.write_f32s(counter, &[f32::from_bits(v)])?;
    if v == 0 {
        c.set_conditional(handle, 0)?;
    }
    Ok(1_000)
}

/// The 4 bytes at `ptr` as a `u32`.
fn read_u32(c: &mut SimContext, ptr: u64) -> Result<u32, Status> {
    Ok(c.read_f32s(ptr, 1)?[0].to_bits())
}
