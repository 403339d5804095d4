//! `runs delete` as an operator runs it: through a controller and on the
//! local store, a run not over refused (exit 5), an unknown one (exit 4),
//! and the run's dataset file removed with the last run that names it.

use std::path::Path;
use std::time::{Duration, SystemTime};

use super::export::RunningController;
use super::{benchfleet, examples, text};

const WAITS: &str = "\
name: waits
model: m
hardware: { gpu: H200, gpus_per_job: 1 }
engines:
  vllm: { runtime: process }
profiles:
  p: { dataset: { random: { input_tokens: 8, output_tokens: 4 } }, requests: 10 }
";

fn ok(out: &std::process::Output, what: &str) -> String {
    assert!(out.status.success(), "{what} failed\nstdout:\n{}\nstderr:\n{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// The store's files, each dated as last used two hours ago.
fn stored_files_aged(store: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(store.join("files")).expect("files/") {
        let entry = entry.expect("entry");
        let f = std::fs::File::options().write(true).open(entry.path()).expect("open");
        f.set_modified(SystemTime::now() - Duration::from_secs(7200)).expect("dated");
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names
}

fn listed(out: &std::process::Output) -> Vec<String> {
    text(&out.stdout).lines().skip(1).filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
}

#[test]
fn runs_delete_removes_a_finished_run_and_refuses_one_still_running() {
    let data = tempfile::tempdir().expect("tempdir");
    let matrix = examples().join("quickstart.yaml");
    let run = benchfleet(data.path(), &["run", "--local", matrix.to_str().expect("utf-8 path")]);
    let stdout = text(&run.stdout);
    assert!(matches!(run.status.code(), Some(0 | 1)), "run --local failed:\n{stdout}\n{}", text(&run.stderr));
    let first = stdout.lines().find_map(|l| l.strip_prefix("run id: ")).expect("the run id is printed").to_owned();
    // Two more runs naming the same dataset file, from its export.
    let file = data.path().join("run.jsonl");
    ok(&benchfleet(data.path(), &["export", &first, "-o", file.to_str().expect("utf-8")]), "export");
    let copies: Vec<String> = (0..2)
        .map(|_| ok(&benchfleet(data.path(), &["import", file.to_str().expect("utf-8")]), "import").trim().to_owned())
        .collect();

    // Through a controller: a run it still schedules is refused.
    let store = data.path().join("store");
    let controller = RunningController::start(&store);
    let url = controller.url.clone();
    let remote = |args: &[&str]| {
        let mut all = vec!["--controller", url.as_str()];
        all.extend_from_slice(args);
        benchfleet(data.path(), &all)
    };
    let waits = data.path().join("waits.yaml");
    std::fs::write(&waits, WAITS).expect("matrix");
    let waiting = ok(&remote(&["submit", waits.to_str().expect("utf-8")]), "submit").trim().to_owned();
    let refused = remote(&["runs", "delete", &waiting]);
    assert_eq!(refused.status.code(), Some(5), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains(&format!("run {waiting} is still scheduled")), "{}", text(&refused.stderr));
    let deleted = ok(&remote(&["runs", "delete", &first]), "delete through the controller");
    assert!(deleted.starts_with(&format!("run {first} deleted: 4 jobs, ")), "{deleted}");
    assert!(!deleted.contains("file"), "two runs still name the dataset: {deleted}");
    assert!(!listed(&remote(&["runs"])).contains(&first));
    let gone = remote(&["report", &first]);
    assert_eq!(gone.status.code(), Some(4), "{}", text(&gone.stderr));
    let again = remote(&["runs", "delete", &first]);
    assert_eq!(again.status.code(), Some(4), "{}", text(&again.stderr));
    assert!(text(&again.stderr).contains(&format!("run {first} not found")), "{}", text(&again.stderr));
    controller.stop();

    // On the local store: the same refusal, in words of the store.
    let refused = benchfleet(data.path(), &["runs", "delete", &waiting]);
    assert_eq!(refused.status.code(), Some(5), "{}", text(&refused.stderr));
    assert!(
        text(&refused.stderr)
            .contains(&format!("run {waiting} is still running; delete it once it has finished or been cancelled")),
        "{}",
        text(&refused.stderr)
    );
    let files = stored_files_aged(&store);
    assert_eq!(files.len(), 1, "the quickstart's dataset: {files:?}");
    let deleted = ok(&benchfleet(data.path(), &["runs", "delete", &copies[0]]), "delete");
    assert!(deleted.starts_with(&format!("run {} deleted: 4 jobs, ", copies[0])), "{deleted}");
    assert!(store.join("files").join(&files[0]).is_file(), "the last copy still names it");
    let last = ok(&benchfleet(data.path(), &["--json", "runs", "delete", &copies[1]]), "delete the last");
    let answer: serde_json::Value = serde_json::from_str(&last).expect("json");
    assert_eq!(answer["run_id"].as_str(), Some(copies[1].as_str()));
    assert_eq!(answer["jobs"].as_u64(), Some(4));
    assert_eq!(answer["files"], serde_json::json!(files), "no run names it now");
    assert!(!store.join("files").join(&files[0]).exists());
    assert_eq!(listed(&benchfleet(data.path(), &["runs"])), [waiting]);
}
