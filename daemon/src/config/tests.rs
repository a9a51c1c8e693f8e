//! The config parsed, validated and asked.

use super::*;

const GOOD: &str = r#"
[daemon]
run_dir = "/tmp/x"
executor = "sim"

[[vm]]
name = "vm1"
tenant = "acme"
weight = 2
memory_limit_mib = 1024
"#;

#[test]
fn good_config_parses() {
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(c.vms[0].weight, 2.0);
    assert_eq!(c.socket("vm1"), PathBuf::from("/tmp/x/vm1.sock"));
    assert_eq!(c.daemon.graph_launches, GraphLaunches::All);
    let runs = GOOD.replace(
        "executor = \"sim\"",
        "executor = \"sim\"\ngraph_launches = \"runs\"",
    );
    assert_eq!(
        Config::parse(&runs).unwrap().daemon.graph_launches,
        GraphLaunches::Runs
    );
    // A GPU's policy; GPUs without a [[gpu]] take the fair queue.
    let las = format!("{GOOD}\n[[gpu]]\nindex = 1\npolicy = \"las\"\n");
    let c = Config::parse(&las).unwrap();
    assert_eq!(c.gpu_policy(1), sched::DevicePolicy::Las);
    assert_eq!(c.gpu_policy(0), sched::DevicePolicy::FairQueue);
    // Processes at once per vGPU of an MPS GPU: 4 unless set.
    assert_eq!(c.gpu_mps_processes(1), 4);
    let eight = format!("{GOOD}\n[[gpu]]\nindex = 0\nmps = true\nmps_processes = 8\n");
    assert_eq!(Config::parse(&eight).unwrap().gpu_mps_processes(0), 8);
}

#[test]
fn a_gpu_that_preempts_gets_the_preemptive_slice_unless_it_has_its_own() {
    // docs/design.md's slices: 6 ms where kernels cannot be preempted, 30 ms where they can.
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(c.gpu_slice_ns(0, false), 6_000_000);
    assert_eq!(c.gpu_slice_ns(0, true), 30_000_000);
    let text = GOOD.replace(
        "executor = \"sim\"",
        "executor = \"sim\"\nslice_us = 5000\npreemptive_slice_us = 20000",
    );
    let own = format!("{text}\n[[gpu]]\nindex = 1\nslice_us = 3000\n");
    let c = Config::parse(&own).unwrap();
    assert_eq!(c.gpu_slice_ns(0, false), 5_000_000);
    assert_eq!(c.gpu_slice_ns(0, true), 20_000_000);
    // GPU 1's own slice, whether it preempts or not.
    assert_eq!(c.gpu_slice_ns(1, true), 3_000_000);
    assert_eq!(c.gpu_slice_ns(1, false), 3_000_000);
}

#[test]
fn mistakes_are_named() {
    for (text, needle) in [
        (GOOD.replace("tenant", "tenantt"), "tenantt"),
        (GOOD.replace("weight = 2", "weight = -1"), "weight"),
        (GOOD.replace("1024", "999999999"), "exceeds"),
        (GOOD.replace("vm1", "a b"), "vm name"),
        (format!("{GOOD}\n[[tenant]]\nname = \"acme\"\nweight = -2\n"), "tenant \"acme\": weight"),
        (format!("{GOOD}\n[[tenant]]\nname = \"a\"\nweight = 1\n[[tenant]]\nname = \"a\"\nweight = 2\n"), "twice"),
        (format!("{GOOD}\n[api]\ntcp = \"0.0.0.0:9400\"\n"), "token_file"),
        (
            GOOD.replace("[daemon]", "[daemon]\nhandover_listen = \"0.0.0.0:7400\""),
            "checkpoint_key_file",
        ),
        (
            GOOD.replace("[daemon]", "[daemon]\nhandover_listen = \"x\"\ncheckpoint_key_file = \"/k\""),
            "not an address",
        ),
        (format!("{GOOD}\n[api]\ntcp = \"nowhere\"\ntoken_file = \"/t\"\n"), "address"),
        (GOOD.replace("executor = \"sim\"", "executor = \"sim\"\ngraph_launches = \"yes\""), "graph_launches"),
        (GOOD.replace("executor = \"sim\"", "executor = \"sim\"\npreemptive_slice_us = 0"), "preemptive_slice_us must be"),
        (format!("{GOOD}\n[[gpu]]\nindex = 0\nslice_us = 2000000\n"), "[[gpu]] slice_us must be"),
        (format!("{GOOD}\n[layout]\nchannels = 0\nring_entries = 8\narena_size = 4096\nvectors = 1\n"), "channels"),
        (format!("{GOOD}\n[[gpu]]\nindex = 0\npolicy = \"fastest\"\n"), "fastest"),
        (format!("{GOOD}\n[[gpu]]\nindex = 0\n[[gpu]]\nindex = 0\npolicy = \"tfs\"\n"), "twice"),
        (format!("{GOOD}\n[[gpu]]\nindex = 0\nmps = true\nmps_processes = 0\n"), "mps_processes"),
        (format!("{GOOD}\n[sim]\ngpus = 2\nno_compression_gpu = 2\n"), "no_compression_gpu 2 does not exist"),
    ] {
        let e = Config::parse(&text).unwrap_err().to_string();
        assert!(e.contains(needle), "{e:?} should mention {needle:?}");
    }
}

#[test]
fn errors_found_after_parsing_name_the_line() {
    let two = format!(
        "{GOOD}\n[[vm]]\nname = \"vm2\"\ntenant = \"b\"\nweight = 0\nmemory_limit_mib = 1\n"
    );
    let line = two.lines().position(|l| l == "weight = 0").unwrap() + 1;
    let e = Config::parse(&two).unwrap_err();
    assert!(
        matches!(&e, crate::Error::Config(ConfigError::Invalid { file: None, line: Some(n), .. })
            if *n == line),
        "{e:?}"
    );
    let e = e.to_string();
    assert!(e.starts_with(&format!("config: line {line}: ")), "{e}");
    assert!(e.contains("weight"), "{e}");
    let api = format!("{GOOD}\n[api]\ntcp = \"x\"\ntoken_file = \"/t\"\n");
    let tcp = api.lines().position(|l| l.starts_with("tcp")).unwrap() + 1;
    let e = Config::parse(&api).unwrap_err().to_string();
    assert!(e.contains(&format!("line {tcp}:")), "{e}");
    // Syntax and unknown keys: the TOML parser's own line and column.
    let e = Config::parse(&GOOD.replace("tenant", "tenantt")).unwrap_err();
    assert!(
        matches!(
            &e,
            crate::Error::Config(ConfigError::Syntax { file: None, .. })
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("line"), "{e}");
}

#[test]
fn a_file_that_cannot_be_read_or_is_invalid_is_named() {
    let dir = scratch::dir("fvg-config-load");
    let path = dir.join("host.toml");
    let _ = std::fs::remove_file(&path);
    let e = Config::load(&path).unwrap_err();
    assert!(
        matches!(&e, crate::Error::Config(ConfigError::NotFound { path: p }) if *p == path),
        "{e:?}"
    );
    let shown = path.display();
    assert!(
        e.to_string()
            .starts_with(&format!("config: {shown}: no such file; pass --config")),
        "{e}"
    );
    let bad = format!(
        "{GOOD}\n[[vm]]\nname = \"vm2\"\ntenant = \"b\"\nweight = 0\nmemory_limit_mib = 1\n"
    );
    let line = bad.lines().position(|l| l == "weight = 0").unwrap() + 1;
    std::fs::write(&path, &bad).unwrap();
    let e = Config::load(&path).unwrap_err();
    assert!(
        matches!(&e, crate::Error::Config(ConfigError::Invalid { file: Some(f), line: Some(n), .. })
            if *f == path && *n == line),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with(&format!("config: {shown}: line {line}: ")),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn host_cpu_options_default_and_bad_ones_are_one_line_naming_the_key() {
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(
        (
            c.daemon.priority,
            c.daemon.vcpu_lift,
            c.daemon.cpus.as_deref()
        ),
        (-10, true, None)
    );
    assert_eq!(c.daemon.cgroup_cpu_weight, 1000);
    assert_eq!(c.daemon.ahead_keep_s, 600);
    assert!(
        !c.daemon.realtime,
        "the real-time lift is the operator's choice"
    );
    let set = |extra: &str| {
        GOOD.replace(
            "executor = \"sim\"",
            &format!("executor = \"sim\"\n{extra}"),
        )
    };
    let c = Config::parse(&set(
        "cpus = \"0-1,4\"\npriority = 0\nvcpu_lift = false\ncgroup_cpu_weight = 0",
    ))
    .unwrap();
    assert_eq!(c.daemon.cpus.as_deref(), Some("0-1,4"));
    assert_eq!((c.daemon.priority, c.daemon.vcpu_lift), (0, false));
    assert!(
        Config::parse(&set("realtime = true"))
            .unwrap()
            .daemon
            .realtime
    );
    // The real-time lift lifts what the vCPU lift chooses: without it, one
    // line naming the key.
    for without in ["vcpu_lift = false", "priority = 0"] {
        let text = set(&format!("realtime = true\n{without}"));
        let e = Config::parse(&text).unwrap_err().to_string();
        assert!(
            e.contains("[daemon] realtime = true needs the vCPU lift"),
            "{e}"
        );
        let line = text.lines().position(|l| l == "realtime = true").unwrap() + 1;
        assert!(e.contains(&format!("line {line}:")), "{e}");
        assert_eq!(e.lines().count(), 1, "{e:?}");
    }
    for (extra, needle) in [
        (
            "cpus = \"1-0\"",
            "[daemon] cpus = \"1-0\": the range \"1-0\" runs backwards",
        ),
        (
            "cpus = \"0-1,x\"",
            "[daemon] cpus = \"0-1,x\": \"x\" is not a CPU number",
        ),
        ("cpus = \"\"", "[daemon] cpus"),
        ("cpus = 3", "cpus"),
        ("priority = -21", "[daemon] priority must be"),
        ("priority = 5", "[daemon] priority must be"),
        (
            "cgroup_cpu_weight = 10001",
            "[daemon] cgroup_cpu_weight must be",
        ),
        ("vcpu_lifts = true", "vcpu_lifts"),
        (
            "ahead_keep_s = 0",
            "[daemon] ahead_keep_s must be 1..=86400",
        ),
        (
            "ahead_keep_s = 86401",
            "[daemon] ahead_keep_s must be 1..=86400",
        ),
    ] {
        let text = set(extra);
        let e = Config::parse(&text).unwrap_err().to_string();
        assert!(e.contains(needle), "{e:?} should mention {needle:?}");
        assert_eq!(e.lines().count(), 1, "{e:?}");
        if !extra.starts_with("vcpu_lifts") && !extra.starts_with("cpus = 3") {
            let line = text.lines().position(|l| l == extra).unwrap() + 1;
            assert!(e.contains(&format!("line {line}:")), "{e}");
        }
    }
}

/// A VM that sets no `process_slots` has a worker per process, up to
/// eight at once, with channels for each process's threads; a VM's own
/// setting stands, from 1; the one-worker settings of earlier releases
/// are refused, saying why.
#[test]
fn process_slots_default_to_eight_and_one_worker_for_all_is_refused() {
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(c.vms[0].slots(), DEFAULT_PROCESS_SLOTS);
    let l = c.layout_for(&c.vms[0]);
    assert_eq!(l.partitions, 8);
    assert_eq!(l.channels, 8 * lookup::CHANNELS_PER_SLOT);
    assert!(l.vectors >= 8);
    let one = GOOD.replace("weight = 2", "weight = 2\nprocess_slots = 1");
    let c = Config::parse(&one).unwrap();
    assert_eq!(c.vms[0].slots(), 1);
    assert_eq!(c.layout_for(&c.vms[0]).partitions, 1);
    let none = GOOD.replace("weight = 2", "weight = 2\nprocess_slots = 0");
    let e = Config::parse(&none).unwrap_err().to_string();
    assert!(e.contains("process_slots must be 1..=16, not 0"), "{e}");
    let standby = GOOD.replace("weight = 2", "weight = 2\nstandby = true");
    let e = Config::parse(&standby).unwrap_err().to_string();
    assert!(e.contains("[[vm]] standby is no longer a setting"), "{e}");
    let fault = GOOD.replace("[daemon]", "[daemon]\nfault_standby = true");
    let e = Config::parse(&fault).unwrap_err().to_string();
    assert!(
        e.contains("[daemon] fault_standby is no longer a setting"),
        "{e}"
    );
    // A declared entry written out keeps an unset value unset.
    let text = toml::to_string(&Config::parse(GOOD).unwrap().vms[0]).unwrap();
    assert!(!text.contains("process_slots"), "{text}");
}
