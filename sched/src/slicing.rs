//! Kernel slicing: a kernel whose grid exceeds a configured number of blocks
//! runs as sub-grids along x of no fewer than `MIN_BLOCKS` blocks each, so
//! one tenant cannot hold a non-preemptive GPU for seconds.

/// FairGV's lower bound on a sub-grid's blocks.
pub const MIN_BLOCKS: u64 = 1500;

/// One sub-grid: columns [x_offset, x_offset + x_count) of the grid, all of y and z.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubGrid {
    /// First x block.
    pub x_offset: u32,
    /// Number of x blocks.
    pub x_count: u32,
}

/// Splits a grid of (x, y, z) blocks into sub-grids of about `max_blocks`
/// blocks (never fewer than `MIN_BLOCKS`, except a grid smaller than that).
pub fn slice_grid(x: u32, y: u32, z: u32, max_blocks: u64) -> Vec<SubGrid> {
    let column = u64::from(y.max(1)) * u64::from(z.max(1));
    let total = u64::from(x) * column;
    if x == 0 || total <= max_blocks.max(MIN_BLOCKS) {
        return vec![SubGrid {
            x_offset: 0,
            x_count: x,
        }];
    }
    let target = max_blocks.max(MIN_BLOCKS);
    // At most x, a u32.
    let cols = u32::try_from(target.div_ceil(column).clamp(1, u64::from(x))).unwrap_or(x);
    let mut out = Vec::new();
    let mut off = 0u32;
    while off < x {
        let n = cols.min(x - off);
        out.push(SubGrid {
            x_offset: off,
            x_count: n,
        });
        off += n;
    }
    // A small remainder joins the sub-grid before it.
    if out.len() > 1 && u64::from(out[out.len() - 1].x_count) * column < MIN_BLOCKS {
        let last = out.pop().map_or(0, |s| s.x_count);
        if let Some(prev) = out.last_mut() {
            prev.x_count += last;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn sub_grids_cover_the_grid_and_respect_the_minimum(
            x in 1u32..200_000, y in 1u32..64, z in 1u32..4, max_blocks in 1u64..100_000,
        ) {
            let parts = slice_grid(x, y, z, max_blocks);
            let column = u64::from(y) * u64::from(z);
            let mut next = 0;
            for p in &parts {
                prop_assert_eq!(p.x_offset, next);
                prop_assert!(p.x_count > 0);
                next += p.x_count;
                if parts.len() > 1 {
                    prop_assert!(u64::from(p.x_count) * column >= MIN_BLOCKS);
                }
            }
            prop_assert_eq!(next, x);
        }
    }

    #[test]
    fn small_grids_are_not_sliced() {
        assert_eq!(
            slice_grid(100, 1, 1, 10),
            vec![SubGrid {
                x_offset: 0,
                x_count: 100
            }]
        );
        assert_eq!(slice_grid(10_000, 1, 1, 4000).len(), 3);
    }
}
