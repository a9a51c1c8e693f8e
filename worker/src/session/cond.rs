//! The conditional scopes a session made (`CondScopeCreate`) and the
//! conditional handles made in each: a graph instantiated in a scope may
//! name only that scope's handles in its conditional nodes, and only the
//! session that made a scope may use or destroy it.

use std::collections::HashSet;

use protocol::graph::{visit, GraphNode, GraphOp};
use protocol::Status;

use crate::executor::{Handle, HandleMap};

/// Scopes allowed to one session at a time (a guest makes one per graph
/// that holds conditional handles).
pub const MAX_SCOPES: usize = 4096;
/// Conditional handles in one scope, at most.
pub const MAX_HANDLES: usize = 1024;

/// A session's scopes, each with the handle values made in it.
#[derive(Debug, Default)]
pub struct CondScopes {
    scopes: HandleMap<HashSet<u64>>,
}

impl CondScopes {
    /// Whether another scope may be made.
    pub fn room(&self) -> Result<(), Status> {
        if self.scopes.len() < MAX_SCOPES {
            Ok(())
        } else {
            Err(Status::OutOfMemory)
        }
    }

    /// Records a new scope.
    pub fn add_scope(&mut self, scope: Handle) {
        self.scopes.insert(scope, HashSet::new());
    }

    /// Checks a scope is the session's, with room for another handle.
    pub fn check_scope(&self, scope: Handle) -> Result<(), Status> {
        self.scopes
            .get(&scope)
            .ok_or(Status::InvalidHandle)
            .map(drop)
    }

    /// Checks another handle may be made in `scope`.
    pub fn handle_room(&self, scope: Handle) -> Result<(), Status> {
        let h = self.scopes.get(&scope).ok_or(Status::InvalidHandle)?;
        if h.len() < MAX_HANDLES {
            Ok(())
        } else {
            Err(Status::OutOfMemory)
        }
    }

    /// Records a handle made in `scope`.
    pub fn add_handle(&mut self, scope: Handle, handle: u64) {
        if let Some(h) = self.scopes.get_mut(&scope) {
            h.insert(handle);
        }
    }

    /// Forgets a scope (and its handles).
    pub fn remove_scope(&mut self, scope: Handle) {
        self.scopes.remove(&scope);
    }

    /// Checks the conditional nodes of `nodes` (at any depth): each names a
    /// handle of `scope` (none may appear outside a scope).
    pub fn check_nodes(&self, scope: Option<Handle>, nodes: &[GraphNode]) -> Result<(), Status> {
        let handles = match scope {
            Some(s) => Some(self.scopes.get(&s).ok_or(Status::InvalidHandle)?),
            None => None,
        };
        visit(nodes, &mut |n| match (&n.op, handles) {
            (GraphOp::Conditional { handle, .. }, Some(h)) if h.contains(handle) => Ok(()),
            (GraphOp::Conditional { .. }, _) => Err(Status::InvalidValue),
            _ => Ok(()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::graph::CondKind;

    fn cond(handle: u64, bodies: Vec<Vec<GraphNode>>) -> GraphNode {
        GraphNode {
            op: GraphOp::Conditional {
                handle,
                kind: CondKind::Switch,
                bodies,
            },
            deps: vec![],
        }
    }

    #[test]
    fn only_the_scopes_own_handles_pass_at_any_depth() {
        let mut c = CondScopes::default();
        c.add_scope(7);
        c.add_scope(8);
        c.add_handle(7, 100);
        c.add_handle(8, 200);
        let nested = vec![cond(100, vec![vec![cond(100, vec![vec![]])]])];
        assert_eq!(c.check_nodes(Some(7), &nested), Ok(()));
        // The other scope's handle, deep inside.
        let foreign = vec![cond(100, vec![vec![], vec![cond(200, vec![vec![]])]])];
        assert_eq!(c.check_nodes(Some(7), &foreign), Err(Status::InvalidValue));
        // No scope, or one not the session's.
        assert_eq!(c.check_nodes(None, &nested), Err(Status::InvalidValue));
        assert_eq!(c.check_nodes(Some(9), &nested), Err(Status::InvalidHandle));
        c.remove_scope(7);
        assert_eq!(c.check_nodes(Some(7), &nested), Err(Status::InvalidHandle));
        assert_eq!(c.check_scope(8), Ok(()));
        assert_eq!(c.check_scope(7), Err(Status::InvalidHandle));
    }
}
