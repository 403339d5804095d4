//! A job's telemetry and engine lifecycle facts, as the store keeps them:
//! through the in-process fleet (simulated engines of both kinds, simulated
//! GPUs), and through the real binaries with the agent reading a fake
//! `libnvidia-ml.so`: an SM clock that drops under a power cap mid-job, and
//! GPU energy counters, one running at a known power and one missing.

use std::path::{Path, PathBuf};
use std::process::Command;

use benchfleet_controller::{SledStore, Store};
use benchfleet_study::model::{AttemptKey, Job, JobState, RunId};

use crate::faults::{Controller, Proc, bin, finished, submit};

/// A matrix of one profile (`requests` at 50/s) on each of `engines`
/// (YAML lines of the `engines` map).
fn matrix(dir: &Path, engines: &str, requests: u32) -> PathBuf {
    let yaml = format!(
        "name: telemetry
model: Qwen/Qwen3.5-9B
hardware: {{ gpu: H200, gpus_per_job: 1 }}
engines:
{engines}profiles:
  load:
    dataset: {{ random: {{ input_tokens: 64, output_tokens: 32, seed: 1 }} }}
    rate: 50
    requests: {requests}
"
    );
    let path = dir.join("telemetry.yaml");
    std::fs::write(&path, yaml).expect("the matrix is written");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_keeps_its_metrics_gpu_readings_engine_version_and_loadgen_command() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (fleet, store) = crate::fleet::start(dir.path()).await?;
    // SGLang serves no /metrics without --enable-metrics: every scrape fails, the job does not.
    let engines = "  vllm: { runtime: process, args: [--max-model-len=4096] }\n  \
                   sglang: { runtime: process, args: [--context-length=4096] }\n";
    let (run_id, run) = crate::fleet::run_matrix(&fleet.url, &matrix(dir.path(), engines, 150), None).await?;
    fleet.stop().await;
    assert_eq!((run.jobs_done, run.jobs_failed), (2, 0), "{run:?}");
    let run: RunId = run_id.parse().map_err(anyhow::Error::msg)?;
    let groups = store.groups(run)?;
    for job in store.jobs(run)? {
        let kind = groups.iter().find(|g| g.id == job.group).map(|g| g.config.engine.clone()).unwrap_or_default();
        assert_eq!(job.state, JobState::Succeeded, "{kind}: {job:?}");
        assert_eq!(job.engine_version.as_deref(), Some(benchfleet_sim::ENGINE_VERSION), "{kind}");
        assert_eq!(job.image_digest, None, "{kind}: no image without Docker");
        assert_eq!(job.loadgen_version, Some(format!("benchfleet-loadgen {}", env!("CARGO_PKG_VERSION"))));
        let args = &job.loadgen_args;
        for flag in ["--base-url", "--model", "--num-prompts", "--report-to", "--run-id"] {
            assert!(args.iter().any(|a| a == flag), "{kind}: {flag} in {args:?}");
        }
        let command = job.loadgen_command().expect("a command");
        assert!(command.starts_with("benchfleet-loadgen --base-url http://127.0.0.1:"), "{command}");

        let t = job.telemetry.as_ref().unwrap_or_else(|| panic!("{kind}: the job's telemetry summary"));
        let uuid = job.gpu_fingerprint.first().and_then(|f| f.split(" uuid=").nth(1)).and_then(|f| f.split(' ').next());
        let uuid = uuid.expect("the GPU's uuid in its fingerprint");
        assert!(t.gpu_samples >= 4 && t.gpu_sample_failures == 0, "{kind}: {t:?}");
        assert!(t.stats("gpu_sm_clock_mhz", uuid).is_some_and(|s| s.count == t.gpu_samples), "{kind}: {t:?}");
        assert!(t.peak_gpu_memory_bytes.is_some_and(|b| b > 0), "{kind}: {t:?}");
        assert!(job.throttle_flags().is_empty(), "{kind}: {:?}", job.throttle_flags());
        let series = store.telemetry(&AttemptKey { run, job: job.id, attempt: job.attempt })?.expect("the series");
        assert!(series.iter().any(|s| s.name == "gpu_power_w" && s.gpu == uuid && !s.points.is_empty()), "{kind}");
        assert!(t.engine_scrapes >= 2, "{kind}: {t:?}");
        // A simulated GPU draws 75 W idle, up to about 606 W busy (give or take
        // the timing of the two readings).
        let tokens = job.summary.as_ref().map_or(0, |s| s.total_output_tokens);
        let energy = t.energy(tokens).unwrap_or_else(|| panic!("{kind}: the job's energy: {t:?}"));
        assert!((70.0..=620.0).contains(&energy.mean_power_w), "{kind}: {energy:?}");
        if kind == "sglang" {
            assert_eq!(t.engine_scrape_failures, t.engine_scrapes, "{kind}: {t:?}");
            assert_eq!(t.engine_scrape_error.as_deref(), Some("GET /metrics answered 404 Not Found"));
            assert!(series.iter().all(|s| !s.gpu.is_empty()), "{kind}: only GPU series");
            continue;
        }
        assert_eq!(t.engine_scrape_failures, 0, "{kind}: {t:?}");
        let running = t.stats("vllm:num_requests_running", "").expect("running requests");
        assert!(running.count == t.engine_scrapes && running.max > 0.0, "{kind}: {running:?}");
        // The simulated GPU was busy while its engine was.
        assert!(t.stats("gpu_utilization_pct", uuid).is_some_and(|s| s.max > 0.0), "{kind}: {t:?}");
        // The counters are read once before the first request and once
        // after the last: their increase is the job's own, every token of it.
        let generated = t.stats("vllm:generation_tokens_total", "").expect("generated tokens");
        assert_eq!(generated.last - generated.first, tokens as f64, "{kind}: {generated:?}");
        assert!(t.prefix_cache().is_some_and(|(_, queries)| queries > 0.0), "{kind}: {t:?}");
        let kept = series.iter().find(|s| s.name == "vllm:generation_tokens_total").expect("generated tokens");
        assert_eq!(kept.points.len() as u64, t.engine_scrapes);
        assert!(kept.points.windows(2).all(|w| w[0].1 <= w[1].1), "a counter never goes back: {kept:?}");
    }
    Ok(())
}

/// The fake NVML library, built from the agent's test source.
fn fake_nvml(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../agent/tests/fake-nvml/fake_nvml.c");
    let lib = dir.join("libnvidia-ml.so.1");
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&compiler)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
        .arg(&lib)
        .arg(&source)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{compiler}` to build the fake NVML: {e}"));
    assert!(status.success(), "`{compiler}` failed to build {}", source.display());
    lib
}

/// One job of `requests` at 50/s on a simulated vLLM engine, run by the
/// real agent binary reading the fake NVML with `scenario`: the store once
/// the run finished, and the job.
async fn one_job_on_fake_nvml(dir: &Path, scenario: &str, requests: u32) -> (SledStore, Job) {
    let lib = fake_nvml(dir);
    let scenario_file = dir.join("scenario");
    std::fs::write(&scenario_file, scenario).expect("the scenario is written");
    let c = Controller::start(dir);
    let work = dir.join("agent");
    let args: Vec<String> =
        ["--controller", &c.url(), "--name", "nvml", "--sim-engines", "--docker", "off", "--work-dir"]
            .iter()
            .map(|s| s.to_string())
            .chain([work.display().to_string()])
            .collect();
    let env = [("FAKE_NVML_CONFIG", scenario_file.as_path()), ("BENCHFLEET_NVML_LIB", lib.as_path())];
    let _agent = Proc::spawn_with(&bin("benchfleet-agent"), &args, &env, dir.join("agent.log"));
    let engines = "  vllm: { runtime: process, args: [--max-model-len=4096] }\n";
    let run = submit(&c.url(), &matrix(dir, engines, requests)).await.run_id;
    let done = finished(&c.url(), &run).await;
    assert_eq!((done.state.as_str(), done.jobs_succeeded), ("finished", 1), "{done:?}");
    let store = c.stop_and_open().await;
    let run: RunId = run.parse().expect("a run id");
    let job = store.jobs(run).expect("jobs").pop().expect("the job");
    (store, job)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_whose_clock_drops_under_a_power_cap_mid_job_is_flagged() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Busy at full clock, then 2 s into the job the power cap holds it at 1,410 MHz.
    let scenario = "gpus = 1\ngpu.*.sm_clock = 1980\ngpu.*.throttle = 0\ngpu.*.utilization = 95\n\
                    gpu.*.memory_used_mib = 70000\ngpu.0.sm_clock@2000 = 1410\ngpu.0.throttle@2000 = 0x4\n\
                    gpu.0.power_mw@2000 = 700000\n";
    let (store, job) = one_job_on_fake_nvml(dir.path(), scenario, 250).await;
    let flags = job.throttle_flags();
    let [flag] = flags.as_slice() else { panic!("one flag: {flags:?} {:?}", job.telemetry) };
    let share: u32 = flag
        .strip_prefix("SM clock 1,410 of 1,980 MHz for ")
        .and_then(|rest| rest.strip_suffix("% of the job: power cap"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("worded as a report shows it: {flag}"));
    assert!((10..=90).contains(&share), "the clock dropped mid-job: {flag}");
    let t = job.telemetry.as_ref().expect("the summary");
    assert!(t.gpus[0].throttled_ms.get("sw_power_cap").is_some_and(|ms| *ms > 0), "{t:?}");
    assert_eq!(job.peak_gpu_memory_bytes(), Some(70000 << 20));
    assert_eq!(job.loadgen_version, Some(format!("benchfleet-loadgen {}", env!("CARGO_PKG_VERSION"))));
    let series = store.telemetry(&job.key()).expect("read").expect("the series");
    let clock = series.iter().find(|s| s.name == "gpu_sm_clock_mhz").expect("the SM clock");
    let values: Vec<f64> = clock.points.iter().map(|p| p.1).collect();
    assert!(values.first() == Some(&1980.0) && values.last() == Some(&1410.0), "{values:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_s_gpu_energy_is_its_counter_s_increase_over_the_load_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The GPU's energy counter runs at 400 W.
    let (_store, job) = one_job_on_fake_nvml(dir.path(), "gpus = 1\ngpu.*.energy_w = 400\n", 200).await;
    let t = job.telemetry.as_ref().expect("the summary");
    let (joules, ms) = (t.energy_j.expect("the job's joules"), t.energy_duration_ms.expect("their window"));
    let expected = 400.0 * ms as f64 / 1000.0;
    assert!((joules - expected).abs() <= 0.01 * expected, "{joules} J over {ms} ms: 400 W gives {expected} J");
    assert!(t.gpus[0].energy_mj_start.is_some_and(|mj| mj >= 1_000_000_000), "{:?}", t.gpus);
    // The window is the load run's: loadgen's benchmark inside it, the
    // engine's startup outside.
    let summary = job.summary.as_ref().expect("loadgen's summary");
    let attempt = job.current().expect("the attempt");
    let attempt_ms = (attempt.ended_unix_ms.expect("ended") - attempt.started_unix_ms) as f64;
    let startup_ms = job.engine_startup_s.expect("the engine's startup") * 1000.0;
    assert!(summary.duration_s * 1000.0 <= ms as f64, "{ms} ms: {summary:?}");
    assert!(ms as f64 + startup_ms <= attempt_ms, "{ms} ms + startup {startup_ms} ms within {attempt_ms} ms");
    let e = t.energy(summary.total_output_tokens).expect("the job's energy figures");
    assert!((e.mean_power_w - 400.0).abs() <= 4.0, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_without_an_energy_counter_leaves_the_job_s_energy_unknown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_store, job) = one_job_on_fake_nvml(dir.path(), "gpus = 1\ngpu.*.energy_w = unsupported\n", 50).await;
    let t = job.telemetry.as_ref().expect("the summary");
    assert_eq!((t.energy_j, t.energy_duration_ms, t.gpus[0].energy_mj_start), (None, None, None), "{t:?}");
}
