//! `benchfleet-agent verify` against the fake NVML: what an operator sees on
//! a new host, and the exit code automation relies on.

use serde_json::Value;

use crate::fake::Scenario;

/// `verify --json` on a scenario: the exit code and the report.
fn verify_json(scenario: &str, args: &[&str]) -> (i32, Value) {
    Scenario::new(scenario).verify_json(args)
}

/// Each GPU's reasons, in index order.
fn reasons(report: &Value) -> Vec<Vec<String>> {
    report["gpus"]
        .as_array()
        .expect("a list of GPUs")
        .iter()
        .map(|g| {
            g["reasons"].as_array().expect("reasons").iter().map(|r| r.as_str().expect("text").to_owned()).collect()
        })
        .collect()
}

#[test]
fn eight_healthy_h200s_are_all_usable() {
    let (code, report) = verify_json("gpus = 8\n", &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["usable"], true);
    let gpus = report["gpus"].as_array().expect("GPUs");
    assert_eq!(gpus.len(), 8);
    for (i, g) in gpus.iter().enumerate() {
        assert_eq!(g["index"], i);
        assert_eq!(g["name"], "NVIDIA H200");
        assert_eq!(g["usable"], true);
        assert_eq!(g["memory_total_bytes"], 143_771u64 << 20);
        assert_eq!(g["driver_version"], "550.54.15");
        assert_eq!(g["cuda_driver_version"], "12.4");
        assert_eq!(g["ecc_enabled"], true);
        assert_eq!(g["ecc_uncorrectable_volatile"], 0);
        assert_eq!(g["remapped_rows"]["pending"], false, "read through the one unsafe call");
        assert_eq!(g["retired_pages_pending"], Value::Null, "not supported by an H200");
        assert_eq!(g["throttle_reasons"], serde_json::json!(["gpu_idle"]));
        assert_eq!(g["pcie_width_max"], 16);
        assert_eq!(g["processes"], serde_json::json!([]));
        let fingerprint = g["fingerprint"].as_str().expect("fingerprint");
        assert!(fingerprint.starts_with("NVIDIA H200 uuid=GPU-"), "{fingerprint}");
        assert!(fingerprint.contains(" driver=550.54.15 cuda=12.4 sm_max_mhz=1980 "), "{fingerprint}");
    }
    let uuids: std::collections::HashSet<&str> = gpus.iter().map(|g| g["uuid"].as_str().expect("uuid")).collect();
    assert_eq!(uuids.len(), 8, "UUIDs are unique");
}

#[test]
fn the_table_says_which_gpu_is_not_usable_and_why() {
    let scenario = Scenario::new("gpus = 8\ngpu.3.ecc_volatile = 3\n");
    let out = scenario.agent(&["verify"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(table.starts_with("driver 550.54.15, CUDA 12.4\n"), "{table}");
    assert_eq!(table.matches("| usable").count(), 7, "{table}");
    assert!(table.contains("NOT usable: ECC uncorrectable errors: 3"), "{table}");
    assert!(table.ends_with("7 of 8 GPUs usable\n"), "{table}");
}

#[test]
fn a_gpu_with_ecc_errors_is_excluded_alone() {
    let (code, report) = verify_json("gpus = 8\ngpu.3.ecc_volatile = 3\n", &[]);
    assert_eq!(code, 1);
    assert_eq!(report["usable"], false);
    let reasons = reasons(&report);
    assert_eq!(reasons[3], ["ECC uncorrectable errors: 3"]);
    assert!(reasons.iter().enumerate().all(|(i, r)| i == 3 || r.is_empty()), "{reasons:?}");
}

#[test]
fn corrected_ecc_errors_are_read_and_do_not_make_a_gpu_unusable() {
    let scenario = Scenario::new("gpus = 2\ngpu.1.ecc_corrected = 17\n");
    let (code, report) = scenario.verify_json(&[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["gpus"][0]["ecc_corrected_volatile"], 0);
    assert_eq!(report["gpus"][1]["ecc_corrected_volatile"], 17);
    let out = scenario.agent(&["verify"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("on, 0 unc. (0 lifetime), 17 corr."), "{table}");
}

#[test]
fn an_a100_is_not_an_h200() {
    let scenario = "gpus = 1\ngpu.*.name = NVIDIA A100-SXM4-80GB\n";
    let (code, report) = verify_json(scenario, &["--require", "H200"]);
    assert_eq!(code, 1);
    assert_eq!(reasons(&report), [["not an H200: NVIDIA A100-SXM4-80GB"]]);
    // By default only the H100 and H200 families may be benchmarked on;
    // an empty list takes any GPU, and a list names several.
    let (code, report) = verify_json(scenario, &[]);
    assert_eq!(code, 1);
    assert_eq!(reasons(&report), [["not an H100 or H200: NVIDIA A100-SXM4-80GB"]]);
    assert_eq!(verify_json(scenario, &["--require", ""]).0, 0);
    assert_eq!(verify_json(scenario, &["--require", "H200, A100"]).0, 0);
    // The config file can require it too.
    let s = Scenario::new(scenario);
    let config = s.file("agent.toml", "[gpu]\nrequire_model = \"H200\"\n");
    let out = s.agent(&["verify", "--config", config.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("not an H200"));
}

#[test]
fn a_foreign_process_is_reported_with_its_memory() {
    let (code, report) = verify_json("gpus = 2\ngpu.1.process = 4242:12288\n", &[]);
    assert_eq!(code, 1);
    assert_eq!(reasons(&report), [vec![], vec!["1 foreign process uses 12 GiB".to_owned()]]);
    assert_eq!(report["gpus"][1]["processes"], serde_json::json!([{ "pid": 4242, "used_memory_bytes": 12u64 << 30 }]));
    // Two processes, and a small one the policy tolerates.
    let (_, report) =
        verify_json("gpus = 2\ngpu.0.process = 1:6144\ngpu.0.process = 2:6144\ngpu.1.process = 3:100\n", &[]);
    assert_eq!(reasons(&report), [vec!["2 foreign processes use 12 GiB".to_owned()], vec![]]);
}

/// Every verdict, read through NVML: one scenario line, the reason it gives.
#[test]
fn every_reason_comes_through_nvml() {
    for (line, expected) in [
        ("gpu.0.mig = 1", "MIG enabled"),
        ("gpu.0.ecc = 0", "ECC disabled"),
        ("gpu.0.pcie_width = 8", "PCIe x8 of x16"),
        ("gpu.0.throttle = 0x8", "throttled: HW slowdown"),
        ("gpu.0.throttle = 0x41", "throttled: HW thermal slowdown"),
        ("gpu.0.remap_pending = 1", "row remapping pending: reset the GPU"),
        ("gpu.0.remap_failed = 1", "row remapping failed: the GPU needs service"),
        ("gpu.0.retired_pending = 1", "retired pages pending: reset the GPU"),
        ("gpu.0.temperature = 92", "temperature 92 C above 85 C"),
        ("gpu.0.power_limit_mw = 500000", "power limit 500 W of 700 W"),
        ("gpu.0.temperature = error", "cannot read the temperature: an internal driver error occurred"),
    ] {
        let (code, report) = verify_json(&format!("gpus = 1\n{line}\n"), &[]);
        assert_eq!((code, reasons(&report)), (1, vec![vec![expected.to_owned()]]), "{line}");
    }
    // What a GPU does not support is no reason.
    let (code, report) = verify_json("gpus = 1\ngpu.0.temperature = unsupported\n", &[]);
    assert_eq!((code, &report["gpus"][0]["temperature_c"]), (0, &Value::Null));
}

#[test]
fn a_missing_driver_is_a_clear_error() {
    let s = Scenario::new("gpus = 1\n");
    for args in [
        vec!["verify", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
        vec!["run", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
        vec!["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"],
    ] {
        let out = s.agent(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        assert!(stderr.contains("no NVIDIA driver found (/nonexistent/libnvidia-ml.so.1): "), "{args:?}: {stderr}");
        assert!(stderr.contains("install the NVIDIA driver on this host, or run with --sim-gpus"), "{stderr}");
    }
    let (code, report) = verify_json("gpus = 1\n", &["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"]);
    assert_eq!(code, 2);
    assert_eq!(report["usable"], false);
    assert!(report["error"].as_str().expect("error").starts_with("no NVIDIA driver found"), "{report}");
}

#[test]
fn a_driver_that_refuses_to_start_is_a_clear_error() {
    for (scenario, expected) in [
        ("init = driver_not_loaded\n", "the NVIDIA driver is not loaded"),
        ("init = no_permission\n", "no permission to use the NVIDIA driver"),
    ] {
        let out = Scenario::new(scenario).agent(&["verify"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(expected), "{scenario}: {stderr}");
    }
}

#[test]
fn a_bad_policy_file_is_reported_before_any_gpu_is_read() {
    let s = Scenario::new("gpus = 1\n");
    let config = s.file("agent.toml", "[gpu]\nmin_pcie_width_fraction = 1.5\n");
    let out = s.agent(&["verify", "--config", config.to_str().expect("utf-8 path")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("[gpu] min_pcie_width_fraction: 1.5 is not a fraction between 0 and 1"), "{stderr}");
}

#[test]
fn the_example_config_is_valid_and_lenient_policies_apply() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/agent.example.toml");
    let s = Scenario::new("gpus = 1\ngpu.0.mig = 1\n");
    assert_eq!(s.agent(&["verify", "--config", example]).status.code(), Some(1), "MIG is not allowed by the example");
    let config = s.file("agent.toml", "[gpu]\nallow_mig = true\n");
    let out = s.agent(&["verify", "--config", config.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn a_misspelled_engines_key_stops_the_agent_before_it_starts() {
    let s = Scenario::new("gpus = 1\n");
    let config = s.file("agent.toml", "[engines]\nimages = [\"vllm/vllm-openai\"]\nproces = true\n");
    let work = s.file("work", "");
    std::fs::remove_file(&work).expect("a free path for the work directory");
    let config = config.to_str().expect("utf-8 path");
    let out = s.agent(&["--config", config, "--docker", "off", "--work-dir", work.to_str().expect("utf-8 path")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("the agent config {config} is not valid")), "{stderr}");
    assert!(stderr.contains("unknown field `proces`"), "{stderr}");
}
