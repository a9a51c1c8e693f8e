//! A small QMP client: enough to hot-plug the vGPU, find its PCI BAR and read
//! the vCPU thread ids (`query-cpus-fast`) for coscheduling.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::error::{Error, Result};

/// A QMP connection in command mode.
#[derive(Debug)]
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// Events that arrived while a command was waiting for its answer.
    events: Vec<Value>,
    /// How long a command may take.
    timeout: Duration,
}

impl Qmp {
    /// Connects, reads the greeting and negotiates capabilities.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp> {
        let s = UnixStream::connect(path).map_err(|e| Error::io("connecting to QMP", e))?;
        s.set_read_timeout(Some(timeout))
            .map_err(|e| Error::io("QMP timeout", e))?;
        let writer = s.try_clone().map_err(|e| Error::io("QMP socket", e))?;
        let mut q = Qmp {
            reader: BufReader::new(s),
            writer,
            events: Vec::new(),
            timeout,
        };
        let greeting = q.read_value()?;
        if greeting.get("QMP").is_none() {
            return Err(Error::Protocol(format!("not a QMP greeting: {greeting}")));
        }
        q.execute("qmp_capabilities", json!({}))?;
        Ok(q)
    }

    fn read_value(&mut self) -> Result<Value> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|e| Error::io("reading QMP", e))?;
        if n == 0 {
            return Err(Error::Disconnected);
        }
        serde_json::from_str(&line).map_err(|e| Error::Protocol(format!("bad QMP JSON: {e}")))
    }

    /// Runs one command and returns its `return` value; asynchronous events
    /// that arrive meanwhile are kept for [`Qmp::wait_event`].
    pub fn execute(&mut self, cmd: &str, args: Value) -> Result<Value> {
        let msg = json!({"execute": cmd, "arguments": args});
        writeln!(self.writer, "{msg}").map_err(|e| Error::io("writing QMP", e))?;
        loop {
            let v = self.read_value()?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                let desc = e.get("desc").and_then(Value::as_str).unwrap_or("");
                return Err(Error::Protocol(format!("QMP {cmd}: {desc}")));
            }
            if v.get("event").is_some() {
                self.events.push(v);
            }
        }
    }

    /// Waits for an event named `name` whose `data` satisfies `pred` (one
    /// that already arrived counts), up to `timeout`.
    pub fn wait_event(
        &mut self,
        name: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let hit = |v: &Value| v["event"] == name && pred(&v["data"]);
        if let Some(i) = self.events.iter().position(hit) {
            return Ok(self.events.remove(i));
        }
        let deadline = std::time::Instant::now() + timeout;
        let r = self.next_event(deadline, &hit);
        let _ = self.reader.get_ref().set_read_timeout(Some(self.timeout));
        r
    }

    fn next_event(
        &mut self,
        deadline: std::time::Instant,
        hit: &dyn Fn(&Value) -> bool,
    ) -> Result<Value> {
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout);
            }
            self.reader
                .get_ref()
                .set_read_timeout(Some(left))
                .map_err(|e| Error::io("QMP timeout", e))?;
            let v = match self.read_value() {
                Ok(v) => v,
                Err(Error::Io { source, .. })
                    if matches!(
                        source.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(Error::Timeout)
                }
                Err(e) => return Err(e),
            };
            if hit(&v) {
                return Ok(v);
            }
            if v.get("event").is_some() {
                self.events.push(v);
            }
        }
    }

    /// Thread ids of the vCPUs, in vCPU order.
    pub fn vcpu_threads(&mut self) -> Result<Vec<(u32, u32)>> {
        let v = self.execute("query-cpus-fast", json!({}))?;
        let cpus = v
            .as_array()
            .ok_or_else(|| Error::Protocol("query-cpus-fast: not a list".into()))?;
        Ok(cpus
            .iter()
            .filter_map(|c| {
                let idx = c.get("cpu-index")?.as_u64()?;
                let tid = c.get("thread-id")?.as_u64()?;
                Some((u32::try_from(idx).ok()?, u32::try_from(tid).ok()?))
            })
            .collect())
    }

    /// PCI devices with the given vendor and device id: (bus, slot, BAR sizes by index).
    pub fn find_pci(&mut self, vendor: u64, device: u64) -> Result<Vec<PciDevice>> {
        let v = self.execute("query-pci", json!({}))?;
        let mut out = Vec::new();
        for bus in v.as_array().into_iter().flatten() {
            let busno = bus.get("bus").and_then(Value::as_u64).unwrap_or(0);
            for dev in bus
                .get("devices")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let id = dev.get("id");
                let ven = id.and_then(|i| i.get("vendor")).and_then(Value::as_u64);
                let did = id.and_then(|i| i.get("device")).and_then(Value::as_u64);
                if ven != Some(vendor) || did != Some(device) {
                    continue;
                }
                let mut bars = Vec::new();
                for r in dev
                    .get("regions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let (Some(bar), Some(size)) = (
                        r.get("bar").and_then(Value::as_u64),
                        r.get("size").and_then(Value::as_u64),
                    ) {
                        bars.push((bar, size));
                    }
                }
                let slot = dev.get("slot").and_then(Value::as_u64).unwrap_or(0);
                let qdev_id = dev
                    .get("qdev_id")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                out.push(PciDevice {
                    bus: busno,
                    slot,
                    qdev_id,
                    bars,
                });
            }
        }
        Ok(out)
    }
}

/// A PCI device as QMP describes it.
#[derive(Debug, Clone)]
pub struct PciDevice {
    /// Bus number.
    pub bus: u64,
    /// Slot number.
    pub slot: u64,
    /// The `id=` it was added with.
    pub qdev_id: String,
    /// (BAR index, size) pairs.
    pub bars: Vec<(u64, u64)>,
}
