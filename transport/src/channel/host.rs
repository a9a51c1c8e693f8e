//! The host's end of a channel: its rings, recording that it serves the
//! claim, giving a claim up (LOST), and reclaiming the channel between
//! owners.

use std::sync::atomic::Ordering;

use super::claim::{ABANDONED, CLAIMED, FREE, LOST};
use super::{ClaimState, Region};
use crate::error::Result;
use crate::layout::ctl;
use crate::ring::{Consumer, Producer};

/// The host's end of a channel: it consumes requests and produces responses.
#[derive(Debug)]
pub struct HostChannel {
    pub(super) region: Region,
    pub(super) index: u32,
    /// Requests from the guest.
    pub req: Consumer,
    /// Responses to the guest.
    pub resp: Producer,
}

/// Where the host's end of a channel stands in its two rings: what it
/// keeps of its own, so that another host end (another worker, on this
/// host or another) goes on from there over the same bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostPosition {
    /// Requests consumed.
    pub req_tail: u32,
    /// The request arena released up to.
    pub req_released: u64,
    /// Responses published.
    pub resp_head: u32,
    /// The response arena's head.
    pub resp_data_head: u64,
}

impl HostChannel {
    /// Where this end stands.
    pub fn position(&self) -> HostPosition {
        let (req_tail, req_released) = self.req.position();
        let (resp_head, resp_data_head) = self.resp.position();
        HostPosition {
            req_tail,
            req_released,
            resp_head,
            resp_data_head,
        }
    }

    /// Goes on from `p`, another end's [`HostChannel::position`] of this
    /// channel. Like the guest's counters, these are checked as they are
    /// used: a position that does not fit the ring fails its next use.
    pub fn resume_at(&mut self, p: HostPosition) {
        self.req.resume_at((p.req_tail, p.req_released));
        self.resp.resume_at((p.resp_head, p.resp_data_head));
    }

    /// The channel number.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The claim state the guest left.
    pub fn state(&self) -> Result<ClaimState> {
        self.region.claim_state(self.index)
    }

    /// Records that this host now serves the channel's claim (it opened GPU
    /// state for it), so that a host adopting the region after this one
    /// marks it LOST.
    pub fn mark_serving(&self) -> Result<()> {
        let epoch = self.region.host_epoch()?.max(1);
        self.region
            .ctl_word(self.index, ctl::HOST_SERVING)?
            .store(epoch, Ordering::Release);
        Ok(())
    }

    /// Whether a host served the channel's claim ([`Region::host_served`]).
    pub fn served(&self) -> Result<bool> {
        self.region.host_served(self.index)
    }

    /// Gives up a claimed channel whose GPU state this host lost (it is
    /// going away, or its GPU context is poisoned): CLAIMED -> LOST. The
    /// owner sees `Error::HostRestarted` and lets go; the rings are reset
    /// only then.
    pub fn mark_lost(&self) -> Result<bool> {
        let w = self.region.ctl_word(self.index, ctl::STATE)?;
        Ok(
            w.compare_exchange(CLAIMED, LOST, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok(),
        )
    }

    /// Resets the rings, bumps the generation and frees the channel, if
    /// its claim word still says `seen` (what the caller read when it
    /// chose to free it); true if it did. The caller has already released
    /// everything the owner held. A channel that moved on meanwhile is left
    /// as it is: one freed by another host end and claimed again by a new
    /// guest keeps that guest's claim.
    pub fn reclaim(&mut self, seen: ClaimState) -> Result<bool> {
        let r = &self.region;
        let state = r.ctl_word(self.index, ctl::STATE)?;
        if matches!(seen, ClaimState::Free | ClaimState::Claiming) {
            return Ok(false); // a guest's to take, or taking
        }
        // Keep guests from claiming it while the rings are reset.
        if state
            .compare_exchange(seen.word(), ABANDONED, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return Ok(false);
        }
        self.req.reset()?;
        self.resp.reset()?;
        for off in [
            ctl::OWNER_PEER,
            ctl::OWNER_PID,
            ctl::GUEST_VECTOR,
            ctl::HOST_SERVING,
        ] {
            r.ctl_word(self.index, off)?.store(0, Ordering::Relaxed);
        }
        let g = r.ctl_word(self.index, ctl::GENERATION)?;
        g.store(g.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
        state.store(FREE, Ordering::Release);
        Ok(true)
    }
}
