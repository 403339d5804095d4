//! The real NVML of a GPU host: the same code paths as the fake ones, against
//! the driver. Run with `cargo test -p benchfleet-agent --test gpu -- --ignored`.

use benchfleet_agent::nvml::NvmlProbe;
use benchfleet_agent::verdict::Policy;

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_driver_reports_every_gpu_with_its_inventory() {
    let probe = NvmlProbe::new(None, Policy::default()).expect("NVML starts on a GPU host");
    let gpus = probe.inventory().expect("the GPUs can be listed");
    assert!(!gpus.is_empty(), "no GPU found");
    for g in &gpus {
        assert!(g.name.starts_with("NVIDIA "), "{g:#?}");
        assert!(g.uuid.starts_with("GPU-"), "{g:#?}");
        assert!(g.memory_total_bytes > 0, "{g:#?}");
        assert!(!g.driver_version.is_empty() && g.cuda_driver_version.contains('.'), "{g:#?}");
        assert!(g.sm_clock_max_mhz.is_some() && g.pcie_width_max.is_some(), "{g:#?}");
        assert!(g.processes.is_some(), "{g:#?}");
        assert!(g.unreadable.is_empty(), "a query failed on a real GPU: {:?}", g.unreadable);
        println!("{} {}: {}", g.index, g.fingerprint(), if g.reasons.is_empty() { "usable" } else { "judged later" });
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn verify_reads_the_real_driver() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_benchfleet-agent"))
        .args(["verify", "--json"])
        .env_remove("BENCHFLEET_NVML_LIB")
        .env_remove("BENCHFLEET_AGENT_CONFIG")
        .output()
        .expect("run benchfleet-agent verify");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // 0 or 1 both mean the GPUs were read; 2 means they could not be.
    assert!(matches!(out.status.code(), Some(0 | 1)), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    println!("{report:#}");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_driver_delivers_xid_events_of_every_gpu() {
    use benchfleet_agent::gpu::GpuProbe;

    let probe = NvmlProbe::new(None, Policy::default()).expect("NVML starts on a GPU host");
    // Data-centre GPUs support XID events; one that is not watched is a
    // registration the watcher got wrong.
    assert_eq!(probe.xid_unwatched(), [], "GPUs whose XID events are not watched");
    let mark = probe.xid_mark();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // A healthy idle host reports none; if one does, show it.
    for e in probe.xid_events_after(mark) {
        println!("XID {} on GPU {}", e.xid, e.uuid);
    }
    // Dropping the probe stops the watcher within one wait.
    let started = std::time::Instant::now();
    drop(probe);
    assert!(started.elapsed() < std::time::Duration::from_secs(2), "the watcher took {:?} to stop", started.elapsed());
}
