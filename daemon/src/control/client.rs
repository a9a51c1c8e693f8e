//! The CLI's client of the control API.

use std::path::PathBuf;

use super::http;
use crate::Error;

/// The CLI's client: one call to the API of the daemon configured in
/// `config` (its unix socket), or at `api` ("unix:PATH" or "http://HOST:PORT").
pub fn client_call(
    target: &ApiTarget,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<(u16, Vec<u8>), Error> {
    let io = |source| Error::Io {
        what: "calling the control API",
        source,
    };
    match target {
        ApiTarget::Unix(p) => {
            let s =
                std::os::unix::net::UnixStream::connect(p).map_err(|source| Error::ApiSocket {
                    path: p.clone(),
                    source,
                })?;
            http::call(s, method, path, None, body).map_err(io)
        }
        ApiTarget::Tcp { addr, token } => {
            let s = std::net::TcpStream::connect(addr).map_err(io)?;
            http::call(s, method, path, token.as_deref(), body).map_err(io)
        }
    }
}

/// Where the CLI finds the API.
#[derive(Debug, Clone)]
pub enum ApiTarget {
    /// A unix socket.
    Unix(PathBuf),
    /// A TCP address with its token.
    Tcp {
        /// host:port
        addr: String,
        /// Bearer token.
        token: Option<String>,
    },
}
