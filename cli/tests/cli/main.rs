//! The `benchfleet` binary as an operator runs it: `run --local` on the
//! example matrix with the real simulator and loadgen binaries, `runs` and
//! `report` read back from the store, and bad matrices rejected with nothing
//! stored.

mod inputs;

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

#[test]
fn run_local_then_report_and_runs_read_the_store() {
    let data = tempfile::tempdir().expect("tempdir");
    let matrix = examples().join("quickstart.yaml");
    let out = benchfleet(data.path(), &["run", "--local", matrix.to_str().expect("utf-8 path")]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    // Exit 1 with every job done is the report recommending nothing, which
    // a machine too busy for the client to keep its schedule (the primary
    // profile's blocks INVALID) rightly gives; anything else must succeed.
    let too_busy =
        out.status.code() == Some(1) && stdout.contains("## No recommendation") && stdout.contains("RUN INVALID");
    assert!(out.status.success() || too_busy, "run --local failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
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
    ];
    for (yaml, expected) in cases {
        let path = examples().join(format!("bad-{}.yaml", std::process::id()));
        std::fs::write(&path, yaml).expect("write matrix");
        let out = benchfleet(data.path(), &["run", "--local", path.to_str().expect("utf-8 path")]);
        let _ = std::fs::remove_file(&path);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(expected), "expected {expected:?} in:\n{stderr}");
    }
    let runs = benchfleet(data.path(), &["runs"]);
    assert_eq!(text(&runs.stdout).lines().count(), 1, "only the header: {}", text(&runs.stdout));
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
    let long = examples().join(format!("long-{}.yaml", std::process::id()));
    std::fs::write(&long, good.replace("requests: 60", "requests: 6000")).expect("write matrix");
    let mut child = Command::new(env!("CARGO_BIN_EXE_benchfleet"))
        .args(["run", "--local", long.to_str().expect("utf-8 path")])
        .env("BENCHFLEET_DATA_DIR", data.path())
        .env_remove("BENCHFLEET_CONTROLLER")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("benchfleet runs");
    // Until an engine and loadgen run.
    let mut running = Vec::new();
    for _ in 0..600 {
        running = pids(data.path());
        if running.len() >= 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = std::fs::remove_file(&long);
    assert!(running.len() >= 2, "an engine and loadgen never started: {running:?}");
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("a pid");
    rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("signalled");
    let mut status = None;
    for _ in 0..400 {
        if let Some(s) = child.try_wait().expect("wait") {
            status = Some(s);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let status = status.unwrap_or_else(|| {
        let _ = child.kill();
        panic!("benchfleet did not exit within 20 s of SIGINT")
    });
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr).expect("stderr");
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
