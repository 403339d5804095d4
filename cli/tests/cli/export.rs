//! `export` and `import` as an operator runs them: a run of the quickstart
//! matrix (real simulator and loadgen) exported from one data directory,
//! imported into another and into a running controller, with the same
//! report everywhere and the same export back; bad files and an
//! unreachable controller refused with their exit codes.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use benchfleet_controller::store::{SledStore, Store};
use benchfleet_controller::{Controller, ControllerConfig, serve};

use super::{examples, text};

/// `benchfleet ARGS` on `data_dir`'s store, with `stdin` as its input.
fn benchfleet(data_dir: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_benchfleet"))
        .args(args)
        .env("BENCHFLEET_DATA_DIR", data_dir)
        .env_remove("BENCHFLEET_CONTROLLER")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("benchfleet runs");
    let mut input = child.stdin.take().expect("stdin");
    // A command that does not read its input may close it first.
    let _ = input.write_all(stdin);
    drop(input);
    child.wait_with_output().expect("benchfleet ends")
}

fn ok(out: &Output, what: &str) -> String {
    assert!(out.status.success(), "{what} failed\nstdout:\n{}\nstderr:\n{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// A controller serving `dir`'s store on a free loopback port, in this
/// process.
pub(super) struct RunningController {
    runtime: tokio::runtime::Runtime,
    pub(super) url: String,
    stop: tokio_util::sync::CancellationToken,
    serving: tokio::task::JoinHandle<()>,
}

impl RunningController {
    pub(super) fn start(dir: &Path) -> RunningController {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone();
        let (url, serving) = runtime.block_on(async move {
            let store: Arc<dyn Store> = Arc::new(SledStore::open(dir).expect("store"));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let url = format!("http://{}", listener.local_addr().expect("addr"));
            let controller = Controller::start(store, ControllerConfig::new(&url)).expect("controller");
            let serving = tokio::spawn(async move {
                serve(controller, listener, stopped.cancelled_owned()).await.expect("serves");
            });
            (url, serving)
        });
        RunningController { runtime, url, stop, serving }
    }

    pub(super) fn stop(self) {
        self.stop.cancel();
        self.runtime.block_on(self.serving).expect("stopped");
    }
}

#[test]
fn a_run_exported_and_imported_elsewhere_reports_the_same() {
    let (a, b, c) = (tempfile::tempdir().expect("a"), tempfile::tempdir().expect("b"), tempfile::tempdir().expect("c"));
    let matrix = examples().join("quickstart.yaml");
    let run = benchfleet(a.path(), &["run", "--local", matrix.to_str().expect("utf-8 path")], b"");
    let stdout = text(&run.stdout);
    assert!(matches!(run.status.code(), Some(0 | 1)), "run --local failed:\n{stdout}\n{}", text(&run.stderr));
    let id = stdout.lines().find_map(|l| l.strip_prefix("run id: ")).expect("the run id is printed").to_owned();
    let original = benchfleet(a.path(), &["report", &id], b"");

    // From one data directory to a fresh one: the same id, the same report.
    let file = a.path().join("run.jsonl");
    let shown = file.to_str().expect("utf-8 path");
    let exported = benchfleet(a.path(), &["export", &id, "-o", shown], b"");
    ok(&exported, "export");
    assert!(text(&exported.stderr).contains(&format!("run {id} exported to {shown}: 2 groups, 4 jobs")));
    assert!(!a.path().join("run.jsonl.partial").exists(), "no partial file is left");
    let bytes = std::fs::read(&file).expect("the export");
    assert!(bytes.starts_with(b"{\"kind\":\"benchfleet-export\",\"format\":1,"), "{}", text(&bytes[..200]));
    let imported = benchfleet(b.path(), &["import", shown], b"");
    assert_eq!(ok(&imported, "import"), format!("{id}\n"));
    assert!(text(&imported.stderr).contains(&format!("imported as run {id}: 2 groups, 4 jobs")));
    let copy = benchfleet(b.path(), &["report", &id], b"");
    assert_eq!((text(&copy.stdout), copy.status.code()), (text(&original.stdout), original.status.code()));
    assert!(text(&copy.stdout).contains("Serving Benchmark Result"), "{}", text(&copy.stdout));
    assert_eq!(ok(&benchfleet(b.path(), &["export", &id], b""), "export to stdout").as_bytes(), bytes);

    // Into a running controller, from the file and from stdin: the second
    // gets the next id.
    let controller = RunningController::start(&c.path().join("store"));
    let url = controller.url.clone();
    let remote = |args: &[&str], stdin: &[u8]| {
        let mut all = vec!["--controller", url.as_str()];
        all.extend_from_slice(args);
        benchfleet(c.path(), &all, stdin)
    };
    assert_eq!(ok(&remote(&["import", shown], b""), "import to the controller"), format!("{id}\n"));
    let again = remote(&["--json", "import", "-"], &bytes);
    let answer: serde_json::Value = serde_json::from_str(&ok(&again, "import from stdin")).expect("json");
    let next = (id.parse::<u64>().expect("a number") + 1).to_string();
    assert_eq!((answer["run_id"].as_str(), answer["original_run_id"].as_str()), (Some(&*next), Some(&*id)));
    let report = remote(&["report", &id], b"");
    assert_eq!((text(&report.stdout), report.status.code()), (text(&original.stdout), original.status.code()));
    let renumbered = text(&remote(&["report", &next], b"").stdout);
    let rest = |t: &str| t.split_once('\n').map(|(_, rest)| rest.to_owned());
    assert_eq!(rest(&renumbered), rest(&text(&original.stdout)));
    assert!(renumbered.starts_with(&format!("Run {next}: quickstart")), "{renumbered}");
    assert_eq!(ok(&remote(&["export", &id], b""), "export from the controller").as_bytes(), bytes);
    let streamed = c.path().join("streamed.jsonl");
    ok(&remote(&["export", &id, "-o", streamed.to_str().expect("utf-8")], b""), "export to a file");
    assert_eq!(std::fs::read(&streamed).expect("written"), bytes);

    // Bad files: the line named with the file, exit 2, nothing stored.
    let cut = c.path().join("cut.jsonl");
    let lines = bytes.split_inclusive(|b| *b == b'\n').count();
    std::fs::write(&cut, bytes.split_inclusive(|b| *b == b'\n').take(lines - 1).flatten().copied().collect::<Vec<_>>())
        .expect("write");
    let refused = remote(&["import", cut.to_str().expect("utf-8")], b"");
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    let said = text(&refused.stderr);
    assert!(
        said.contains(&format!(
            "{}: the file ends after line {} without the export's trailer",
            cut.display(),
            lines - 1
        )),
        "{said}"
    );
    let corrupt =
        String::from_utf8(bytes.clone()).expect("utf-8").replacen("{\"kind\":\"job\"", "{\"kind\":\"jbo\"", 1);
    let refused = benchfleet(b.path(), &["import", "-"], corrupt.as_bytes());
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert!(
        text(&refused.stderr).contains("error: standard input: line 5: unknown kind 'jbo'"),
        "{}",
        text(&refused.stderr)
    );
    let listed = |out: Output| text(&out.stdout).lines().skip(1).count();
    assert_eq!(listed(remote(&["runs"], b"")), 2, "the controller holds the two good imports only");
    assert_eq!(listed(benchfleet(b.path(), &["runs"], b"")), 1);

    // An unknown run (exit 4), and no file left for it.
    let nowhere = c.path().join("nowhere.jsonl");
    let refused = remote(&["export", "99", "-o", nowhere.to_str().expect("utf-8")], b"");
    assert_eq!(refused.status.code(), Some(4));
    assert!(text(&refused.stderr).contains("run 99 does not exist"), "{}", text(&refused.stderr));
    assert!(!nowhere.exists() && !c.path().join("nowhere.jsonl.partial").exists());
    controller.stop();

    // No controller there: exit 3.
    for args in [["export", id.as_str()], ["import", shown]] {
        let out = benchfleet(c.path(), &[&["--controller", "http://127.0.0.1:9"], &args[..]].concat(), b"");
        assert_eq!(out.status.code(), Some(3), "{args:?}: {}", text(&out.stderr));
    }
}
