//! The `Timing` family of [`super::Context`]: device time: of timed launches and of busy periods
//! (the worker's accounting).

use protocol::Status;

use super::Handle;

/// Device time: of timed launches and of busy periods (the worker's accounting).
pub trait Timing {
    /// GPU times (function, ns) of timed launches that have completed.
    fn take_timings(&mut self) -> Vec<(Handle, u64)> {
        Vec::new()
    }
    /// Starts timing a busy period on the device. Called when the context's
    /// work is drained, before the period's first operation.
    fn period_begin(&mut self) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
    /// Ends the period after the work submitted so far to `streams` (0: the
    /// default stream).
    fn period_end(&mut self, _streams: &[Handle]) -> Result<(), Status> {
        Err(Status::NotSupported)
    }
    /// The device time of the ended period, once its work has completed
    /// (taken once; `None` if it was not timed or is not complete).
    fn period_ns(&mut self) -> Option<u64> {
        None
    }
}
