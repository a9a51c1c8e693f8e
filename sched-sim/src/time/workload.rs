//! Guest workloads as data: what a guest program does in one iteration of
//! its main loop, and the profiles of FairGV's Table 3.

/// One step of a guest program's loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Compute on the vCPU for this many ns.
    Cpu(u64),
    /// Launch a kernel of this many ns of GPU time, asynchronously.
    Launch(u64),
    /// A synchronous call (a device operation of this many ns, e.g. a small
    /// device-to-host copy): it runs after all earlier work of the guest and
    /// the guest waits for its reply, spinning then blocking.
    Sync(u64),
    /// Sleep until the next multiple of this period (a periodic workload:
    /// the time not spent working in a period is its sleep).
    SleepUntilPeriod(u64),
}

/// A guest workload: its loop, named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Short name for tables.
    pub name: String,
    /// One iteration of the loop; throughput is counted in iterations.
    pub steps: Vec<Step>,
}

impl Workload {
    /// A workload from its name and loop.
    pub fn new(name: impl Into<String>, steps: Vec<Step>) -> Self {
        Workload {
            name: name.into(),
            steps,
        }
    }

    /// `kernels` async launches of `kernel_ns` then one small synchronous
    /// copy and `cpu_ns` of host code: a throughput-bound GPU program.
    pub fn async_batch(name: &str, kernel_ns: u64, kernels: usize, cpu_ns: u64) -> Self {
        let mut steps = vec![Step::Launch(kernel_ns); kernels];
        steps.push(Step::Sync(3_000));
        steps.push(Step::Cpu(cpu_ns));
        Workload::new(name, steps)
    }

    /// MM (matrix multiplication): 207 us kernels, asynchronous.
    pub fn mm() -> Self {
        Workload::async_batch("MM", 207_000, 16, 20_000)
    }

    /// HS (hotspot): 133 us kernels, asynchronous.
    pub fn hs() -> Self {
        Workload::async_batch("HS", 133_000, 16, 20_000)
    }

    /// MM with a different kernel size (the background of the kernel-size
    /// scenario).
    pub fn mm_kernel(kernel_ns: u64) -> Self {
        Workload::async_batch(&format!("MM{}us", kernel_ns / 1000), kernel_ns, 16, 20_000)
    }

    /// BS (black-scholes): a 377 us kernel, then a synchronous result copy,
    /// about 26 synchronous calls per 10 ms.
    pub fn bs() -> Self {
        Workload::new(
            "BS",
            vec![Step::Launch(377_000), Step::Sync(1_000), Step::Cpu(4_000)],
        )
    }

    /// SRD1 (speckle-reducing diffusion): a 46 us kernel followed by four
    /// small synchronous calls with host code between, about 640
    /// synchronous calls per 10 ms: strongly CPU-GPU interactive.
    pub fn srd1() -> Self {
        let mut steps = vec![Step::Launch(46_000)];
        for _ in 0..4 {
            steps.push(Step::Sync(500));
            steps.push(Step::Cpu(500));
        }
        Workload::new("SRD1", steps)
    }

    /// MM working `busy_pct` percent of every 20 ms period and sleeping the
    /// rest.
    pub fn mm_sleeping(sleep_pct: u64) -> Self {
        let period = 20_000_000;
        let busy = period * (100 - sleep_pct.min(95)) / 100;
        // 207 us kernels, a result copy every 16.
        let kernels = (busy / 207_000).max(1) as usize;
        let mut steps = Vec::new();
        for i in 0..kernels {
            steps.push(Step::Launch(207_000));
            if i % 16 == 15 {
                steps.push(Step::Sync(3_000));
            }
        }
        steps.push(Step::Sync(3_000));
        steps.push(Step::SleepUntilPeriod(period));
        Workload::new(format!("MM-sleep{sleep_pct}"), steps)
    }

    /// Whether one iteration takes time (every launch and synchronous call
    /// costs the guest CPU time; a loop of only `Cpu(0)` would not).
    pub fn is_well_formed(&self) -> bool {
        self.steps.iter().any(|s| !matches!(s, Step::Cpu(0)))
    }
}
