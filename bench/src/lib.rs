//! Benchmarks. Each prints ratios against a baseline measured in the same run.

pub mod accounting;
pub mod checkpoint;
pub mod cmd;
pub mod density;
pub mod fairness;
pub mod fairness_sim;
pub mod fixture;
pub mod handover_link;
pub mod hogs;
pub mod hostile;
pub mod migrate;
pub mod overhead;
mod overhead_probes;
pub mod placement;
pub mod procfs;
pub mod recovery;
pub mod ring;
pub mod scale;
pub mod slicing;
pub mod soak;
pub mod space;
pub mod threads;

/// Percentile of a sorted slice (p in 0..=100).
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}
