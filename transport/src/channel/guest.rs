//! The guest's end of a claimed channel: its rings, the generation of its
//! claim, letting go (only in the process that claimed it), and noticing
//! that the host reclaimed it or went away.

use std::sync::atomic::Ordering;

use super::claim::{CLAIMED, CLOSING, LOST};
use super::{ClaimState, Region};
use crate::error::{Error, Result};
use crate::layout::ctl;
use crate::ring::{Consumer, Producer};

/// The guest's end of a claimed channel: it produces requests and consumes responses.
#[derive(Debug)]
pub struct GuestChannel {
    pub(super) region: Region,
    pub(super) index: u32,
    pub(super) generation: u32,
    /// The process that claimed it: a forked child inherits this end but
    /// not the claim.
    pub(super) claimed_in: u32,
    /// Requests to the host.
    pub req: Producer,
    /// Responses from the host.
    pub resp: Consumer,
}

impl GuestChannel {
    /// The channel number.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The region this channel lives in.
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Records the doorbell vector this guest waits on.
    pub fn set_guest_vector(&self, vector: u32) -> Result<()> {
        self.region.set_guest_vector(self.index, vector)
    }

    /// Records `peer` as the channel's owner: the ivshmem peer whose
    /// doorbells the host rings for it, after a guest on the host itself
    /// followed its vGPU to another host (where it has another peer id).
    /// Only for our own claim.
    pub fn set_owner_peer(&self, peer: u32) -> Result<()> {
        if !self.claimed_here() {
            return Err(Error::ChannelState {
                channel: self.index,
                state: "claimed by another process",
            });
        }
        self.region
            .ctl_word(self.index, ctl::OWNER_PEER)?
            .store(peer, Ordering::Relaxed);
        Ok(())
    }

    /// The generation of the claim (the host bumps it on every reclaim).
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// Whether this process claimed the channel (false in a forked child
    /// that inherited this end).
    pub fn claimed_here(&self) -> bool {
        std::process::id() == self.claimed_in
    }

    /// Lets go of the channel now (CLAIMED or LOST -> CLOSING, only for our
    /// own claim); dropping does the same. In a forked child, which did not
    /// claim the channel (its parent did, and still uses it), this does
    /// nothing: a child that exits normally drops what it inherited.
    pub fn release(&self) {
        if !self.claimed_here() {
            return;
        }
        if let Ok(w) = self.region.ctl_word(self.index, ctl::STATE) {
            if self.region.generation(self.index).ok() == Some(self.generation) {
                for from in [CLAIMED, LOST] {
                    if w.compare_exchange(from, CLOSING, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                    {
                        break;
                    }
                }
            }
        }
    }

    /// Fails if the host reclaimed the channel under us, or if the host that
    /// served it went away ([`Error::HostRestarted`]: claim a new channel).
    pub fn check_alive(&self) -> Result<()> {
        let state = self.region.claim_state(self.index)?;
        let generation = self.region.generation(self.index)?;
        if state == ClaimState::Lost && generation == self.generation {
            return Err(Error::HostRestarted {
                channel: self.index,
            });
        }
        if state != ClaimState::Claimed || generation != self.generation {
            return Err(Error::ChannelState {
                channel: self.index,
                state: state.name(),
            });
        }
        Ok(())
    }

    /// Lets go of the channel; the host frees everything it held.
    pub fn close(self) {
        drop(self)
    }
}

impl Drop for GuestChannel {
    fn drop(&mut self) {
        self.release();
    }
}
