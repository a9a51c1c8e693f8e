//! The daemon's control API, as the bridge uses it: declare a domain's
//! vGPU, give it back, list the vGPUs libvirt declared, checkpoint and
//! restore one with its domain's save.

use anyhow::{bail, Context as _, Result};
use daemon::control::{client_call, ApiTarget};
use daemon::libvirt_xml::{DomainVgpu, OWNER};
use serde_json::Value;

/// The daemon at its API socket.
#[derive(Debug, Clone)]
pub struct Api(pub ApiTarget);

/// A vGPU the daemon serves, as its status shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Served {
    /// Its name (the domain's).
    pub name: String,
    /// Whether libvirt declared it (not host.toml, not another manager).
    pub by_libvirt: bool,
    /// Its weight now.
    pub weight: f64,
    /// Whether the daemon has its vCPU threads.
    pub has_vcpus: bool,
}

impl Api {
    fn call(&self, method: &str, path: &str, body: &[u8]) -> Result<(u16, Value)> {
        let (code, body) = client_call(&self.0, method, path, body)?;
        let v = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Ok((code, v))
    }

    /// Declares (or updates) `v`'s vGPU; true if it was new. An error
    /// says the daemon's reason, which names the field at fault.
    pub fn declare(&self, v: &DomainVgpu) -> Result<bool> {
        let body = serde_json::to_vec(&v.declaration)?;
        let (code, r) = self.call("PUT", &format!("/api/v1/vgpus/{}", v.name), &body)?;
        match code {
            200 | 201 => Ok(code == 201),
            _ => bail!("{}", r["error"].as_str().unwrap_or("the daemon refused it")),
        }
    }

    /// Gives back the vGPU of domain `name`; one the daemon does not have
    /// is no error.
    pub fn undeclare(&self, name: &str) -> Result<()> {
        let (code, r) = self.call("DELETE", &format!("/api/v1/vgpus/{name}"), b"")?;
        match code {
            200 | 404 => Ok(()),
            _ => bail!("{}", r["error"].as_str().unwrap_or("the daemon refused it")),
        }
    }

    /// Hands the daemon domain `name`'s vCPU thread ids (vCPU order), for
    /// the vCPU lift and the kick.
    pub fn set_vcpus(&self, name: &str, threads: &[u32]) -> Result<()> {
        self.post(name, "vcpus", &serde_json::json!({ "threads": threads }))
            .map(drop)
    }

    /// `POST /api/v1/vgpus/{name}/{verb}` with `body`: the daemon's answer,
    /// or its reason for refusing.
    fn post(&self, name: &str, verb: &str, body: &Value) -> Result<Value> {
        let path = format!("/api/v1/vgpus/{name}/{verb}");
        let (code, r) = self.call("POST", &path, body.to_string().as_bytes())?;
        match code {
            200 => Ok(r),
            _ => bail!("{}", r["error"].as_str().unwrap_or("the daemon refused it")),
        }
    }

    /// Has the daemon take domain `name`'s checkpoint, its region with it
    /// (the domain is paused for its save), into `file` of its checkpoint
    /// folder, replacing one there; the file's length.
    pub fn checkpoint(&self, name: &str, file: &str) -> Result<u64> {
        let body = serde_json::json!({ "file": file, "paused": true, "replace": true });
        let r = self.post(name, "checkpoint", &body)?;
        Ok(r["bytes"].as_u64().unwrap_or(0))
    }

    /// Has the daemon serve domain `name`'s processes on from `file` of its
    /// checkpoint folder; how many.
    pub fn restore(&self, name: &str, file: &str) -> Result<u64> {
        let r = self.post(name, "restore", &serde_json::json!({ "file": file }))?;
        Ok(r["processes"].as_u64().unwrap_or(0))
    }

    /// Every vGPU the daemon serves.
    pub fn served(&self) -> Result<Vec<Served>> {
        let (code, st) = self.call("GET", "/api/v1/status", b"")?;
        if code != 200 {
            bail!("status: HTTP {code}");
        }
        let gpus = st["gpus"].as_array().context("status without gpus")?;
        Ok(gpus
            .iter()
            .flat_map(|g| g["vgpus"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| {
                Some(Served {
                    name: v["name"].as_str()?.to_owned(),
                    by_libvirt: v["declared_by"].as_str() == Some(OWNER),
                    weight: v["weight"].as_f64().unwrap_or(0.0),
                    has_vcpus: v["vcpu_threads"].as_array().is_some_and(|t| !t.is_empty()),
                })
            })
            .collect())
    }
}
