//! The claim protocol: a channel's claim state as the host reads the word
//! the guest wrote, the control words of each channel, a guest claiming a
//! free channel, and the host's end of one.

use std::sync::atomic::{AtomicU32, Ordering};

use super::{GuestChannel, HostChannel, Region};
use crate::error::{Error, Result};
use crate::layout::{ctl, Direction};

/// A channel's claim state as the host interprets the word the guest wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimState {
    /// Nobody holds it.
    Free,
    /// A guest is taking it.
    Claiming,
    /// A guest process holds it.
    Claimed,
    /// Its owner let go.
    Closing,
    /// Its owner went away without letting go.
    Abandoned,
    /// The host that served it is gone (its GPU state with it); the owner
    /// must let go and claim again.
    Lost,
    /// A value no honest guest writes; treated like `Abandoned`.
    Invalid(u32),
}

pub(super) const FREE: u32 = 0;
pub(super) const CLAIMING: u32 = 1;
pub(super) const CLAIMED: u32 = 2;
pub(super) const CLOSING: u32 = 3;
pub(super) const ABANDONED: u32 = 4;
pub(super) const LOST: u32 = 5;

impl ClaimState {
    pub(super) fn from_word(w: u32) -> ClaimState {
        match w {
            FREE => ClaimState::Free,
            CLAIMING => ClaimState::Claiming,
            CLAIMED => ClaimState::Claimed,
            CLOSING => ClaimState::Closing,
            ABANDONED => ClaimState::Abandoned,
            LOST => ClaimState::Lost,
            v => ClaimState::Invalid(v),
        }
    }

    /// Whether the host should tear the channel down and free it.
    pub fn needs_reclaim(self) -> bool {
        matches!(
            self,
            ClaimState::Closing | ClaimState::Abandoned | ClaimState::Invalid(_)
        )
    }

    /// The word that reads as this state.
    pub(super) fn word(self) -> u32 {
        match self {
            ClaimState::Free => FREE,
            ClaimState::Claiming => CLAIMING,
            ClaimState::Claimed => CLAIMED,
            ClaimState::Closing => CLOSING,
            ClaimState::Abandoned => ABANDONED,
            ClaimState::Lost => LOST,
            ClaimState::Invalid(v) => v,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            ClaimState::Free => "free",
            ClaimState::Claiming => "being claimed",
            ClaimState::Claimed => "claimed",
            ClaimState::Closing => "closing",
            ClaimState::Abandoned => "abandoned",
            ClaimState::Lost => "lost (its host restarted)",
            ClaimState::Invalid(_) => "invalid",
        }
    }
}

impl Region {
    pub(super) fn ctl_word(&self, ch: u32, off: usize) -> Result<&AtomicU32> {
        if ch >= self.channels() {
            return Err(Error::NoSuchChannel(ch));
        }
        self.mem.atomic_u32(self.layout.channel_offset(ch) + off)
    }

    /// The claim state of channel `ch`.
    pub fn claim_state(&self, ch: u32) -> Result<ClaimState> {
        Ok(ClaimState::from_word(
            self.ctl_word(ch, ctl::STATE)?.load(Ordering::Acquire),
        ))
    }

    /// The owner peer id a guest wrote (unverified: informational and for
    /// reclaiming a disconnected native peer's channels).
    pub fn owner_peer(&self, ch: u32) -> Result<u32> {
        Ok(self.ctl_word(ch, ctl::OWNER_PEER)?.load(Ordering::Relaxed))
    }

    /// The process id a guest wrote when it claimed channel `ch`
    /// (unverified: its own numbering, for showing back to the same guest).
    pub fn owner_pid(&self, ch: u32) -> Result<u32> {
        Ok(self.ctl_word(ch, ctl::OWNER_PID)?.load(Ordering::Relaxed))
    }

    /// Whether a host served channel `ch`'s claim (see
    /// [`HostChannel::mark_serving`]): a claim none served lost nothing
    /// when its host goes, and the next host serves it from the start.
    pub fn host_served(&self, ch: u32) -> Result<bool> {
        Ok(self
            .ctl_word(ch, ctl::HOST_SERVING)?
            .load(Ordering::Acquire)
            != 0)
    }

    /// The doorbell vector the guest of channel `ch` waits on, reduced into range.
    pub fn guest_vector(&self, ch: u32) -> Result<u32> {
        Ok(self
            .ctl_word(ch, ctl::GUEST_VECTOR)?
            .load(Ordering::Relaxed)
            % self.layout.params.vectors)
    }

    /// The generation of channel `ch`.
    pub fn generation(&self, ch: u32) -> Result<u32> {
        Ok(self.ctl_word(ch, ctl::GENERATION)?.load(Ordering::Acquire))
    }

    /// Records the doorbell vector the owner of channel `ch` waits on (the
    /// guest writes it before it blocks; the host reads it when it rings).
    pub fn set_guest_vector(&self, ch: u32, vector: u32) -> Result<()> {
        self.ctl_word(ch, ctl::GUEST_VECTOR)?
            .store(vector, Ordering::Relaxed);
        Ok(())
    }

    /// Marks a channel abandoned (what the kernel module does when a guest
    /// process dies; the host does it for a native peer that disconnected).
    pub fn mark_abandoned(&self, ch: u32) -> Result<()> {
        let w = self.ctl_word(ch, ctl::STATE)?;
        let _ = w.compare_exchange(CLAIMED, ABANDONED, Ordering::AcqRel, Ordering::Relaxed);
        let _ = w.compare_exchange(CLAIMING, ABANDONED, Ordering::AcqRel, Ordering::Relaxed);
        let _ = w.compare_exchange(LOST, ABANDONED, Ordering::AcqRel, Ordering::Relaxed);
        Ok(())
    }

    /// Guest: claims the first free channel for `peer` (its ivshmem peer id),
    /// process `pid`, waiting on doorbell vector `vector`.
    pub fn claim(&self, peer: u32, pid: u32, vector: u32) -> Result<GuestChannel> {
        self.claim_among(0..self.channels(), peer, pid, vector)
    }

    /// Guest: claims a guest process's first channel. Where the channels
    /// are split into process slots (`LayoutParams::partitions`), the
    /// first channel of a slot whose channels are all free: the process
    /// holds it for its life, and its other threads' channels come from
    /// the same slot ([`Region::claim_in_slot`]), served by the slot's own
    /// worker. Else any free channel.
    pub fn claim_process(&self, peer: u32, pid: u32, vector: u32) -> Result<GuestChannel> {
        let l = self.layout;
        if l.params.partitions <= 1 {
            return self.claim(peer, pid, vector);
        }
        for k in 0..l.params.partitions {
            let run = l.partition_channels(k);
            let all_free = run
                .clone()
                .all(|ch| self.claim_state(ch).is_ok_and(|s| s == ClaimState::Free));
            if !all_free {
                continue;
            }
            if let Ok(c) = self.claim_among(run.start..run.start + 1, peer, pid, vector) {
                return Ok(c);
            }
        }
        Err(Error::NoFreeChannel)
    }

    /// Guest: claims a further channel for a thread of the process whose
    /// first channel is `first`: in that channel's process slot, not the
    /// slot's first (where the channels are split), else any.
    pub fn claim_in_slot(
        &self,
        first: u32,
        peer: u32,
        pid: u32,
        vector: u32,
    ) -> Result<GuestChannel> {
        let l = self.layout;
        if l.params.partitions <= 1 {
            return self.claim(peer, pid, vector);
        }
        let run = l.partition_channels(l.partition_of(first));
        self.claim_among(run.start + 1..run.end, peer, pid, vector)
    }

    /// Guest: claims a monitor's channel (one that opens no session): not
    /// a process slot's first (where the channels are split), else any.
    pub fn claim_monitor(&self, peer: u32, pid: u32, vector: u32) -> Result<GuestChannel> {
        let l = self.layout;
        if l.params.partitions <= 1 {
            return self.claim(peer, pid, vector);
        }
        let n = l.slot_channels();
        for ch in (0..self.channels()).filter(|ch| ch % n != 0) {
            if let Ok(c) = self.claim_among(ch..ch + 1, peer, pid, vector) {
                return Ok(c);
            }
        }
        Err(Error::NoFreeChannel)
    }

    /// Claims the first free channel of `chans`.
    fn claim_among(
        &self,
        chans: std::ops::Range<u32>,
        peer: u32,
        pid: u32,
        vector: u32,
    ) -> Result<GuestChannel> {
        for ch in chans {
            let state = self.ctl_word(ch, ctl::STATE)?;
            if state
                .compare_exchange(FREE, CLAIMING, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.ctl_word(ch, ctl::OWNER_PEER)?
                    .store(peer, Ordering::Relaxed);
                self.ctl_word(ch, ctl::OWNER_PID)?
                    .store(pid, Ordering::Relaxed);
                self.ctl_word(ch, ctl::GUEST_VECTOR)?
                    .store(vector, Ordering::Relaxed);
                let generation = self.generation(ch)?;
                state.store(CLAIMED, Ordering::Release);
                let (req, _) = self.ring_ends(ch, Direction::ToHost);
                let (_, resp) = self.ring_ends(ch, Direction::ToGuest);
                return Ok(GuestChannel {
                    region: self.clone(),
                    index: ch,
                    generation,
                    claimed_in: std::process::id(),
                    req,
                    resp,
                });
            }
        }
        Err(Error::NoFreeChannel)
    }

    /// Host: the host's end of channel `ch`. The host keeps one per channel for
    /// the region's life and calls [`HostChannel::reclaim`] between owners.
    pub fn host_channel(&self, ch: u32) -> Result<HostChannel> {
        if ch >= self.channels() {
            return Err(Error::NoSuchChannel(ch));
        }
        let (_, req) = self.ring_ends(ch, Direction::ToHost);
        let (resp, _) = self.ring_ends(ch, Direction::ToGuest);
        Ok(HostChannel {
            region: self.clone(),
            index: ch,
            req,
            resp,
        })
    }
}
