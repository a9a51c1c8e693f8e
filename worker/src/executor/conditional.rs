//! The `Conditionals` family of [`super::Context`]: conditional graph nodes: scopes, conditional
//! handles, and graphs instantiated in a scope.

use protocol::Status;

use super::Handle;

/// Conditional graph nodes: scopes, conditional handles, and graphs instantiated in a scope.
pub trait Conditionals {
    /// Makes a conditional scope (the twin of a guest graph that holds
    /// conditional handles); returns its handle.
    fn cond_scope_create(&mut self) -> Result<Handle, Status> {
        Err(Status::NotSupported)
    }
    /// Makes a conditional handle in `scope` (the worker checked the scope
    /// is the session's); returns the value kernels take.
    fn cond_handle_create(
        &mut self,
        scope: Handle,
        default_value: u32,
        flags: u32,
    ) -> Result<u64, Status> {
        let _ = (scope, default_value, flags);
        Err(Status::NotSupported)
    }
    /// Destroys a scope; executables made in it stay valid.
    fn cond_scope_destroy(&mut self, scope: Handle) -> Result<(), Status> {
        let _ = scope;
        Err(Status::NotSupported)
    }
    /// Builds and instantiates a graph of `nodes` in `scope` (the worker
    /// checked every handle in them, conditional ones against the scope);
    /// launched and destroyed as `Graphs::graph_instantiate`'s.
    fn graph_instantiate_in(
        &mut self,
        scope: Handle,
        nodes: &[protocol::graph::GraphNode],
    ) -> Result<Handle, Status> {
        let _ = (scope, nodes);
        Err(Status::NotSupported)
    }
}
