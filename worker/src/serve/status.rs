//! `VgpuStatus`: the vGPU as a monitor in the guest sees it (the NVML
//! stand-in asks on a channel of its own that never said `Hello`): its
//! memory limit and what its processes hold, its share of the GPU, and its
//! processes. Answered from the figures the worker keeps; nothing here
//! touches the device.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use protocol::{Reply, VgpuStatus};

use super::sessions::Sessions;
use super::shared::Shared;

/// The shortest interval a utilization figure is measured over: asked
/// more often, the last figure is answered again.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

/// The vGPU's share of its GPU: GPU time charged to it (its busy periods)
/// over wall time, between one ask and the next.
#[derive(Debug, Default)]
pub(super) struct UtilMeter {
    /// When the last figure was taken, and the charged time then.
    mark: Option<(Instant, u64)>,
    /// The last figure, parts per million.
    last_ppm: u64,
}

impl UtilMeter {
    /// The share since the last figure (parts per million, at most 10^6),
    /// given the GPU time charged so far (ns).
    fn sample(&mut self, now: Instant, charged_ns: u64) -> u64 {
        match self.mark {
            Some((t, _)) if now.duration_since(t) < MIN_INTERVAL => {}
            Some((t, c)) => {
                let wall = now.duration_since(t).as_nanos().max(1);
                let busy = u128::from(charged_ns.saturating_sub(c));
                self.last_ppm = (busy * 1_000_000 / wall).min(1_000_000) as u64;
                self.mark = Some((now, charged_ns));
            }
            None => self.mark = Some((now, charged_ns)),
        }
        self.last_ppm
    }
}

/// The reply and data of a `VgpuStatus` asking for processes from
/// `first` on: as many as fit in one message of `sh.port.chunk` bytes.
pub(super) fn answer(sh: &mut Shared, ss: &Sessions, first: u32) -> (Reply, Vec<u8>) {
    let charged = sh.port.stats.charged_ns.load(Ordering::Relaxed) + sh.slice.charged_ns;
    let util_ppm = sh.figures.util.sample(Instant::now(), charged);
    // A process slot's worker lists the VM's processes as every slot's
    // worker published them.
    let published = sh.mem.ledger.as_ref().filter(|_| sh.port.slot.is_some());
    let procs = match published.map(crate::ledger::Ledger::processes) {
        Some(all) => all
            .into_iter()
            .map(|(pid, mem_used)| protocol::VgpuProcess { pid, mem_used })
            .collect(),
        None => ss.processes(),
    };
    let fit = VgpuStatus::fit(sh.port.info_bytes.len(), sh.port.chunk);
    let from = (first as usize).min(procs.len());
    let upto = procs.len().min(from.saturating_add(fit));
    let data = VgpuStatus::encode(&sh.port.info_bytes, &procs[from..upto]);
    let r = Reply {
        vals: [
            sh.mem.limit(&sh.port.link),
            sh.mem.vgpu_used(),
            util_ppm,
            procs.len() as u64,
        ],
    };
    (r, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utilization_is_charged_time_over_wall_time() {
        let mut m = UtilMeter::default();
        let t0 = Instant::now();
        assert_eq!(m.sample(t0, 0), 0, "the first ask only marks");
        // Half of 200 ms charged.
        let t1 = t0 + Duration::from_millis(200);
        assert_eq!(m.sample(t1, 100_000_000), 500_000);
        // Asked again too soon: the same figure.
        assert_eq!(
            m.sample(t1 + Duration::from_millis(10), 900_000_000),
            500_000
        );
        // Charged more than the wall time (overlapping periods): capped.
        let t2 = t1 + Duration::from_millis(200);
        assert_eq!(m.sample(t2, 900_000_000), 1_000_000);
        // Idle.
        assert_eq!(m.sample(t2 + Duration::from_secs(1), 900_000_000), 0);
    }
}
