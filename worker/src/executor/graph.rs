//! The `Graphs` family of [`super::Context`]: the guest's CUDA graphs, built and instantiated here.

use protocol::Status;

use super::Handle;

/// The guest's CUDA graphs, built and instantiated here.
pub trait Graphs {
    /// Builds and instantiates a graph of `nodes` (the worker checked every
    /// handle and range in them against the session); returns its handle.
    /// By default the graph is kept as its nodes, and a launch runs them
    /// one after another in the stream ([`Self::graph_launch`]): a
    /// valid order of any graph, whose nodes come after their dependencies.
    fn graph_instantiate(
        &mut self,
        nodes: &[protocol::graph::GraphNode],
    ) -> Result<Handle, Status> {
        let _ = nodes;
        Err(Status::NotSupported)
    }
    /// Launches an executable graph into `stream`.
    fn graph_launch(&mut self, exec: Handle, stream: Handle) -> Result<(), Status> {
        let _ = (exec, stream);
        Err(Status::NotSupported)
    }
    /// Destroys an executable graph.
    fn graph_destroy(&mut self, exec: Handle) -> Result<(), Status> {
        let _ = exec;
        Err(Status::NotSupported)
    }
}
