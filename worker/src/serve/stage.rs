//! A spare staged for a vGPU another host is about to hand over: the
//! modules of that vGPU's checkpoint, taken while its guest still ran
//! there, loaded ahead into the context the spare made, so that the
//! restore during the guest's pause takes them instead of loading them
//! (see `executor/staged.rs`). Only the first process of the stream is
//! staged: a spare has one context.

use std::os::fd::OwnedFd;

use super::checkpoint::{read_stream, CheckpointError};
use super::setup::Warm;
use crate::Error;

impl Warm {
    /// Loads ahead the modules of the first guest process in the
    /// checkpoint `stream` (a memfd) into the context made ahead; how many.
    /// Nothing is staged where no context is made.
    pub fn stage(&mut self, stream: &OwnedFd) -> Result<usize, Error> {
        let image = read_stream(stream, &crate::checkpoint::Limits::default())?;
        let (Some(pool), Some(first)) = (self.contexts.as_mut(), image.sessions.first()) else {
            return Ok(0);
        };
        let Some(ctx) = pool.made_mut() else {
            return Ok(0);
        };
        ctx.stage(&first.context).map_err(|status| {
            CheckpointError::Executor {
                pid: first.pid,
                status,
            }
            .into()
        })
    }

    /// Unloads what was staged (the spare is bound to another VM, or not
    /// for a restore).
    pub fn unstage(&mut self) {
        if let Some(ctx) = self.contexts.as_mut().and_then(|p| p.made_mut()) {
            ctx.unstage();
        }
    }
}
