//! What the hostile-guest tests (`hostile_*.rs`) share: forging requests
//! and checking that refusing them broke nothing.

use std::sync::atomic::Ordering;

use guest::{Gpu, GuestError};
use protocol::Request;

use crate::Host;

/// Sends `r` as any process of the VM can, forged or not, and gives the
/// reply's values or the refusal.
pub fn vals(g: &mut Gpu, r: Request) -> Result<[u64; 4], GuestError> {
    g.request(&r).map(|x| x.vals)
}

/// Asserts that every refusal was an answer: no channel of `host` broke.
pub fn assert_no_broken_channel(host: &Host) {
    assert_eq!(
        host.stats().broken_channels.load(Ordering::Relaxed),
        0,
        "a channel broke"
    );
}
