//! The macro that turns the request table (`table.rs`) into the
//! `Request` enum, its opcodes, its encoder and checked decoder, and its
//! flags. `table.rs`'s documentation explains a row.

/// Whether a row's flag list holds a flag.
macro_rules! has_flag {
    ($want:ident:) => {
        false
    };
    (reply: reply $($rest:ident)*) => {
        true
    };
    (unnumbered: unnumbered $($rest:ident)*) => {
        true
    };
    (device: device $($rest:ident)*) => {
        true
    };
    (drains: drains $($rest:ident)*) => {
        true
    };
    ($want:ident: $other:ident $($rest:ident)*) => {
        has_flag!($want: $($rest)*)
    };
}

/// The request table: see `table.rs`.
macro_rules! requests {
    (
        $(#[$enum_meta:meta])*
        pub enum Request {
            $(
                $(#[$meta:meta])*
                $variant:ident ($code:ident = $value:literal) in $family:ident [$($flag:ident)*]
                $(data($data:ident))?
                $({
                    $(
                        $(#[$field_meta:meta])*
                        $field:ident: $ty:ty $(= $check:ident $(($($arg:expr),*))?)?
                    ),* $(,)?
                })?;
            )*
        }
    ) => {
        $(#[$enum_meta])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Request {
            $(
                $(#[$meta])*
                $variant $({ $($(#[$field_meta])* $field: $ty),* })?,
            )*
        }

        /// The opcodes, one per row of the table.
        pub mod codes {
            $(
                #[doc = concat!("[`Request::", stringify!($variant), "`](crate::Request::", stringify!($variant), ")")]
                pub const $code: u32 = $value;
            )*
        }

        /// Whether a request with this opcode puts work on the device (the
        /// table's `device` flag).
        pub(crate) fn needs_device(opcode: u32) -> bool {
            match opcode {
                $(codes::$code => has_flag!(device: $($flag)*),)*
                _ => false,
            }
        }

        /// Whether a request with this opcode returns only when the device
        /// work before it is done (the table's `drains` flag).
        pub(crate) fn drains_device(opcode: u32) -> bool {
            match opcode {
                $(codes::$code => has_flag!(drains: $($flag)*),)*
                _ => false,
            }
        }

        impl Request {
            /// The opcode of this request.
            pub fn opcode(&self) -> u32 {
                match self {
                    $(Request::$variant { .. } => codes::$code,)*
                }
            }

            /// The API family the request belongs to (the table's `in`):
            /// the worker hands it to that family's handler.
            pub fn family(&self) -> Family {
                match self {
                    $(Request::$variant { .. } => Family::$family,)*
                }
            }

            /// Whether the guest waits for a reply. Asynchronous calls
            /// (launches, host-to-device copies, memsets, event records,
            /// frees) are fire-and-forget; their errors surface at the next
            /// synchronizing call.
            pub fn expects_reply(&self) -> bool {
                match self {
                    $(Request::$variant { .. } => has_flag!(reply: $($flag)*),)*
                }
            }

            /// Whether the request is outside the process's numbering (its
            /// tag is 0): a channel's first `Join`, and the callback
            /// thread's requests.
            pub fn unnumbered(&self) -> bool {
                match self {
                    $(Request::$variant { .. } => has_flag!(unnumbered: $($flag)*),)*
                }
            }

            /// Bytes of data that follow this request (in its own and
            /// continuation descriptors).
            pub fn data_len(&self) -> Option<u64> {
                match self {
                    $($(Request::$variant { $data, .. } => Some(u64::from(*$data)),)?)*
                    _ => None,
                }
            }

            /// Encodes into an inline payload.
            pub fn encode(&self, out: &mut [u8; $crate::INLINE]) {
                let mut w = $crate::Writer::new(out);
                match self {
                    $(
                        Request::$variant $({ $($field),* })? => {
                            $($(<$ty as Wire>::write($field, &mut w);)*)?
                        }
                    )*
                }
            }

            /// Decodes and validates a request. Total on every input: an
            /// error, never a panic.
            pub fn decode(
                opcode: u32,
                inline: &[u8; $crate::INLINE],
            ) -> Result<Request, $crate::ProtoError> {
                let mut r = $crate::Reader::new(inline);
                Ok(match opcode {
                    $(
                        codes::$code => {
                            $($(
                                let $field = {
                                    let raw = <$ty as Wire>::read_raw(&mut r)?;
                                    $($check(stringify!($field), &raw $($(, $arg)*)?)?;)?
                                    <$ty as Wire>::from_raw(stringify!($field), raw)?
                                };
                            )*)?
                            Request::$variant $({ $($field),* })?
                        }
                    )*
                    other => return Err($crate::ProtoError::UnknownOpcode(other)),
                })
            }
        }

        /// One request of every row, with its variant's name and its
        /// fields' names, the fields taken from their types' samples
        /// (`sample.rs`) as the row's checks allow (tests only); `None`: no
        /// sample passes a check.
        #[cfg(test)]
        // Each row's closure, called at once, lets `?` end that row alone.
        #[allow(clippy::redundant_closure_call)]
        pub(crate) fn generated_samples() -> Vec<$crate::request::sample::Generated> {
            use super::sample::pick;
            let of = |n: &mut u64| {
                *n += 1;
                *n
            };
            vec![
                $(
                    (stringify!($variant), &[$($(stringify!($field)),*)?], (|| {
                        #[allow(unused_mut, unused_variables)]
                        let mut n = 0u64;
                        $($(
                            let $field = pick::<$ty>(of(&mut n), stringify!($field), |raw| {
                                let _ = raw;
                                true $(&& $check(stringify!($field), raw $($(, $arg)*)?).is_ok())?
                            })?;
                        )*)?
                        Some(Request::$variant $({ $($field),* })?)
                    })()),
                )*
            ]
        }
    };
}
