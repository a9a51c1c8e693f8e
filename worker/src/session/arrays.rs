//! A session's CUDA arrays and the texture and surface objects it made:
//! only these may be named in its array requests, and every copy's box
//! must lie inside the array it names.

use std::collections::HashSet;

use protocol::array::{ArrayCopy, ArrayDesc, CopySide};
use protocol::Status;

use crate::executor::{Handle, HandleMap};

/// Most arrays, and most texture and surface objects, one session holds:
/// each costs the host a table entry whatever its size.
pub const MAX_OBJECTS: usize = 1 << 16;

/// What a session holds of the array family.
#[derive(Debug, Default)]
pub struct Arrays {
    /// handle -> (description, device memory counted for it).
    arrays: HandleMap<(ArrayDesc, u64)>,
    textures: HashSet<u64>,
    surfaces: HashSet<u64>,
}

impl Arrays {
    /// Whether it may make another array or object.
    pub fn full(&self) -> bool {
        self.arrays.len() + self.textures.len() + self.surfaces.len() >= MAX_OBJECTS
    }

    /// Records a new array that counts `charge` bytes.
    pub fn add(&mut self, h: Handle, desc: ArrayDesc, charge: u64) {
        self.arrays.insert(h, (desc, charge));
    }

    /// One of its arrays.
    pub fn get(&self, h: Handle) -> Result<&ArrayDesc, Status> {
        self.arrays
            .get(&h)
            .map(|a| &a.0)
            .ok_or(Status::InvalidHandle)
    }

    /// Takes an array out; returns what it counted.
    pub fn remove(&mut self, h: Handle) -> Result<u64, Status> {
        self.arrays
            .remove(&h)
            .map(|a| a.1)
            .ok_or(Status::InvalidHandle)
    }

    /// Checks a copy's array ends: its own arrays, the box inside each.
    pub fn check_copy(&self, c: &ArrayCopy) -> Result<(), Status> {
        for s in [c.src, c.dst] {
            if let CopySide::Array { array, .. } = s {
                if !c.inside(&s, self.get(array)?) {
                    return Err(Status::InvalidValue);
                }
            }
        }
        Ok(())
    }

    /// Records a texture object's value.
    pub fn add_texture(&mut self, v: u64) {
        self.textures.insert(v);
    }

    /// Takes a texture object out (an error if it is not its own).
    pub fn remove_texture(&mut self, v: u64) -> Result<(), Status> {
        self.textures
            .remove(&v)
            .then_some(())
            .ok_or(Status::InvalidHandle)
    }

    /// Records a surface object's value.
    pub fn add_surface(&mut self, v: u64) {
        self.surfaces.insert(v);
    }

    /// Takes a surface object out (an error if it is not its own).
    pub fn remove_surface(&mut self, v: u64) -> Result<(), Status> {
        self.surfaces
            .remove(&v)
            .then_some(())
            .ok_or(Status::InvalidHandle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_stay_inside_its_own_arrays() {
        let mut a = Arrays::default();
        let d = ArrayDesc {
            width: 16,
            height: 4,
            depth: 0,
            format: 0x01,
            channels: 1,
            flags: 0,
        };
        a.add(7, d, 64);
        let copy = |array, x, width| ArrayCopy {
            src: CopySide::Device {
                ptr: 0x1000,
                pitch: 16,
                height: 4,
            },
            dst: CopySide::Array {
                array,
                x,
                y: 0,
                z: 0,
            },
            width,
            height: 4,
            depth: 1,
        };
        assert!(a.check_copy(&copy(7, 0, 16)).is_ok());
        assert!(a.check_copy(&copy(7, 1, 16)).is_err());
        assert!(a.check_copy(&copy(8, 0, 16)).is_err());
        assert_eq!(a.remove(7), Ok(64));
        assert!(a.check_copy(&copy(7, 0, 16)).is_err());
        assert!(a.remove_texture(1).is_err());
    }
}
