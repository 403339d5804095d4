//! The `benchfleet` binary as an operator runs it: `run --local` on the
//! example matrix with the real simulator and loadgen binaries, `runs` and
//! `report` read back from the store, and bad matrices rejected with nothing
//! stored.

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
    assert!(out.status.success(), "run --local failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(stdout.matches("============ Serving Benchmark Result ============").count(), 4, "{stdout}");
    assert!(stderr.contains(&format!("data directory: {}", data.path().display())), "{stderr}");
    assert!(stderr.contains("jobs 4/4 done, 0 failed"), "{stderr}");
    let run_id = stdout.lines().find_map(|l| l.strip_prefix("run id: ")).expect("the run id is printed").to_owned();

    // The report read back from the store is the one printed at the end.
    let report = benchfleet(data.path(), &["report", &run_id]);
    assert!(report.status.success(), "{}", text(&report.stderr));
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
