//! Running loadgen for a job. `LoadRunner` is the seam: the agent runs the
//! `benchfleet-loadgen` binary; tests may run the library in-process. Either
//! way records stream to the controller over gRPC, and a run succeeds only
//! once the controller has stored its summary.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::job::LoadRun;
use crate::procs::{PidDir, stop_group};

#[tonic::async_trait]
pub trait LoadRunner: Send + Sync {
    /// Runs the job's load; when `stop` fires, loadgen is stopped and
    /// awaited before this returns.
    async fn run(&self, run: &LoadRun, stop: &CancellationToken) -> anyhow::Result<()>;

    /// loadgen's version, as the results name it; `None` when unknown.
    async fn version(&self) -> Option<String> {
        None
    }
}

/// Runs the `benchfleet-loadgen` binary, in its own process group with a
/// pid file, so an agent restarted after a kill stops one it left.
#[derive(Clone, Debug)]
pub struct ProcessLoadRunner {
    pub binary: PathBuf,
    pub pids: Option<PidDir>,
    /// What `--version` printed, asked once.
    version: tokio::sync::OnceCell<Option<String>>,
}

impl ProcessLoadRunner {
    pub fn new(binary: PathBuf, pids: Option<PidDir>) -> ProcessLoadRunner {
        ProcessLoadRunner { binary, pids, version: tokio::sync::OnceCell::new() }
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

    async fn run(&self, run: &LoadRun, stop: &CancellationToken) -> anyhow::Result<()> {
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
            .map_err(|e| anyhow::anyhow!("cannot start loadgen {}: {e}", self.binary.display()))?;
        let name = format!("loadgen-{}-{}-{}", run.job.attempt.run_id, run.job.attempt.job, run.job.attempt.attempt);
        let pid_file = match (&self.pids, child.id()) {
            (Some(pids), Some(pid)) => {
                pids.record(&name, pid).inspect_err(|e| tracing::warn!("cannot write loadgen's pid file: {e}")).ok()
            }
            _ => None,
        };
        let mut stderr = String::new();
        let mut err = child.stderr.take();
        let finished = async {
            if let Some(err) = &mut err {
                let _ = err.read_to_string(&mut stderr).await;
            }
            child.wait().await
        };
        let status = tokio::select! {
            status = finished => Some(status),
            () = stop.cancelled() => None,
        };
        let status = match status {
            Some(status) => status?,
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
                anyhow::bail!("loadgen was stopped");
            }
        };
        if let Some(f) = pid_file {
            f.remove();
        }
        if status.success() {
            return Ok(());
        }
        // loadgen's last word is its error; without one, its last lines.
        if let Some(error) = stderr.lines().rev().find(|l| l.starts_with("error: ")) {
            anyhow::bail!("loadgen failed ({status}): {error}");
        }
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        anyhow::bail!("loadgen failed ({status}): {}", tail.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

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
            dataset: LoadDataset::ShareGpt { file: "d.json".into(), sha256: String::new(), output_tokens: Some(4) },
            ..random(5)
        };
        let c = config(sharegpt, Some(file));
        assert_eq!(c.arrival, Sends::Poisson { seed: 77 });
        // The profile's seed also orders the conversations, as vLLM's does.
        assert!(matches!(c.dataset, Dataset::ShareGpt { output_tokens: Some(4), shuffle: Some(77), .. }));
    }
}
