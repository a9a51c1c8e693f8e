//! The region as a whole and its channels: header, claim protocol, and the
//! guest's and host's end of each channel.
//!
//! Claim protocol (all words in the channel control block):
//! ```text
//!   FREE --guest CAS--> CLAIMING --guest writes owner--> CLAIMED
//!   CLAIMED --guest exits cleanly--> CLOSING
//!   CLAIMED --kernel module / host sees the owner gone--> ABANDONED
//!   CLAIMED --a new host (worker restarted) adopts the region--> LOST
//!   LOST --guest lets go--> CLOSING;  LOST --owner gone--> ABANDONED
//!   CLOSING | ABANDONED | any unknown value --host frees, resets rings, bumps generation--> FREE
//! ```
//! Only the guest moves a channel out of FREE, only the host moves it back.
//! A LOST channel stays reserved to its owner (whose GPU state died with the
//! old host) until the owner lets go, so no other guest can be handed rings
//! that the old owner may still write.
//!
//! `region.rs`: the region as a whole (creating, adopting, mapping and
//! validating its header; each channel's rings); `claim.rs`: the claim
//! states and the words they live in, claiming a channel and the host's
//! end of one; `guest.rs` and `host.rs`: the two ends of a channel.

mod claim;
mod guest;
mod host;
mod region;
#[cfg(test)]
mod tests;

pub use claim::ClaimState;
pub use guest::GuestChannel;
pub use host::{HostChannel, HostPosition};
pub use region::Region;
