//! The control API: its routes, the bearer token, and serving it on the
//! unix socket (and TCP) with the sampler, on background threads.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::http::{self, Request, Response};
use super::{CheckpointWith, ControlPlane, Refusal, SaveOp, SAMPLE_EVERY};
use crate::config::Config;
use crate::Error;

/// How long a checkpoint, resume or restore asked through the API may
/// take before the API answers that it did not finish.
const SAVE_WAIT: Duration = Duration::from_secs(600);

const DASHBOARD: &str = include_str!("dashboard.html");
const OPENAPI: &str = include_str!("../../../docs/api.openapi.json");

pub(super) fn read_token(cfg: &Config) -> Result<Option<String>, Error> {
    cfg.api
        .token_file
        .as_deref()
        .map(token_from_file)
        .transpose()
}

/// Compares without an early exit, so timing does not reveal a prefix.
fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl ControlPlane {
    /// Serves one API request. `tcp`: it came over TCP (a token is needed).
    pub fn handle(&self, req: &Request, tcp: bool) -> Response {
        let public = req.method == "GET" && (req.path == "/" || req.path == "/api/v1/openapi.json");
        if tcp && !public {
            let ok = match (&self.token, &req.bearer) {
                (Some(t), Some(b)) => same_token(t, b),
                _ => false,
            };
            if !ok {
                return Response::error(401, "a valid bearer token is required");
            }
        }
        let parts: Vec<&str> = req.path.trim_matches('/').split('/').collect();
        match (req.method.as_str(), parts.as_slice()) {
            ("GET", [""]) => Response {
                status: 200,
                content_type: "text/html; charset=utf-8",
                body: DASHBOARD.as_bytes().to_vec(),
            },
            ("GET", ["api", "v1", "openapi.json"]) => Response {
                status: 200,
                content_type: "application/json",
                body: OPENAPI.as_bytes().to_vec(),
            },
            ("GET", ["api", "v1", "status"]) => Response::json(200, &self.status()),
            ("GET", ["metrics"]) => Response {
                status: 200,
                content_type: "text/plain; version=0.0.4",
                body: self.metrics().into_bytes(),
            },
            ("POST", ["api", "v1", "vgpus", vm, "weight"]) => {
                let w = serde_json::from_slice::<Value>(&req.body)
                    .ok()
                    .and_then(|v| v["weight"].as_f64());
                let Some(w) = w else {
                    return Response::error(400, "expected a body like {\"weight\": 2}");
                };
                match self.set_weight(vm, w) {
                    Ok(()) => Response::json(200, &json!({ "vm": vm, "weight": w })),
                    Err(e @ Refusal::NoVm(_)) => Response::error(404, e.to_string()),
                    Err(e) => Response::error(400, e.to_string()),
                }
            }
            ("POST", ["api", "v1", "vgpus", vm, "vcpus"]) => {
                let threads = serde_json::from_slice::<Value>(&req.body)
                    .ok()
                    .and_then(|v| {
                        v["threads"]
                            .as_array()?
                            .iter()
                            .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                            .collect::<Option<Vec<u32>>>()
                    });
                let Some(threads) = threads else {
                    return Response::error(
                        400,
                        "expected a body like {\"threads\": [1234, 1235]}",
                    );
                };
                match self.set_vcpus(vm, threads.clone()) {
                    Ok(()) => Response::json(200, &json!({ "vm": vm, "threads": threads })),
                    Err(e @ Refusal::NoVm(_)) => Response::error(404, e.to_string()),
                    Err(e) => Response::error(500, e.to_string()),
                }
            }
            ("POST", ["api", "v1", "vgpus", vm, verb @ ("attach" | "detach")]) => {
                let body = serde_json::from_slice::<Value>(&req.body).unwrap_or(Value::Null);
                let Some(qmp) = body["qmp"].as_str().map(PathBuf::from) else {
                    return Response::error(
                        400,
                        "expected a body like {\"qmp\": \"/run/qemu/vm1.qmp\"}",
                    );
                };
                let r = if *verb == "attach" {
                    let vectors = self.config().layout.vectors as usize;
                    self.attach(vm, &qmp).map(|t| {
                        let mut v = json!({ "vm": vm, "attached": true, "vcpu_threads": t });
                        if t.len() > vectors {
                            v["warning"] = json!(format!(
                                "{} vCPUs share {vectors} doorbell vectors: a kick may land on \
                                 another vCPU than the one that waits ([layout] vectors)",
                                t.len()
                            ));
                        }
                        v
                    })
                } else {
                    let secs = body["timeout_seconds"].as_u64().unwrap_or(60).clamp(1, 600);
                    self.detach(vm, &qmp, Duration::from_secs(secs))
                        .map(|()| json!({ "vm": vm, "attached": false }))
                };
                match r {
                    Ok(v) => Response::json(200, &v),
                    Err(e @ Refusal::NoVm(_)) => Response::error(404, e.to_string()),
                    Err(e) => Response::error(409, e.to_string()),
                }
            }
            ("POST", ["api", "v1", "vgpus", vm, "memory_limit"]) => {
                let mib = serde_json::from_slice::<Value>(&req.body)
                    .ok()
                    .and_then(|v| v["mib"].as_u64());
                let Some(mib) = mib else {
                    return Response::error(400, "expected a body like {\"mib\": 4096}");
                };
                match self.set_memory_limit(vm, mib) {
                    Ok(()) => Response::json(200, &json!({ "vm": vm, "memory_limit_mib": mib })),
                    Err(e @ Refusal::NoVm(_)) => Response::error(404, e.to_string()),
                    Err(e) => Response::error(400, e.to_string()),
                }
            }
            ("POST", ["api", "v1", "vgpus", vm, "migrate"]) => {
                let gpu = serde_json::from_slice::<Value>(&req.body)
                    .ok()
                    .and_then(|v| v["gpu"].as_u64())
                    .and_then(|g| u32::try_from(g).ok());
                let Some(gpu) = gpu else {
                    return Response::error(400, "expected a body like {\"gpu\": 1}");
                };
                match self.migrate(vm, gpu, Duration::from_secs(60)) {
                    Ok(v) => Response::json(200, &v),
                    Err(e @ Refusal::NoVm(_)) => Response::error(404, e.to_string()),
                    Err(e) => Response::error(409, e.to_string()),
                }
            }
            (
                "POST",
                ["api", "v1", "vgpus", vm, verb @ ("checkpoint" | "resume" | "restore" | "handover")],
            ) => self.save_route(vm, verb, &req.body),
            ("POST", ["api", "v1", "vgpus", vm, "pin"]) => {
                let pinned = serde_json::from_slice::<Value>(&req.body)
                    .ok()
                    .and_then(|v| v["pinned"].as_bool());
                let Some(pinned) = pinned else {
                    return Response::error(400, "expected a body like {\"pinned\": true}");
                };
                match self.set_pinned(vm, pinned) {
                    Ok(()) => Response::json(200, &json!({ "vm": vm, "pinned": pinned })),
                    Err(e) => Response::error(404, e.to_string()),
                }
            }
            ("PUT", ["api", "v1", "vgpus", vm]) => self.put_vgpu(vm, &req.body),
            ("DELETE", ["api", "v1", "vgpus", vm]) => self.delete_vgpu(vm),
            ("POST", ["api", "v1", "reload"]) => match self.reload() {
                Ok(notes) => Response::json(200, &json!({ "reloaded": true, "notes": notes })),
                Err(e) => Response::error(400, format!("config kept: {e}")),
            },
            (_, ["api", ..] | ["metrics"]) => Response::error(405, "no such method here"),
            _ => Response::error(404, "not found"),
        }
    }
}

impl ControlPlane {
    /// `POST /api/v1/vgpus/{vm}/checkpoint|resume|restore|handover`.
    fn save_route(&self, vm: &str, verb: &str, body: &[u8]) -> Response {
        let body = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
        let text = |k: &str| body[k].as_str().map(str::to_owned);
        let op = match (verb, text("file"), text("to")) {
            ("resume", ..) => SaveOp::Resume,
            ("checkpoint", Some(f), _) => SaveOp::Checkpoint(
                f,
                CheckpointWith {
                    region: body["paused"] == Value::Bool(true),
                    replace: body["replace"] == Value::Bool(true),
                },
            ),
            ("restore", _, _) if body["received"] == Value::Bool(true) => SaveOp::RestoreReceived,
            ("restore", Some(f), _) => SaveOp::Restore(f),
            ("handover", _, Some(to)) => SaveOp::Handover(to, body["ahead"] == Value::Bool(true)),
            ("handover", ..) => {
                return Response::error(400, "expected a body like {\"to\": \"10.0.0.2:7400\"}")
            }
            _ => return Response::error(400, "expected a body like {\"file\": \"vm1.fvgpu\"}"),
        };
        match self.save_op(vm, op, SAVE_WAIT) {
            Ok(v) => Response::json(200, &v),
            Err(e @ Refusal::NoVm(_)) => Response::error(404, e.to_string()),
            Err(e @ Refusal::Other(_)) => Response::error(400, e.to_string()),
            Err(e) => Response::error(409, e.to_string()),
        }
    }
}

/// Serves the API on the unix socket (and TCP if configured) and samples
/// the live figures, on background threads.
pub fn start(plane: &Arc<ControlPlane>) -> Result<(), Error> {
    let cfg = plane.config();
    let path = cfg.api_socket();
    // It appears with its mode, listening (clients wait for the file).
    let unix = transport::server::bind_listening(&path, Some(0o660))?;
    let p = plane.clone();
    spawn("api-unix", move || {
        for s in unix.incoming().flatten() {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            dispatch(&p, s, false);
        }
    })?;
    if let Some(addr) = &cfg.api.tcp {
        let tcp = std::net::TcpListener::bind(addr).map_err(|source| Error::Io {
            what: "binding the API TCP address",
            source,
        })?;
        let p = plane.clone();
        spawn("api-tcp", move || {
            for s in tcp.incoming().flatten() {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                dispatch(&p, s, true);
            }
        })?;
    }
    let p = plane.clone();
    spawn("api-sampler", move || loop {
        p.sample();
        std::thread::sleep(SAMPLE_EVERY);
    })?;
    tracing::info!(socket = %path.display(), tcp = ?cfg.api.tcp, "control API serving");
    match &cfg.api.tcp {
        Some(addr) => tracing::info!(
            "dashboard: http://{addr}/#token=TOKEN (TOKEN: the word in [api] token_file)"
        ),
        None => tracing::info!(
            "dashboard: on the API socket only (curl --unix-socket {} http://localhost/); set [api] tcp and token_file to open it in a browser",
            path.display()
        ),
    }
    Ok(())
}

/// Requests served at once; a detach can wait a minute for its guest, so
/// requests run on their own threads, up to this many (then inline).
const MAX_CONCURRENT: usize = 16;

fn dispatch<S>(plane: &Arc<ControlPlane>, s: S, tcp: bool)
where
    S: Send + 'static,
    for<'a> &'a S: std::io::Read + std::io::Write,
{
    use std::sync::atomic::{AtomicUsize, Ordering};
    static ACTIVE: AtomicUsize = AtomicUsize::new(0);
    if ACTIVE.fetch_add(1, Ordering::AcqRel) >= MAX_CONCURRENT {
        serve_one(plane, &s, tcp);
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
        return;
    }
    let p = plane.clone();
    let r = std::thread::Builder::new()
        .name("api-request".into())
        .spawn(move || {
            serve_one(&p, &s, tcp);
            ACTIVE.fetch_sub(1, Ordering::AcqRel);
        });
    if r.is_err() {
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One exchange on a connection (`&UnixStream` and `&TcpStream` read and write).
fn serve_one<S: std::io::Read + std::io::Write + Copy>(plane: &ControlPlane, s: S, tcp: bool) {
    let resp = match http::read_request(s) {
        Ok(req) => plane.handle(&req, tcp),
        Err(resp) => resp,
    };
    let _ = http::write_response(s, &resp);
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), Error> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
        .map_err(|source| Error::Io {
            what: "spawning an API thread",
            source,
        })
}

/// Reads a bearer token file: one word of at least 16 characters.
pub fn token_from_file(path: &Path) -> Result<String, Error> {
    let t = std::fs::read_to_string(path).map_err(|source| Error::TokenFile {
        path: path.to_owned(),
        source,
    })?;
    let t = t.trim().to_owned();
    if t.len() < 16 || t.chars().any(|c| c.is_whitespace()) {
        return Err(Error::BadToken {
            path: path.to_owned(),
        });
    }
    Ok(t)
}
