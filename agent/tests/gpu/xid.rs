//! XID events through the real nvml-wrapper: `verify --watch-xid-ms` watches
//! the fake NVML's event set, which delivers a scenario's XID once, a set
//! time after the GPU was registered.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::fake::Scenario;

/// The fake's UUID of GPU `index`.
fn uuid(index: u32) -> String {
    format!("GPU-fa4e0000-0000-0000-0000-{index:012}")
}

/// `verify --json --watch-xid-ms 1500` (plus `args`) on a scenario: the exit
/// code and the report. The window is wide so that a loaded machine still
/// receives an XID the scenario delivers 300 ms into it.
fn watch(scenario: &Scenario, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["--watch-xid-ms", "1500"];
    all.extend_from_slice(args);
    scenario.verify_json(&all)
}

/// The (GPU UUID, XID) of each event of the watch.
fn events(report: &Value) -> Vec<(String, u64)> {
    report["xid_watch"]["events"]
        .as_array()
        .expect("a list of events")
        .iter()
        .map(|e| (e["uuid"].as_str().expect("uuid").to_owned(), e["xid"].as_u64().expect("xid")))
        .collect()
}

#[test]
fn an_xid_during_the_watch_is_reported_with_its_gpu() {
    let scenario = Scenario::new("gpus = 2\ngpu.1.xid = 79\ngpu.1.xid_after_ms = 300\n");
    let (code, report) = watch(&scenario, &[]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["usable"], false);
    assert_eq!(events(&report), [(uuid(1), 79)]);
    assert_eq!(report["gpus"][0]["reasons"], json!([]));
    assert_eq!(report["gpus"][1]["reasons"], json!(["XID 79 during the watch"]));
    assert_eq!(report["xid_watch"]["unwatched"], json!([]));
    assert_eq!(report["xid_watch"]["watched_ms"], 1500);

    let out = scenario.agent(&["verify", "--watch-xid-ms", "1500"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("NOT usable: XID 79 during the watch"), "{text}");
    assert!(text.contains("1 of 2 GPUs usable\nXID events in 1500 ms: 1\n"), "{text}");
    assert!(text.contains(&format!("  XID 79 on GPU 1 ({}), ", uuid(1))), "{text}");
    assert!(text.ends_with(" ms into the watch\n"), "{text}");
}

#[test]
fn a_quiet_watch_reports_none_and_ends_promptly() {
    let scenario = Scenario::new("gpus = 2\n");
    let started = Instant::now();
    let out = scenario.agent(&["verify", "--watch-xid-ms", "200"]);
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.ends_with("2 of 2 GPUs usable\nXID events in 200 ms: none\n"), "{text}");
    // The watcher's thread stops within one wait of the probe being dropped.
    assert!(took < Duration::from_secs(10), "verify took {took:?}");

    let (code, report) = watch(&scenario, &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(
        report["xid_watch"],
        json!({
            "started_unix_ms": report["xid_watch"]["started_unix_ms"],
            "watched_ms": 1500,
            "events": [],
            "unwatched": [],
        })
    );
    // Without the option there is no watch in the report.
    let out = scenario.agent(&["verify", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report.get("xid_watch"), None, "{report:#}");
}

#[test]
fn a_gpu_without_xid_events_is_reported_unwatched_not_failed() {
    for line in ["gpu.1.event_types = 0x7", "gpu.1.event_types = unsupported"] {
        // It would throw an XID, but nothing can hear it.
        let scenario = Scenario::new(&format!("gpus = 2\ngpu.1.xid = 79\n{line}\n"));
        let (code, report) = watch(&scenario, &[]);
        assert_eq!(code, 0, "{line}: {report:#}");
        assert_eq!(
            report["xid_watch"]["unwatched"],
            json!([{ "index": 1, "uuid": uuid(1), "reason": "not supported by this GPU" }]),
            "{line}"
        );
        assert!(events(&report).is_empty(), "{line}");
    }
    let scenario = Scenario::new("gpus = 2\ngpu.1.event_types = 0x7\n");
    let out = scenario.agent(&["verify", "--watch-xid-ms", "100"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.ends_with(&format!(
            "XID events in 100 ms: none\nXID events not watched on GPU 1 ({}): not supported by this GPU\n",
            uuid(1)
        )),
        "{text}"
    );
}

#[test]
fn a_gpu_that_fails_to_register_leaves_the_others_watched() {
    // nvml-wrapper frees the event set when a registration fails: the
    // watcher builds it again without that GPU.
    let scenario = Scenario::new(
        "gpus = 3\ngpu.0.events_register = error\ngpu.0.xid = 31\ngpu.2.xid = 48\ngpu.2.xid_after_ms = 300\n",
    );
    let (code, report) = watch(&scenario, &[]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(events(&report), [(uuid(2), 48)]);
    let unwatched = &report["xid_watch"]["unwatched"];
    assert_eq!(unwatched.as_array().map(Vec::len), Some(1), "{unwatched:#}");
    assert_eq!(unwatched[0]["uuid"], uuid(0));
    let reason = unwatched[0]["reason"].as_str().expect("reason");
    assert!(reason.starts_with("cannot register for XID events: "), "{reason}");
}

#[test]
fn the_policy_ignores_the_xids_it_lists() {
    let scenario = Scenario::new("gpus = 1\ngpu.0.xid = 43\ngpu.0.xid_after_ms = 300\n");
    let config = scenario.file("agent.toml", "[gpu]\nignore_xids = [43]\n");
    let (code, report) = watch(&scenario, &["--config", config.to_str().expect("utf-8 path")]);
    assert_eq!(code, 0, "{report:#}");
    assert!(events(&report).is_empty(), "{report:#}");
    // The same XID counts without that policy.
    let (code, report) = watch(&scenario, &[]);
    assert_eq!((code, events(&report)), (1, vec![(uuid(0), 43)]));
}
