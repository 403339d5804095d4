//! Running loadgen for a job. `LoadRunner` is the seam: the agent runs the
//! `benchfleet-loadgen` binary; tests may run the library in-process. Either
//! way records stream to the controller over gRPC, and a run succeeds only
//! once the controller has stored its summary.
//!
//! The binary's verdict is its exit status (`LoadExit`, one per way a run
//! ends); the words for it are the `LoadOutcome` it writes to
//! `--outcome-file` as it exits. Its stderr is only kept, as the tail of the
//! job's log: nothing is decided by what it says there.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use benchfleet_core::load::{LoadExit, LoadOutcome};
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::engine::LogTail;
use crate::job::{Attempt, LoadRun};
use crate::procs::{PidDir, sanitize, stop_group};

#[tonic::async_trait]
pub trait LoadRunner: Send + Sync {
    /// Runs the job's load; when `stop` fires, loadgen is stopped and
    /// awaited before this returns.
    async fn run(&self, run: &LoadRun, stop: &CancellationToken) -> Result<(), LoadError>;

    /// Where loadgen writes its outcome for `attempt` (`--outcome-file`),
    /// for a runner that reads one.
    fn outcome_file(&self, _attempt: &Attempt) -> Option<PathBuf> {
        None
    }

    /// loadgen's version, as the results name it; `None` when unknown.
    async fn version(&self) -> Option<String> {
        None
    }
}

/// Why a job's load did not complete.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot start loadgen {}: {error}", binary.display())]
    Spawn { binary: PathBuf, error: std::io::Error },
    /// The agent stopped it.
    #[error("loadgen was stopped")]
    Stopped,
    /// loadgen's own verdict, by its exit status (never `Completed`), in its
    /// own words.
    #[error("loadgen failed (exit status: {}): {message}", exit.code())]
    Failed { exit: LoadExit, message: String, log_tail: String },
    /// No verdict of loadgen's: killed by a signal, or an exit status it
    /// never gives (a panic's 101).
    #[error("loadgen gave no verdict ({status}): it crashed or was killed; its stderr is in the log tail")]
    Crashed { status: String, log_tail: String },
}

impl LoadError {
    /// loadgen's verdict `exit`, in `message`, with nothing of its log.
    pub fn failed(exit: LoadExit, message: impl Into<String>) -> LoadError {
        LoadError::Failed { exit, message: message.into(), log_tail: String::new() }
    }

    /// The last lines loadgen wrote to stderr, for the job's report.
    pub fn log_tail(&self) -> &str {
        match self {
            LoadError::Failed { log_tail, .. } | LoadError::Crashed { log_tail, .. } => log_tail,
            LoadError::Spawn { .. } | LoadError::Stopped => "",
        }
    }
}

/// The verdict of a loadgen that exited with `status`: its exit status
/// decides, and the outcome it left (if any, and if it is about the same
/// status) says why.
pub fn verdict(status: ExitStatus, outcome: Option<LoadOutcome>, log_tail: String) -> Result<(), LoadError> {
    let Some(exit) = status.code().and_then(LoadExit::from_code) else {
        return Err(LoadError::Crashed { status: status.to_string(), log_tail });
    };
    if exit == LoadExit::Completed {
        return Ok(());
    }
    let said = outcome.filter(|o| o.exit == exit).and_then(|o| o.error);
    let message = said.unwrap_or_else(|| match exit {
        // Its parser refused the flags before it knew where to write.
        LoadExit::Usage => "it refused the command line the agent gave it (is it the agent's version?)".to_owned(),
        _ => format!("{}, and it left no outcome saying why", exit.meaning()),
    });
    Err(LoadError::Failed { exit, message, log_tail })
}

/// Runs the `benchfleet-loadgen` binary, in its own process group with a
/// pid file, so an agent restarted after a kill stops one it left.
#[derive(Clone, Debug)]
pub struct ProcessLoadRunner {
    pub binary: PathBuf,
    pub pids: Option<PidDir>,
    /// Where each run's outcome file is written, and read back.
    pub outcomes: PathBuf,
    /// What `--version` printed, asked once.
    version: tokio::sync::OnceCell<Option<String>>,
}

impl ProcessLoadRunner {
    pub fn new(binary: PathBuf, pids: Option<PidDir>, outcomes: PathBuf) -> ProcessLoadRunner {
        ProcessLoadRunner { binary, pids, outcomes, version: tokio::sync::OnceCell::new() }
    }
}

/// loadgen's command line for a job: its load's flags against its target
/// (`LoadSpec::to_args`, the one mapping; an in-process run parses these
/// same flags with `benchfleet_loadgen::cli::parse`).
pub fn loadgen_args(run: &LoadRun) -> Vec<String> {
    run.job.load.to_args(&run.target)
}

/// The variable loadgen reads its ingest credential from.
pub const INGEST_TOKEN_ENV: &str = "BENCHFLEET_INGEST_TOKEN";

/// loadgen's whole environment: the few variables of the agent's it needs
/// (`var` reads them) and the attempt's ingest credential; none of the
/// agent's secrets.
pub fn loadgen_env(run: &LoadRun, var: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        ["PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "RUST_LOG", "SSL_CERT_FILE", "SSL_CERT_DIR"]
            .into_iter()
            .filter_map(|k| Some((k.to_owned(), var(k)?)))
            .collect();
    if let Some(token) = &run.job.ingest_token {
        env.push((INGEST_TOKEN_ENV.to_owned(), token.expose().to_owned()));
    }
    env
}

/// The name of an attempt's loadgen: its pid file's and its outcome's.
fn name_of(attempt: &Attempt) -> String {
    format!("loadgen-{}-{}-{}", attempt.run_id, attempt.job, attempt.attempt)
}

/// The outcome loadgen left at `path`, if it left one that reads; the file
/// is removed either way.
async fn take_outcome(path: Option<&PathBuf>) -> Option<LoadOutcome> {
    let path = path?;
    let read = tokio::fs::read(path).await;
    let _ = tokio::fs::remove_file(path).await;
    match read.map(|bytes| serde_json::from_slice::<LoadOutcome>(&bytes)) {
        Ok(Ok(outcome)) => Some(outcome),
        Ok(Err(e)) => {
            tracing::warn!("loadgen's outcome file {} does not read: {e}", path.display());
            None
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            tracing::warn!("cannot read loadgen's outcome file {}: {e}", path.display());
            None
        }
    }
}

#[tonic::async_trait]
impl LoadRunner for ProcessLoadRunner {
    /// The binary's `--version` ("benchfleet-loadgen 0.1.0"), asked once.
    async fn version(&self) -> Option<String> {
        let ask = async {
            let out = Command::new(&self.binary).arg("--version").stdin(Stdio::null()).output().await.ok()?;
            let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            (out.status.success() && !text.is_empty()).then_some(text)
        };
        self.version.get_or_init(|| ask).await.clone()
    }

    fn outcome_file(&self, attempt: &Attempt) -> Option<PathBuf> {
        Some(self.outcomes.join(format!("{}.json", sanitize(&name_of(attempt)))))
    }

    async fn run(&self, run: &LoadRun, stop: &CancellationToken) -> Result<(), LoadError> {
        let outcome_file = run.target.outcome_file.as_ref();
        if let Some(path) = outcome_file {
            // What an earlier life of the same attempt left is not this
            // run's word.
            if let Some(dir) = path.parent() {
                let _ = tokio::fs::create_dir_all(dir).await;
            }
            let _ = tokio::fs::remove_file(path).await;
        }
        let mut child = Command::new(&self.binary)
            .args(loadgen_args(run))
            .env_clear()
            .envs(loadgen_env(run, |k| std::env::var(k).ok()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| LoadError::Spawn { binary: self.binary.clone(), error })?;
        let pid_file = match (&self.pids, child.id()) {
            (Some(pids), Some(pid)) => pids
                .record(&name_of(&run.job.attempt), pid)
                .inspect_err(|e| tracing::warn!("cannot write loadgen's pid file: {e}"))
                .ok(),
            _ => None,
        };
        // Its last lines, for the job's log tail.
        let log = LogTail::default();
        let mut err = child.stderr.take();
        let finished = async {
            if let Some(err) = &mut err {
                let (mut partial, mut buf) = (Vec::new(), vec![0u8; 8192]);
                while let Ok(n @ 1..) = err.read(&mut buf).await {
                    log.push_bytes(&mut partial, &buf[..n]);
                }
                log.finish(&mut partial);
            }
            child.wait().await
        };
        let status = tokio::select! {
            status = finished => Some(status),
            () = stop.cancelled() => None,
        };
        let status = match status {
            Some(Ok(status)) => status,
            Some(Err(e)) => {
                // Not waited for: it is killed when dropped.
                if let Some(f) = pid_file {
                    f.remove();
                }
                return Err(LoadError::Crashed { status: format!("cannot be waited for: {e}"), log_tail: log.text() });
            }
            None => {
                // Stopped: SIGTERM first (loadgen records what it sent),
                // then SIGKILL; waited for either way.
                if let Some(pgid) = child.id().and_then(|id| rustix::process::Pid::from_raw(id as i32)) {
                    stop_group(pgid, Duration::from_secs(5)).await;
                }
                let _ = child.kill().await;
                if let Some(f) = pid_file {
                    f.remove();
                }
                take_outcome(outcome_file).await;
                return Err(LoadError::Stopped);
            }
        };
        if let Some(f) = pid_file {
            f.remove();
        }
        verdict(status, take_outcome(outcome_file).await, log.text())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::{Path, PathBuf};

    use benchfleet_core::load::{Arrival, LoadDataset, LoadSpec, LoadTarget};
    use benchfleet_loadgen::Dataset;

    use super::*;
    use crate::job::{Attempt, LoadJob, ReportTls};

    fn attempt() -> Attempt {
        Attempt { run_id: "17".into(), job: 4, attempt: 2, epoch: 9 }
    }

    fn run_of(load: LoadSpec, dataset_path: Option<PathBuf>, processor_path: Option<PathBuf>) -> LoadRun {
        let job = LoadJob {
            attempt: attempt(),
            profile: "p".into(),
            repeat: 3,
            load,
            ingest_token: Some(crate::docker::Secret::new("c0ffee")),
        };
        let report = ReportTls { ca: None, insecure: false };
        LoadRun {
            target: LoadTarget {
                base_url: "http://127.0.0.1:8123".into(),
                model: "m".into(),
                dataset_path,
                processor_path,
                report: Some(report.report_to("http://127.0.0.1:7070", &job.attempt)),
                quiet: true,
                outcome_file: None,
            },
            job,
        }
    }

    fn random(seed: u64) -> LoadSpec {
        LoadSpec {
            rate: Some(12.5),
            arrival: Arrival::Poisson,
            seed: 77,
            ..LoadSpec::new(LoadDataset::Random { input_tokens: 100, output_tokens: 20, seed }, 321)
        }
    }

    #[test]
    fn loadgen_reports_the_attempt_with_its_credential_in_its_environment_only() {
        // The tokenizer, fetched by its hash, is passed as the file on disk.
        let tokenizer =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../loadgen/tests/fixtures/tokenizer.json");
        let run = run_of(random(5), None, Some(tokenizer.clone()));
        let args = loadgen_args(&run);
        assert_eq!(args, run.job.load.to_args(&run.target));
        let (parsed, config, sink) = benchfleet_loadgen::cli::parse(&args).expect("flags");
        assert_eq!(parsed.processor.as_deref(), Some(tokenizer.as_path()));
        assert!(matches!(config.tokens, benchfleet_loadgen::TokenCounter::Tokenizer(_)));
        assert!(parsed.quiet, "no progress on a child's stderr");
        // The credential goes in loadgen's environment, never its arguments.
        let token = run.job.ingest_token.as_ref().expect("a credential");
        assert!(!args.iter().any(|a| a.contains(token.expose())));
        let env = loadgen_env(&run, |_| None);
        assert_eq!(env, [("BENCHFLEET_INGEST_TOKEN".to_owned(), token.expose().to_owned())]);
        let sink = sink.expect("records go to the controller");
        let a = attempt();
        assert_eq!(
            (sink.url.as_str(), sink.run_id.as_str(), sink.job, sink.attempt, sink.epoch),
            ("http://127.0.0.1:7070", a.run_id.as_str(), a.job, a.attempt, a.epoch)
        );
        // Under TLS, loadgen holds the agent's CA and rule.
        let tls = ReportTls { ca: Some("/etc/benchfleet/ca.pem".into()), insecure: true };
        let run =
            LoadRun { target: LoadTarget { report: Some(tls.report_to("https://c:7070", &a)), ..run.target }, ..run };
        let (_, target) = benchfleet_loadgen::cli::from_args(&loadgen_args(&run)).expect("flags");
        let report = target.report.expect("a report");
        assert_eq!((report.ca, report.insecure), (tls.ca, true));
    }

    #[test]
    fn the_profile_s_seed_drives_arrivals_and_the_dataset_s_the_prompts() {
        let config = |load: LoadSpec, dataset: Option<PathBuf>| {
            let mut run = run_of(load, dataset, None);
            run.target.report = None;
            benchfleet_loadgen::cli::parse(&loadgen_args(&run)).expect("flags").1
        };
        let (a, b) = (config(random(5), None), config(LoadSpec { seed: 78, ..random(5) }, None));
        use benchfleet_loadgen::Arrival as Sends;
        assert_eq!((a.arrival, b.arrival), (Sends::Poisson { seed: 77 }, Sends::Poisson { seed: 78 }));
        // Different arrival seeds, the same prompts; a different dataset
        // seed, different prompts.
        let prompts =
            |c: &benchfleet_loadgen::LoadConfig| benchfleet_loadgen::dataset::prompt_texts(&c.dataset, 5, &c.tokens);
        assert_eq!(prompts(&a), prompts(&b));
        assert_ne!(prompts(&a), prompts(&config(random(6), None)));
        // Constant arrivals need no seed; ShareGPT's only seed is the
        // profile's.
        assert_eq!(config(LoadSpec { arrival: Arrival::Constant, ..random(5) }, None).arrival, Sends::Constant);
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("d.json");
        std::fs::write(
            &file,
            r#"[{"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello you"}]}]"#,
        )
        .expect("write");
        let sharegpt = LoadSpec {
            dataset: LoadDataset::ShareGpt {
                file: "d.json".into(),
                sha256: String::new(),
                output_tokens: Some(4),
                sessions: None,
            },
            ..random(5)
        };
        let c = config(sharegpt, Some(file));
        assert_eq!(c.arrival, Sends::Poisson { seed: 77 });
        // The profile's seed also orders the conversations, as vLLM's does.
        assert!(matches!(c.dataset, Dataset::ShareGpt { output_tokens: Some(4), shuffle: Some(77), .. }));
    }

    #[test]
    fn each_exit_status_is_its_verdict_and_the_outcome_only_its_words() {
        use std::os::unix::process::ExitStatusExt as _;
        let exited = |code: i32| ExitStatus::from_raw(code << 8);
        let said = |exit: LoadExit, error: &str| Some(LoadOutcome::new(exit, Some(error.to_owned())));
        assert!(verdict(exited(0), None, String::new()).is_ok());
        // A completed run is one whatever its file says.
        assert!(verdict(exited(0), said(LoadExit::Error, "odd"), String::new()).is_ok());
        for exit in [LoadExit::Error, LoadExit::Invalid, LoadExit::NoneSucceeded] {
            let e = verdict(exited(exit.code().into()), said(exit, "its words"), "its stderr".into())
                .expect_err("a failure");
            let LoadError::Failed { exit: got, message, log_tail } = &e else { panic!("{e:?}") };
            assert_eq!((*got, message.as_str(), log_tail.as_str()), (exit, "its words", "its stderr"));
            assert_eq!(e.to_string(), format!("loadgen failed (exit status: {}): its words", exit.code()));
        }
        // Without an outcome, or with one about another status, the status
        // still decides and says what it means.
        let e = verdict(exited(4), said(LoadExit::Error, "stale"), String::new()).expect_err("a failure");
        assert_eq!(
            e.to_string(),
            "loadgen failed (exit status: 4): no request succeeded, and it left no outcome saying why"
        );
        let e = verdict(exited(3), None, String::new()).expect_err("a failure");
        assert!(matches!(e, LoadError::Failed { exit: LoadExit::Invalid, .. }), "{e:?}");
        let e = verdict(exited(2), None, String::new()).expect_err("a failure");
        assert!(e.to_string().contains("it refused the command line the agent gave it"), "{e}");
        // A status loadgen never exits with, or a signal, is no verdict.
        for status in [exited(101), ExitStatus::from_raw(9)] {
            let e = verdict(status, said(LoadExit::NoneSucceeded, "no"), "panicked".into()).expect_err("a crash");
            assert!(matches!(&e, LoadError::Crashed { log_tail, .. } if log_tail == "panicked"), "{e:?}");
            assert!(e.to_string().starts_with("loadgen gave no verdict ("), "{e}");
        }
    }

    /// A stand-in for loadgen: it writes `outcome` (JSON, if any) where its
    /// `--outcome-file` says, a line on stderr that looks like an error, and
    /// exits with `code`.
    pub(crate) fn fake_loadgen(dir: &std::path::Path, name: &str, code: i32, outcome: Option<&str>) -> PathBuf {
        let write = outcome.map_or_else(String::new, |json| format!("printf '%s' '{json}' > \"$out\"\n"));
        let script = format!(
            "#!/bin/sh\nwhile [ $# -gt 0 ]; do\n  if [ \"$1\" = --outcome-file ]; then out=$2; fi\n  shift\ndone\n\
             echo 'progress: 1/3 requests done' >&2\necho 'error: a line on stderr is not the verdict' >&2\n\
             {write}exit {code}\n"
        );
        let path = dir.join(name);
        std::fs::write(&path, script).expect("write the script");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    /// Runs `runner`, once more if the script was still open for writing in
    /// a child another test forked (ETXTBSY).
    pub(crate) async fn run_fake(runner: &ProcessLoadRunner, run: &LoadRun) -> Result<(), LoadError> {
        for _ in 0..20 {
            match runner.run(run, &CancellationToken::new()).await {
                Err(LoadError::Spawn { error, .. }) if error.raw_os_error() == Some(26) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
        panic!("the fake loadgen stayed busy");
    }

    #[tokio::test]
    async fn the_process_runner_takes_the_verdict_from_the_exit_status_and_the_words_from_the_outcome_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outcomes = dir.path().join("outcomes");
        let json = |exit: LoadExit, error: &str| {
            serde_json::to_string(&LoadOutcome::new(exit, Some(error.to_owned()))).expect("json")
        };
        let cases = [
            (0, Some(r#"{"exit":"completed","code":0,"error":null}"#.to_owned()), None),
            (
                1,
                Some(json(LoadExit::Error, "cannot reach the server")),
                Some((LoadExit::Error, "cannot reach the server")),
            ),
            (2, None, Some((LoadExit::Usage, "it refused the command line the agent gave it"))),
            (
                3,
                Some(json(LoadExit::Invalid, "the run is INVALID: lag")),
                Some((LoadExit::Invalid, "the run is INVALID: lag")),
            ),
            (
                4,
                Some(json(LoadExit::NoneSucceeded, "all 3 requests failed (http_error 3)")),
                Some((LoadExit::NoneSucceeded, "all 3 requests failed (http_error 3)")),
            ),
            // It died before it could say anything.
            (4, None, Some((LoadExit::NoneSucceeded, "no request succeeded, and it left no outcome saying why"))),
        ];
        let scripts: Vec<PathBuf> = cases
            .iter()
            .enumerate()
            .map(|(i, (code, outcome, _))| fake_loadgen(dir.path(), &format!("loadgen-{i}"), *code, outcome.as_deref()))
            .collect();
        for (script, (code, _, expected)) in scripts.into_iter().zip(cases) {
            let runner = ProcessLoadRunner::new(script, None, outcomes.clone());
            let mut run = run_of(random(5), None, None);
            run.target.outcome_file = runner.outcome_file(&run.job.attempt);
            let path = run.target.outcome_file.clone().expect("an outcome file");
            assert!(path.starts_with(&outcomes), "{}", path.display());
            assert!(loadgen_args(&run).windows(2).any(|w| w[0] == "--outcome-file" && Path::new(&w[1]) == path));
            let result = run_fake(&runner, &run).await;
            assert!(!path.exists(), "the outcome file is removed once read");
            match (result, expected) {
                (Ok(()), None) => {}
                (Err(LoadError::Failed { exit, message, log_tail }), Some((want, words))) => {
                    assert_eq!(exit, want, "exit {code}");
                    assert!(message.contains(words), "exit {code}: {message}");
                    assert!(!message.contains("a line on stderr"), "exit {code}: {message}");
                    // stderr is kept, as the log's tail.
                    assert_eq!(
                        log_tail, "progress: 1/3 requests done\nerror: a line on stderr is not the verdict",
                        "exit {code}"
                    );
                }
                (other, _) => panic!("exit {code}: {other:?}"),
            }
        }
        // One that dies by a signal gave no verdict.
        let killed = dir.path().join("killed");
        std::fs::write(&killed, "#!/bin/sh\necho 'error: all fine' >&2\nkill -9 $$\n").expect("write");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&killed, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let runner = ProcessLoadRunner::new(killed, None, outcomes.clone());
        let e = run_fake(&runner, &run_of(random(5), None, None)).await.expect_err("killed");
        assert!(matches!(&e, LoadError::Crashed { log_tail, .. } if log_tail == "error: all fine"), "{e:?}");
    }
}
