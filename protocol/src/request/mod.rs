//! The requests: one variant per CUDA call, each described once, as a row
//! of `table.rs` (its opcode, fields in wire order, the checks decoding
//! runs, its flags). `macros.rs` makes the enum, the encoder and the
//! decoder from the table; `wire.rs` says how each field type is written
//! and read, `checks.rs` holds the checks rows name. `sample.rs` gives the
//! values of the request of every row the table generates for the tests
//! (`samples.rs` holds the hand-written ones the golden encodings pin).

#[macro_use]
mod macros;
mod checks;
pub(crate) mod table;
pub(crate) mod wire;

pub use table::{Family, Request};

#[cfg(test)]
mod golden;
#[cfg(test)]
mod sample;
#[cfg(test)]
mod samples;
#[cfg(test)]
mod tests;
