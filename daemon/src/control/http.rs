//! Just enough HTTP/1.1 for the control API: one request per connection,
//! bounded head and body, `Connection: close`. Anything malformed gets 400.

use std::io::{BufRead, BufReader, Read, Write};

/// Largest request head accepted.
const MAX_HEAD: usize = 16 * 1024;
/// Largest body accepted.
const MAX_BODY: usize = 64 * 1024;

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// GET, POST, ...
    pub method: String,
    /// The path, without the query string.
    pub path: String,
    /// The bearer token, if the request carried one.
    pub bearer: Option<String>,
    /// The body.
    pub body: Vec<u8>,
}

/// A response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Content type.
    pub content_type: &'static str,
    /// Body.
    pub body: Vec<u8>,
}

impl Response {
    /// A JSON response.
    pub fn json(status: u16, v: &serde_json::Value) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: v.to_string().into_bytes(),
        }
    }

    /// An error as `{"error": msg}`.
    pub fn error(status: u16, msg: impl Into<String>) -> Response {
        Response::json(status, &serde_json::json!({ "error": msg.into() }))
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        _ => "Error",
    }
}

/// Reads one request; `Err` carries the response to send instead.
pub fn read_request(stream: impl Read) -> Result<Request, Response> {
    let mut r = BufReader::new(stream.take((MAX_HEAD + MAX_BODY) as u64));
    let mut head_len = 0;
    let mut line = String::new();
    let mut next_line = |r: &mut BufReader<_>, line: &mut String| -> Result<(), Response> {
        line.clear();
        let n = r
            .read_line(line)
            .map_err(|_| Response::error(400, "unreadable request"))?;
        head_len += n;
        if n == 0 || head_len > MAX_HEAD {
            return Err(Response::error(400, "request head missing or too long"));
        }
        Ok(())
    };
    next_line(&mut r, &mut line)?;
    let mut parts = line.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(Response::error(400, "bad request line"));
    };
    let method = method.to_owned();
    let path = target.split('?').next().unwrap_or("/").to_owned();
    let mut length = 0usize;
    let mut bearer = None;
    loop {
        next_line(&mut r, &mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let Some((k, v)) = l.split_once(':') else {
            return Err(Response::error(400, "bad header line"));
        };
        let v = v.trim();
        match k.trim().to_ascii_lowercase().as_str() {
            "content-length" => {
                length = v
                    .parse()
                    .map_err(|_| Response::error(400, "bad content-length"))?;
                if length > MAX_BODY {
                    return Err(Response::error(413, "body too large"));
                }
            }
            "authorization" => {
                bearer = v.strip_prefix("Bearer ").map(|t| t.trim().to_owned());
            }
            _ => {}
        }
    }
    let mut body = vec![0u8; length];
    r.read_exact(&mut body)
        .map_err(|_| Response::error(400, "body shorter than content-length"))?;
    Ok(Request {
        method,
        path,
        bearer,
        body,
    })
}

/// Writes a response and closes the exchange.
pub fn write_response(mut stream: impl Write, resp: &Response) -> std::io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        resp.status,
        reason(resp.status),
        resp.content_type,
        resp.body.len()
    )?;
    stream.write_all(&resp.body)?;
    stream.flush()
}

/// Client side (the CLI): sends one request, returns (status, body).
pub fn call(
    mut stream: impl Read + Write,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> std::io::Result<(u16, Vec<u8>)> {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: fairvgpu\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    stream.flush()?;
    let mut all = Vec::new();
    stream.read_to_end(&mut all)?;
    let split = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no response head"))?;
    let head = String::from_utf8_lossy(&all[..split]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad status line"))?;
    Ok((status, all[split + 4..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_request_with_token_and_body() {
        let raw = b"POST /api/v1/vgpus/vm1/weight?x=1 HTTP/1.1\r\nAuthorization: Bearer abc\r\nContent-Length: 4\r\n\r\n{}ab";
        let r = read_request(&raw[..]).unwrap();
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/api/v1/vgpus/vm1/weight");
        assert_eq!(r.bearer.as_deref(), Some("abc"));
        assert_eq!(r.body, b"{}ab");
    }

    #[test]
    fn refuses_malformed_and_oversized_requests() {
        for raw in [
            &b""[..],
            b"GET\r\n\r\n",
            b"GET / HTTP/1.1\r\nnocolon\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc",
            b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
        ] {
            assert_eq!(read_request(raw).unwrap_err().status, 400, "{raw:?}");
        }
        let big = format!(
            "POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        assert_eq!(read_request(big.as_bytes()).unwrap_err().status, 413);
        let long = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(read_request(long.as_bytes()).unwrap_err().status, 400);
    }
}
