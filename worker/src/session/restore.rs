//! A session over a context made again from its image (another worker's
//! checkpoint): its tables are what the image's objects are, and each
//! function's parameter sizes come from the module made again, never from
//! the image.

use protocol::Status;

use super::Session;
use crate::executor::{Context, ContextImage};

impl Session {
    /// A session over `ctx`, which [`crate::executor::Executor::restore`]
    /// made from `image`: every allocation, module global, module,
    /// function, stream, event and graph of the image is the session's,
    /// and its allocations count as a new allocation of their size would.
    /// A graph whose nodes the session would not have taken from its guest
    /// is refused.
    pub fn restored(ctx: Box<dyn Context>, image: &ContextImage) -> Result<Session, Status> {
        let mut s = Session::new(ctx);
        for m in &image.modules {
            s.add_module(m.handle);
            for g in &m.globals {
                s.add_global(g.addr, g.len);
            }
        }
        for a in &image.memory {
            let charge = s.ctx.footprint(a.len);
            s.add_alloc(a.addr, a.len, charge);
        }
        for f in &image.functions {
            let sizes = s.ctx.param_sizes(f.handle).ok_or(Status::InvalidHandle)?;
            s.add_function(f.handle, sizes);
        }
        for st in &image.streams {
            s.add_stream(st.handle);
        }
        for e in &image.events {
            s.add_event(e.handle);
        }
        // As a guest's graph is checked before it is built: every range in
        // the session's memory, every parameter block its kernel's size.
        for g in &image.graphs {
            s.check_graph_nodes(None, &g.decoded()?)?;
            s.add_graph(g.handle);
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::sim::{SimExecutor, SimParams};
    use crate::executor::Executor;
    use protocol::ImageKind;

    #[test]
    fn a_restored_session_checks_what_the_original_checked() {
        let mut exec = SimExecutor::new(SimParams::default());
        let mut ctx = exec.open().unwrap();
        let m = ctx
            .load_module(ImageKind::Ptx, crate::KERNELS_PTX.as_bytes())
            .unwrap();
        let (f, params) = ctx.function(m, "vector_add").unwrap();
        let st = ctx.stream_create(0, 0).unwrap();
        let buf = ctx.alloc(4096).unwrap();
        let (global, gsize) = ctx.module_global(m, "fvg_counter").unwrap();
        let image = ctx.checkpoint().unwrap();

        let mut there = SimExecutor::new(SimParams::default());
        let s = Session::restored(there.restore(&image).unwrap(), &image).unwrap();
        s.check_range(buf, 4096).unwrap();
        s.check_range(global, gsize).unwrap();
        assert_eq!(s.check_range(buf, 4097), Err(Status::InvalidValue));
        assert_eq!(
            s.function(f).unwrap(),
            params.iter().map(|p| p.size).collect::<Vec<_>>()
        );
        s.check_module(m).unwrap();
        s.check_stream(st).unwrap();
        assert_eq!(
            s.mem_used, 4096,
            "its allocation counts; the global does not"
        );
        assert_eq!(s.check_stream(st + 100), Err(Status::InvalidHandle));
    }

    #[test]
    fn a_restored_graph_is_checked_as_a_guests_graph_is() {
        use crate::executor::checkpoint::GraphImage;
        use protocol::graph::{GraphNode, GraphOp};
        let memset = |dst: u64, width: u64| {
            vec![GraphNode {
                deps: Vec::new(),
                op: GraphOp::Memset {
                    dst,
                    pitch: width,
                    value: 7,
                    elem: 1,
                    width,
                    height: 1,
                },
            }]
        };
        let mut exec = SimExecutor::new(SimParams::default());
        let mut ctx = exec.open().unwrap();
        let buf = ctx.alloc(4096).unwrap();
        let g = ctx.graph_instantiate(&memset(buf, 4096)).unwrap();
        let image = ctx.checkpoint().unwrap();
        let mut there = SimExecutor::new(SimParams::default());
        let s = Session::restored(there.restore(&image).unwrap(), &image).unwrap();
        s.check_graph(g).unwrap();

        // The same graph made to write past the buffer: the session refuses
        // it, as it would the guest's.
        let mut past = image.clone();
        past.graphs[0] = GraphImage::of(g, &memset(buf, 4097));
        let mut there = SimExecutor::new(SimParams::default());
        let ctx = there.restore(&past).unwrap();
        assert_eq!(
            Session::restored(ctx, &past).err(),
            Some(Status::InvalidValue)
        );
    }
}
