//! The Prometheus exposition of the status.

use serde_json::{json, Value};

use super::ControlPlane;

impl ControlPlane {
    /// The Prometheus exposition of [`ControlPlane::status`].
    pub fn metrics(&self) -> String {
        let st = self.status();
        let mut m = Metrics::default();
        daemon_metrics(&mut m, &st["daemon"]);
        for g in st["gpus"].as_array().into_iter().flatten() {
            let gl = format!("gpu=\"{}\"", g["index"]);
            gpu_metrics(&mut m, &gl, g);
            for v in g["vgpus"].as_array().into_iter().flatten() {
                let l = format!(
                    "{gl},vm=\"{}\",tenant=\"{}\"",
                    v["name"].as_str().unwrap_or_default(),
                    v["tenant"].as_str().unwrap_or_default()
                );
                vgpu_metrics(&mut m, &l, v);
            }
        }
        m.finish()
    }
}

/// The daemon's own figures (`status`'s `daemon`: `d`).
fn daemon_metrics(m: &mut Metrics, d: &Value) {
    m.gauge(
        "fairvgpu_daemon_resident_bytes",
        "Resident memory of the daemon.",
        "",
        &d["rss_bytes"],
    );
    m.gauge(
        "fairvgpu_daemon_open_fds",
        "Open file descriptors of the daemon.",
        "",
        &d["open_fds"],
    );
    let store = &d["image_store"];
    if !store.is_null() {
        m.gauge(
            "fairvgpu_image_store_bytes",
            "Bytes of module images the daemon's store shares between VMs.",
            "",
            &store["bytes"],
        );
        m.gauge(
            "fairvgpu_image_store_images",
            "Module images in the daemon's store.",
            "",
            &store["images"],
        );
        m.counter(
            "fairvgpu_image_store_hits_total",
            "Images a worker got from the store instead of from its guest.",
            "",
            &store["hits"],
        );
    }
}

/// GPU `g`'s figures, labelled `gl`.
fn gpu_metrics(m: &mut Metrics, gl: &str, g: &Value) {
    m.gauge(
        "fairvgpu_gpu_utilization",
        "Fraction of the window the GPU was charged to vGPUs.",
        gl,
        &g["utilization"],
    );
    m.gauge(
        "fairvgpu_gpu_memory_used_bytes",
        "Device memory allocated by the GPU's vGPUs.",
        gl,
        &g["memory_used_bytes"],
    );
    m.gauge(
        "fairvgpu_gpu_memory_total_bytes",
        "Device memory of the GPU (sim executor).",
        gl,
        &g["memory_total_bytes"],
    );
    m.gauge(
        "fairvgpu_gpu_mmr",
        "Min-Max Ratio of share over entitlement among active vGPUs, over the window.",
        gl,
        &g["mmr"],
    );
}

/// vGPU `v`'s figures, labelled `l`.
fn vgpu_metrics(m: &mut Metrics, l: &str, v: &Value) {
    m.counter(
        "fairvgpu_vgpu_gpu_seconds_total",
        "GPU time charged to the vGPU.",
        l,
        &v["gpu_seconds"],
    );
    m.gauge(
        "fairvgpu_vgpu_share",
        "The vGPU's share of its GPU's charged time over the window.",
        l,
        &v["share"],
    );
    m.gauge(
        "fairvgpu_vgpu_entitlement",
        "The vGPU's weighted fair share among active vGPUs.",
        l,
        &v["entitlement"],
    );
    m.gauge(
        "fairvgpu_vgpu_weight",
        "Scheduling weight.",
        l,
        &v["weight"],
    );
    m.gauge(
        "fairvgpu_vgpu_queue_depth",
        "Requests waiting in the vGPU's rings.",
        l,
        &v["queue_depth"],
    );
    m.gauge(
        "fairvgpu_vgpu_sync_calls_per_second",
        "Synchronous calls per second over the window.",
        l,
        &v["sync_calls_per_second"],
    );
    m.gauge(
        "fairvgpu_vgpu_interactive",
        "1 if CPU-GPU interactive (over 10 synchronous calls per 10 ms).",
        l,
        &json!(u8::from(v["interactive"] == true)),
    );
    m.gauge(
        "fairvgpu_vgpu_memory_used_bytes",
        "Device memory allocated.",
        l,
        &v["memory_used_bytes"],
    );
    m.gauge(
        "fairvgpu_vgpu_memory_limit_bytes",
        "Device memory limit.",
        l,
        &v["memory_limit_bytes"],
    );
    m.counter(
        "fairvgpu_vgpu_migrations_total",
        "Moves of the vGPU to another GPU.",
        l,
        &v["migrations"],
    );
    m.gauge(
        "fairvgpu_vgpu_occupancy",
        "Mean fraction of the GPU's cores its recent launches could occupy.",
        l,
        &v["occupancy"],
    );
    m.gauge(
        "fairvgpu_vgpu_demand",
        "Share of the window the vGPU wanted or held its GPU (what placement balances).",
        l,
        &v["demand"],
    );
    m.counter(
        "fairvgpu_vgpu_requests_total",
        "Requests served by the vGPU's current worker process.",
        l,
        &v["requests"],
    );
    m.counter(
        "fairvgpu_vgpu_refused_total",
        "Requests refused as bad input by the vGPU's current worker process.",
        l,
        &v["refused"],
    );
    m.gauge(
        "fairvgpu_vgpu_worker_resident_bytes",
        "Resident memory of the vGPU's worker process.",
        l,
        &v["worker_rss_bytes"],
    );
    m.gauge(
        "fairvgpu_vgpu_worker_open_fds",
        "Open file descriptors of the vGPU's worker process.",
        l,
        &v["worker_open_fds"],
    );
    m.counter(
        "fairvgpu_vgpu_log_lines_suppressed_total",
        "Log lines the VM's guests triggered that the daemon and the vGPU's current worker suppressed (rate-limited per VM).",
        l,
        &v["log_lines_suppressed"],
    );
    m.counter(
        "fairvgpu_vgpu_contexts_created_total",
        "CUDA contexts the vGPU's current worker made for guest processes.",
        l,
        &v["contexts_created"],
    );
    m.counter(
        "fairvgpu_vgpu_contexts_reused_total",
        "Guest processes the vGPU's current worker gave an ended process's context, made clean.",
        l,
        &v["contexts_reused"],
    );
    m.counter(
        "fairvgpu_vgpu_grants_revoked_total",
        "Grants taken back because the vGPU's worker kept the GPU far past its slice.",
        l,
        &v["grants_revoked"],
    );
    m.counter(
        "fairvgpu_vgpu_worker_faults_total",
        "Workers of the vGPU's processes that ended other than with their process (a crash, a poisoned context).",
        l,
        &v["worker_faults"],
    );
    m.gauge(
        "fairvgpu_vgpu_connected",
        "1 if the vGPU's worker is connected to its GPU's scheduler.",
        l,
        &json!(u8::from(v["connected"] == true)),
    );
}

/// Prometheus text: each metric's HELP and TYPE, then its samples.
#[derive(Default)]
struct Metrics {
    /// (name, type, help, sample lines), in first-seen order.
    metrics: Vec<(&'static str, &'static str, &'static str, Vec<String>)>,
}

impl Metrics {
    fn line(
        &mut self,
        kind: &'static str,
        name: &'static str,
        help: &'static str,
        labels: &str,
        v: &Value,
    ) {
        let Some(x) = v.as_f64() else { return };
        let sample = if labels.is_empty() {
            format!("{name} {x}\n")
        } else {
            format!("{name}{{{labels}}} {x}\n")
        };
        match self.metrics.iter_mut().find(|m| m.0 == name) {
            Some(m) => m.3.push(sample),
            None => self.metrics.push((name, kind, help, vec![sample])),
        }
    }
    fn gauge(&mut self, name: &'static str, help: &'static str, labels: &str, v: &Value) {
        self.line("gauge", name, help, labels, v);
    }
    fn counter(&mut self, name: &'static str, help: &'static str, labels: &str, v: &Value) {
        self.line("counter", name, help, labels, v);
    }
    fn finish(self) -> String {
        let mut out = String::new();
        for (name, kind, help, samples) in self.metrics {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            out.extend(samples);
        }
        out
    }
}
