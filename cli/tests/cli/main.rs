//! The `benchfleet` binary as an operator runs it: `run --local` on the
//! example matrix with the real simulator and loadgen binaries, `runs` and
//! `report` read back from the store, bad matrices rejected with nothing
//! stored, runs exported and imported (`export`), runs deleted (`delete`),
//! and the exit codes of what the controller or the store refuses (`exit`).

mod delete;
mod exit;
mod export;
mod inputs;
mod sessions;
mod studies;
mod trace;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn benchfleet(data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_benchfleet"))
        .args(args)
        .env("BENCHFLEET_DATA_DIR", data_dir)
        .env_remove("BENCHFLEET_CONTROLLER")
        .output()
        .expect("benchfleet runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// A copy of examples/ to write matrices into beside the files they name:
/// no test writes into the checkout.
fn scratch_examples() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(examples()).expect("examples/") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            std::fs::copy(&path, dir.path().join(path.file_name().expect("a name"))).expect("copy");
        }
    }
    dir
}

#[test]
fn run_local_then_report_and_runs_read_the_store() {
    let data = tempfile::tempdir().expect("tempdir");
    let matrix = examples().join("quickstart.yaml");
    let out = benchfleet(data.path(), &["run", "--local", matrix.to_str().expect("utf-8 path")]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "run --local failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(stdout.matches("============ Serving Benchmark Result ============").count(), 4, "{stdout}");
    assert!(stderr.contains(&format!("data directory: {}", data.path().display())), "{stderr}");
    assert!(stderr.contains("jobs 4/4 done, 0 failed"), "{stderr}");
    let run_id = stdout.lines().find_map(|l| l.strip_prefix("run id: ")).expect("the run id is printed").to_owned();

    // The report read back from the store is the one printed at the end.
    let report = benchfleet(data.path(), &["report", &run_id]);
    assert_eq!(report.status.code(), out.status.code(), "report says what run said: {}", text(&report.stderr));
    let printed = stdout.strip_suffix(&format!("run id: {run_id}\n")).expect("run id is last");
    assert_eq!(text(&report.stdout), printed);

    let runs = benchfleet(data.path(), &["runs"]);
    let listing = text(&runs.stdout);
    assert!(
        listing.lines().any(|l| l.starts_with(&run_id) && l.contains("quickstart") && l.contains("4/4")),
        "{listing}"
    );

    report_formats_and_compare(data.path(), &run_id);
}

/// Every format of a real run's report, and `compare` as a CI gate.
fn report_formats_and_compare(data: &Path, run_id: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let at = |name: &str| dir.path().join(name).to_str().expect("utf-8").to_owned();
    for (format, file) in [("markdown", "r.md"), ("json", "r.json"), ("csv", "r.csv"), ("html", "r.html")] {
        let out = benchfleet(data, &["report", run_id, "--format", format, "-o", &at(file)]);
        assert!(out.status.success(), "{format}: {}", text(&out.stderr));
        assert!(out.stdout.is_empty(), "{format} went to the file");
    }
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).expect("written");
    let md = read("r.md");
    assert!(md.contains("## Conclusion") && md.contains("```shell\nvllm serve Qwen/Qwen3.5-9B"), "{md}");
    assert_eq!(md.matches("Serving Benchmark Result").count(), 4, "{md}");
    let csv = read("r.csv");
    assert_eq!(csv.lines().count(), 5, "a header and a row per job:\n{csv}");
    let html = read("r.html");
    // A bar chart per profile, throughput against latency, the TTFT and
    // ITL distributions from the stored samples, and each configuration's
    // engine during its job on the primary profile (its /metrics), and the
    // GPUs' SM clocks there.
    assert_eq!(html.matches("<svg").count(), 8, "{html}");
    assert_eq!(html.matches("class=\"clock\"").count(), 2, "a line for each configuration: {html}");
    assert!(html.matches("class=\"telemetry\"").count() >= 4, "running and waiting, for each: {html}");
    assert_eq!(html.matches("class=\"distribution\"").count(), 4, "{html}");
    assert!(!html.contains("<script") && !html.contains("src="), "{html}");

    // --json is the JSON format, to standard output.
    let json = benchfleet(data, &["--json", "report", run_id]);
    assert_eq!(text(&json.stdout), read("r.json"));
    let doc: serde_json::Value = serde_json::from_str(&read("r.json")).expect("json");
    assert_eq!(doc["schema"], "benchfleet.report/v1");

    // A run against itself, and against its own report file: no regression.
    for b in [run_id.to_owned(), at("r.json")] {
        let out = benchfleet(data, &["compare", run_id, &b]);
        assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
        assert!(text(&out.stdout).contains("No significant regression."), "{}", text(&out.stdout));
    }
    // B slower on one block. One repeat each: the interval is the run's own
    // requests' (a few dozen requests: tens of percent), so 20% slower is
    // within its noise, and 70% slower a regression, exit 1.
    let slower_by = |factor: f64, name: &str| {
        let mut slower = doc.clone();
        let repeat = &mut slower["configurations"][0]["blocks"][0]["repeats"][0]["summary"];
        let tps = repeat["total_token_throughput"].as_f64().expect("a number");
        repeat["total_token_throughput"] = serde_json::json!(tps * factor);
        std::fs::write(dir.path().join(name), slower.to_string()).expect("write");
        at(name)
    };
    let out = benchfleet(data, &["compare", run_id, &slower_by(0.8, "slower.json"), "--threshold", "5%"]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("-20.00% ±") && said.contains("(one run each)  within noise"), "{said}");
    let out = benchfleet(data, &["compare", run_id, &slower_by(0.3, "much-slower.json"), "--threshold", "5%"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("REGRESSION"), "{}", text(&out.stdout));
    // Above the threshold it is not.
    let out = benchfleet(data, &["compare", run_id, &at("much-slower.json"), "--threshold", "75%"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));

    reproduce_a_block(&doc);

    // A run that does not exist: exit 4.
    let out = benchfleet(data, &["compare", run_id, "999"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("run 999 not found"), "{}", text(&out.stderr));

    // Bad input: exit 2, saying what was wrong.
    let mut other = doc.clone();
    other["schema"] = serde_json::json!("benchfleet.report/v0");
    std::fs::write(dir.path().join("other.json"), other.to_string()).expect("write");
    std::fs::write(dir.path().join("junk.json"), "{ not json").expect("write");
    for (args, says) in [
        (vec!["report", run_id, "--format", "pdf"], "unknown report format \"pdf\""),
        (vec!["compare", run_id, &at("other.json")], "has schema \"benchfleet.report/v0\""),
        (vec!["compare", run_id, &at("junk.json")], "is not a JSON report"),
        (vec!["compare", run_id, run_id, "--threshold", "lots"], "not a number"),
        (vec!["compare", run_id, run_id, "--metric", "speed"], "unknown metric \"speed\""),
    ] {
        let out = benchfleet(data, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(says), "{args:?}: {}", text(&out.stderr));
    }
}

#[test]
fn bad_matrices_are_rejected_naming_the_field_and_nothing_is_stored() {
    let data = tempfile::tempdir().expect("tempdir");
    let good = std::fs::read_to_string(examples().join("quickstart.yaml")).expect("example");
    let cases = [
        (good.replace("    rate: 20", "    rte: 20"), "profiles.random: unknown field `rte`"),
        (good.replace("    rate: 20", "    rate: -20"), "profiles.random.rate: must be a positive number"),
        (good.replace("sharegpt-small.json", "nowhere.json"), "profiles.sharegpt.dataset.sharegpt: cannot read"),
        (format!("{good}primary_profile: long\n"), "primary_profile: no profile named 'long'"),
        (
            good.replace("[--max-model-len=8192]", "[--max-model-len=8192, --tensor-parallel-size=2]"),
            "engines.vllm.args: vllm asks for 2 GPUs (--tensor-parallel-size=2) but a job gets 1",
        ),
    ];
    let scratch = scratch_examples();
    for (yaml, expected) in cases {
        let path = scratch.path().join("bad.yaml");
        std::fs::write(&path, yaml).expect("write matrix");
        let out = benchfleet(data.path(), &["run", "--local", path.to_str().expect("utf-8 path")]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(expected), "expected {expected:?} in:\n{stderr}");
    }
    let runs = benchfleet(data.path(), &["runs"]);
    assert_eq!(text(&runs.stdout).lines().count(), 1, "only the header: {}", text(&runs.stdout));
}

/// Local mode's one host has the GPUs a job asks for, and each engine is
/// given them: tensor parallelism over two runs there as on a fleet.
#[test]
fn run_local_gives_its_host_the_gpus_a_job_asks_for() {
    let data = tempfile::tempdir().expect("tempdir");
    let good = std::fs::read_to_string(examples().join("quickstart.yaml")).expect("example");
    let scratch = scratch_examples();
    let matrix = scratch.path().join("tp2.yaml");
    let tp2 = good
        .replace("gpus_per_job: 1", "gpus_per_job: 2")
        .replace("[--max-model-len=8192]", "[--max-model-len=8192, --tensor-parallel-size=2]")
        .replace("requests: 60", "requests: 6")
        .replace("requests: 40", "requests: 4");
    std::fs::write(&matrix, tp2).expect("write matrix");
    let mut child = spawn_run_local(data.path(), &matrix);
    // A host without the job's GPUs would leave the run waiting: bounded, not hung.
    let status = exit_within(&mut child, 120);
    let stderr = stderr_of(&mut child);
    let status = status.unwrap_or_else(|| panic!("run --local did not finish within 120 s:\n{stderr}"));
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("jobs 4/4 done, 0 failed"), "{stderr}");
}

/// `benchfleet run --local MATRIX` in the background, its stderr piped.
fn spawn_run_local(data_dir: &Path, matrix: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_benchfleet"))
        .args(["run", "--local", matrix.to_str().expect("utf-8 path")])
        .env("BENCHFLEET_DATA_DIR", data_dir)
        .env_remove("BENCHFLEET_CONTROLLER")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("benchfleet runs")
}

/// The child's exit status once it exits, or `None` (and the child killed)
/// after `seconds`: a bound against a hang, not a measure of speed.
fn exit_within(child: &mut std::process::Child, seconds: u64) -> Option<std::process::ExitStatus> {
    for _ in 0..seconds * 20 {
        if let Some(status) = child.try_wait().expect("wait") {
            return Some(status);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

fn stderr_of(child: &mut std::process::Child) -> String {
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr).expect("stderr");
    stderr
}

/// The pids the local agent's pid files name.
fn pids(data_dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("agent/pids")) else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path()).ok()?.split_whitespace().next()?.parse().ok())
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[test]
fn interrupting_run_local_stops_its_engines_and_loadgen_and_cancels_the_run() {
    let data = tempfile::tempdir().expect("tempdir");
    let good = std::fs::read_to_string(examples().join("quickstart.yaml")).expect("example");
    let scratch = scratch_examples();
    let long = scratch.path().join("long.yaml");
    std::fs::write(&long, good.replace("requests: 60", "requests: 6000")).expect("write matrix");
    let mut child = spawn_run_local(data.path(), &long);
    // Until an engine and loadgen run.
    let mut running = Vec::new();
    for _ in 0..600 {
        running = pids(data.path());
        if running.len() >= 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(running.len() >= 2, "an engine and loadgen never started: {running:?}");
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("a pid");
    rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("signalled");
    let status = exit_within(&mut child, 20).unwrap_or_else(|| panic!("benchfleet did not exit within 20 s of SIGINT"));
    let stderr = stderr_of(&mut child);
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted: stopping the engines and loadgen"), "{stderr}");
    let left: Vec<u32> = running.iter().copied().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "processes outlived benchfleet: {left:?}");
    assert!(pids(data.path()).is_empty(), "pid files left");
    let runs = benchfleet(data.path(), &["runs"]);
    assert!(
        text(&runs.stdout).lines().any(|l| l.starts_with("1 ") && l.contains("cancelled")),
        "{}",
        text(&runs.stdout)
    );
}

/// The report's "reproduce this block" command, run as a user would: in
/// the matrix's directory, against a simulated engine started with the
/// block's serve command, it sends the same load (in a copy of that
/// directory: what it writes stays out of the checkout).
fn reproduce_a_block(doc: &serde_json::Value) {
    let bin = Path::new(env!("CARGO_BIN_EXE_benchfleet")).parent().expect("the binaries' directory").to_owned();
    let scratch = scratch_examples();
    for block in doc["configurations"][0]["blocks"].as_array().expect("blocks") {
        let repeat = &block["repeats"][0];
        let command = repeat["provenance"]["reproduce"].as_str().expect("a reproduce command");
        let requests = repeat["summary"]["successful"].as_u64().expect("successful");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a port").local_addr().expect("addr").port();
        let serve = doc["configurations"][0]["serve_command"].as_str().expect("serve command");
        let mut engine = Command::new(bin.join("benchfleet-sim"))
            .args(serve.split(' '))
            .args(["--host", "127.0.0.1", "--port", &port.to_string(), "--sim-startup-ms", "0", "--sim-speedup", "10"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the simulator starts");
        let url = format!("http://127.0.0.1:{port}");
        let up = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(up, "the simulator did not listen on {url}");
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let out = Command::new("sh")
            .args(["-c", command])
            .current_dir(scratch.path())
            .env("ENGINE_URL", &url)
            .env("PATH", path)
            .output()
            .expect("sh runs");
        let _ = engine.kill();
        let _ = engine.wait();
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{command}\n{stdout}{}", text(&out.stderr));
        let successful = format!("Successful requests:                     {requests}\n");
        assert!(stdout.contains(&successful), "{command}\n{stdout}");
    }
}

/// `run --local` on a matrix of `yaml` (in a data directory of its own):
/// what it printed, and its JSON report.
fn run_local_json(yaml: &str) -> (String, serde_json::Value) {
    run_local_json_with(yaml, &[])
}

/// `run_local_json` with files beside the matrix, by name and content.
fn run_local_json_with(yaml: &str, files: &[(&str, &str)]) -> (String, serde_json::Value) {
    let (data, run_id, stdout) = run_local_kept(yaml, files);
    let json = benchfleet(data.path(), &["report", &run_id, "--json"]);
    (stdout, serde_json::from_slice(&json.stdout).expect("a JSON report"))
}

/// Runs `yaml` with `run --local` in a data directory kept for more
/// commands: the directory, the run's id and what the run printed.
fn run_local_kept(yaml: &str, files: &[(&str, &str)]) -> (tempfile::TempDir, String, String) {
    let data = tempfile::tempdir().expect("tempdir");
    let matrix = data.path().join("matrix.yaml");
    std::fs::write(&matrix, yaml).expect("matrix");
    for (name, content) in files {
        std::fs::write(data.path().join(name), content).expect("a file beside the matrix");
    }
    let out = benchfleet(data.path(), &["run", "--local", matrix.to_str().expect("utf-8 path")]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "run --local failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    let run_id = stdout.lines().find_map(|l| l.strip_prefix("run id: ")).expect("the run id is printed").to_owned();
    (data, run_id, stdout)
}

/// A search profile run by `run --local` with the real simulator and
/// loadgen: each round of probes is planned from the stored results, every
/// probe is a job with its block, and the report gives the rate found.
#[test]
fn a_search_profile_finds_the_highest_rate_within_its_slos_on_real_engines() {
    let (stdout, doc) = run_local_json(
        "name: capacity\nmodel: Qwen/Qwen3.5-9B\nhardware: { gpu: H200 }\nengines:\n  \
         vllm: { image: vllm/vllm-openai:v0.17.1, args: [--max-model-len=8192] }\nprofiles:\n  chat:\n    \
         dataset: { random: { input_tokens: 3072, output_tokens: 128, seed: 42 } }\n    requests: 40\n    \
         search: { rate: [4, 32], steps: 1, slo: { ttft_p99_ms: 1500 } }\n",
    );
    assert!(stdout.contains("## SLO search: chat"), "{stdout}");
    let result = &doc["searches"][0]["results"][0];
    assert_eq!(result["done"], true, "{result:#}");
    let probes = result["probes"].as_array().expect("probes");
    let points: Vec<f64> = probes.iter().map(|p| p["point"].as_f64().expect("a point")).collect();
    // The bounds first, then one step between them (a 3072-token prompt
    // every 250 ms is light for the simulated H200; eight a second every
    // 31 ms is not).
    assert_eq!(points, [4.0, 32.0, 18.0], "{result:#}");
    assert_eq!(probes[0]["held"], true, "{result:#}");
    assert_eq!(probes[1]["held"], false, "{result:#}");
    let found = result["found"].as_f64().expect("a rate found");
    let expected = if probes[2]["held"] == true { (18.0, 32.0) } else { (4.0, 18.0) };
    assert_eq!((found, result["missed_at"].as_f64().expect("a rate missed")), expected, "{result:#}");
    // Every probe is a job of its own, with its block of 40 requests.
    let blocks = doc["configurations"][0]["blocks"].as_array().expect("blocks");
    for p in probes {
        let block = blocks.iter().find(|b| b["profile"] == p["profile"]).expect("the probe's block");
        assert_eq!(block["pooled"]["successful"], 40, "{block:#}");
    }
    assert_eq!(doc["run"]["jobs_total"], 3);
    assert_eq!(doc["recommendation"]["config"], "vllm");
}

/// The engine's prefix cache over each job, from its counters read before
/// the first request and after the last, on the real simulator and loadgen:
/// two shared prefixes of 1,024 tokens and suffixes of 64 make every
/// request after the first of its group find its prefix cached (a
/// transformer's cache holds whole blocks of 16 tokens; a hybrid model like
/// Qwen3.5 would find only what its states, saved at its 528-token blocks'
/// step ends, allow). With a price, the block's cost is its GPU-hour over
/// its tokens.
#[test]
fn a_job_s_prefix_cache_hit_rate_and_cost_are_its_own() {
    let (stdout, doc) = run_local_json(
        "name: prefix\nmodel: Qwen/Qwen3-8B\nhardware: { gpu: H200 }\nengines:\n  \
         vllm: { image: vllm/vllm-openai:v0.17.1, args: [--max-model-len=8192, --enable-prefix-caching] }\nprofiles:\n  shared:\n    \
         dataset: { shared_prefix: { groups: 2, prefix_tokens: 1024, suffix_tokens: 64, output_tokens: 16, seed: 1 } }\n    \
         rate: 20\n    requests: 60\ncost: { gpu_hour: 4 }\n",
    );
    let block = &doc["configurations"][0]["blocks"][0];
    // 58 of 60 requests find their 1,024-token prefix: 58 x 1,024 of 60 x 1,088.
    let expected = 58.0 * 1024.0 / (60.0 * 1088.0);
    let rate = block["prefix_cache_hit_rate"].as_f64().expect("a hit rate");
    assert!((rate - expected).abs() < 0.005, "{rate} against {expected}: {block:#}");
    assert!(stdout.contains(&format!("Prefix cache hit rate (%):               {:.2}", rate * 100.0)), "{stdout}");
    let pooled = &block["pooled"];
    let hours = pooled["duration_s"].as_f64().expect("duration") / 3600.0;
    let output = pooled["total_output_tokens"].as_f64().expect("tokens");
    let per_million = block["cost"]["per_million_output"].as_f64().expect("a cost");
    assert!((per_million - hours * 4.0 / output * 1e6).abs() < 1e-9 * per_million, "{block:#}");
}

#[test]
fn the_reference_study_matrices_validate_beside_a_sharegpt_file() {
    let dir = scratch_examples();
    // The studies name the reports' ShareGPT file; any usable one stands in for it here.
    let conversation =
        r#"{"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello"}]}"#;
    std::fs::write(dir.path().join("ShareGPT_V3_unfiltered_cleaned_split.json"), format!("[{conversation}]"))
        .expect("write");
    let data = tempfile::tempdir().expect("tempdir");
    for (file, said) in [
        ("study-35b-a3b-h200-throughput.yaml", "greedy strategy, 2 engines, 5 variants, 4 profiles"),
        ("study-9b-h100-throughput.yaml", "greedy strategy, 2 engines, 11 variants, 4 profiles"),
        ("study-9b-h100-latency.yaml", "greedy strategy, 2 engines, 8 variants, 4 profiles"),
    ] {
        let path = dir.path().join(file);
        let out = benchfleet(data.path(), &["validate", path.to_str().expect("utf-8 path")]);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success() && stdout.contains(said), "{file}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    }
}
