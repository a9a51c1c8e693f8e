//! Text views of the daemon's status for `fairvgpu status` and `fairvgpu top`.

use serde_json::Value;

fn pct(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "-".into(), |x| format!("{:.1}%", 100.0 * x))
}

/// The status as a table per GPU.
pub fn render_status(st: &Value) -> String {
    let mut out = format!(
        "executor {}, scheduler {}, window {} s, up {:.0} s\n",
        st["executor"].as_str().unwrap_or("?"),
        if st["scheduler"] == true { "on" } else { "off" },
        st["window_seconds"],
        st["uptime_seconds"].as_f64().unwrap_or(0.0)
    );
    // The host CPU options (see `hostcpu`): on, or off with the reason.
    for (key, name) in daemon::hostcpu::OPTIONS {
        let o = &st["host_cpu"][key];
        if o.is_object() {
            out.push_str(&format!(
                "{name}: {} ({})\n",
                if o["on"] == true { "on" } else { "off" },
                o["detail"].as_str().unwrap_or("")
            ));
        }
    }
    for g in st["gpus"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\nGPU {}  utilization {}  MMR {}  memory {} MiB\n",
            g["index"],
            pct(&g["utilization"]),
            g["mmr"]
                .as_f64()
                .map_or_else(|| "-".into(), |m| format!("{m:.3}")),
            g["memory_used_bytes"].as_u64().unwrap_or(0) >> 20
        ));
        out.push_str(&format!(
            "  {:<16} {:<12} {:>6} {:>8} {:>11} {:>9} {:>7} {:>6} {:>15} {:>10}\n",
            "vGPU",
            "tenant",
            "weight",
            "share",
            "entitlement",
            "GPU s",
            "sync/s",
            "queue",
            "memory MiB",
            "logs cut"
        ));
        for v in g["vgpus"].as_array().into_iter().flatten() {
            let ent = if v["active"] == true {
                pct(&v["entitlement"])
            } else {
                "idle".into()
            };
            out.push_str(&format!(
                "  {:<16} {:<12} {:>6} {:>8} {:>11} {:>9.2} {:>7.0}{} {:>6} {:>15} {:>10}\n",
                v["name"].as_str().unwrap_or("?"),
                v["tenant"].as_str().unwrap_or("?"),
                v["weight"],
                pct(&v["share"]),
                ent,
                v["gpu_seconds"].as_f64().unwrap_or(0.0),
                v["sync_calls_per_second"].as_f64().unwrap_or(0.0),
                if v["interactive"] == true { "*" } else { " " },
                v["queue_depth"],
                format!(
                    "{}/{}",
                    v["memory_used_bytes"].as_u64().unwrap_or(0) >> 20,
                    v["memory_limit_bytes"].as_u64().unwrap_or(0) >> 20
                ),
                // Log lines its guests triggered that were rate-limited away.
                v["log_lines_suppressed"].as_u64().unwrap_or(0)
            ));
        }
    }
    let events: Vec<&Value> = st["events"].as_array().into_iter().flatten().collect();
    if !events.is_empty() {
        out.push_str("\nrecent events:\n");
        for e in events.iter().rev().take(5) {
            out.push_str(&format!(
                "  {:>8.1}s {}: {}\n",
                e["t"].as_f64().unwrap_or(0.0),
                e["kind"].as_str().unwrap_or(""),
                e["message"].as_str().unwrap_or("")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_every_vgpu_with_its_share() {
        let st = serde_json::json!({
            "executor": "sim", "scheduler": true, "window_seconds": 5.0, "uptime_seconds": 3.0,
            "gpus": [{ "index": 0, "utilization": 0.9, "mmr": 0.95, "memory_used_bytes": 0,
                "vgpus": [
                    { "name": "vm1", "tenant": "a", "weight": 1.0, "share": 0.25, "entitlement": 0.25,
                      "active": true, "gpu_seconds": 1.0, "sync_calls_per_second": 2000.0,
                      "interactive": true, "queue_depth": 0, "memory_used_bytes": 1048576,
                      "memory_limit_bytes": 4194304, "log_lines_suppressed": 4242 },
                    { "name": "vm2", "tenant": "b", "weight": 3.0, "share": 0.75, "entitlement": 0.75,
                      "active": false, "gpu_seconds": 3.0, "sync_calls_per_second": 0.0,
                      "interactive": false, "queue_depth": 2, "memory_used_bytes": 0,
                      "memory_limit_bytes": 4194304 }]}],
            "events": [{ "t": 1.0, "kind": "weight", "message": "vm2: weight set to 3" }]
        });
        let s = super::render_status(&st);
        assert!(s.contains("MMR 0.950"), "{s}");
        assert!(
            s.contains("vm1") && s.contains("25.0%") && s.contains("1/4"),
            "{s}"
        );
        assert!(s.contains("idle") && s.contains("75.0%"), "{s}");
        assert!(s.contains("logs cut") && s.contains("4242"), "{s}");
        assert!(s.contains("weight set to 3"), "{s}");
        assert!(!s.contains("priority lift"), "no host_cpu, no lines: {s}");
    }

    #[test]
    fn renders_the_host_cpu_options_with_the_reason_when_off() {
        let st = serde_json::json!({
            "executor": "sim", "scheduler": true, "window_seconds": 5.0, "uptime_seconds": 3.0,
            "gpus": [], "events": [],
            "host_cpu": {
                "priority": { "on": true, "detail": "at nice -10" },
                "vcpu_lift": { "on": true, "detail": "holder's threads" },
                "realtime": { "on": false, "detail": "[daemon] realtime = false" },
                "cpus": { "on": false, "detail": "not set ([daemon] cpus)" },
                "cgroup": { "on": false, "detail": "no cgroup v2 hierarchy is mounted" }
            }
        });
        let s = super::render_status(&st);
        for line in [
            "priority lift: on (at nice -10)",
            "vCPU lift: on (holder's threads)",
            "real-time lift: off ([daemon] realtime = false)",
            "reserved CPUs: off (not set ([daemon] cpus))",
            "cgroup: off (no cgroup v2 hierarchy is mounted)",
        ] {
            assert!(s.lines().any(|l| l == line), "{line:?} in {s}");
        }
    }
}
