//! A launch that goes alone (thread block clusters, a cooperative grid)
//! runs after the plain launches the guest sent before it on its stream,
//! which the worker queues and submits in runs: the stream's order is the
//! guest's. (A graph run node by node from the process sends its cluster
//! launches among plain ones, back to back.)

use protocol::{Dim3, ImageKind};
use tests::Host;

#[test]
fn a_cluster_or_cooperative_launch_waits_for_the_launches_queued_before_it() {
    let host = Host::start("launch-order", 16 << 20);
    let mut g = host.guest();
    let m = g
        .module_load(ImageKind::Ptx, tests::PTX.as_bytes())
        .unwrap();
    let saxpy = g.get_function(m, "saxpy").unwrap();
    let n: u32 = 1024;
    let bytes = u64::from(n) * 4;
    let (x, y) = (g.mem_alloc(bytes).unwrap(), g.mem_alloc(bytes).unwrap());
    let d = |x| Dim3 { x, y: 1, z: 1 };
    let one = 1f32.to_le_bytes();
    let floats = |v: f32| -> Vec<u8> { (0..n).flat_map(|_| v.to_le_bytes()).collect() };
    for (round, flags) in (0..20).zip([0, protocol::launch_flags::COOPERATIVE].into_iter().cycle())
    {
        g.memcpy_htod(x, &floats(0.0)).unwrap();
        g.memcpy_htod(y, &floats(1.0)).unwrap();
        // y += x, eight times (x is 0: y stays 1), queued behind each other.
        for _ in 0..8 {
            g.launch(
                &saxpy,
                d(n / 256),
                d(256),
                0,
                0,
                &[&one, &x.to_le_bytes(), &y.to_le_bytes(), &n.to_le_bytes()],
            )
            .unwrap();
        }
        // y = 2 (y += y, plain), then x += y alone (clusters of 2, or a
        // cooperative grid): x = 2 only if it ran after the plain ones.
        g.launch(
            &saxpy,
            d(n / 256),
            d(256),
            0,
            0,
            &[&one, &y.to_le_bytes(), &y.to_le_bytes(), &n.to_le_bytes()],
        )
        .unwrap();
        let mut packed = Vec::new();
        for p in [
            &one[..],
            &y.to_le_bytes(),
            &x.to_le_bytes(),
            &n.to_le_bytes(),
        ] {
            packed.extend_from_slice(p);
        }
        let cluster = if flags == 0 { d(2) } else { Dim3::default() };
        g.launch_ex(
            saxpy.handle,
            d(n / 256),
            d(256),
            0,
            0,
            cluster,
            flags,
            &packed,
        )
        .unwrap();
        let mut back = vec![0u8; bytes as usize];
        g.memcpy_dtoh(&mut back, x, 0).unwrap();
        let got: Vec<f32> = back
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(
            got.iter().all(|&v| v == 2.0),
            "round {round} (flags {flags}): x[0] = {}, not 2: the alone launch overtook the queued ones",
            got[0]
        );
    }
}
