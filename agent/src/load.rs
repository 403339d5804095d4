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

use crate::job::{LoadDataset, LoadRun, LoadWindow};
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

/// loadgen's command line for a job, `vllm bench serve`-style: the one
/// mapping from a job to a load run (an in-process run parses these same
/// flags with `benchfleet_loadgen::cli::parse`).
pub fn loadgen_args(run: &LoadRun) -> Vec<String> {
    let job = &run.job;
    let mut args: Vec<String> = vec![
        "--base-url".into(),
        run.base_url.clone(),
        "--endpoint".into(),
        if job.endpoint == "chat" { "/v1/chat/completions" } else { "/v1/completions" }.into(),
        "--model".into(),
        run.model.clone(),
        "--num-prompts".into(),
        job.requests.to_string(),
        "--quiet".into(),
    ];
    if let Some(rate) = job.rate {
        args.extend(["--request-rate".into(), rate.to_string(), "--arrival".into(), job.arrival.clone()]);
    }
    if let Some(n) = job.max_concurrency {
        args.extend(["--max-concurrency".into(), n.to_string()]);
    }
    if let Some(ms) = job.lag_limit_ms {
        args.extend(["--lag-limit-ms".into(), ms.to_string()]);
    }
    if let Some(share) = job.rate_tolerance {
        args.extend(["--rate-tolerance".into(), share.to_string()]);
    }
    for (window, requests, seconds) in
        [(job.warmup, "--warmup", "--warmup-time"), (job.cooldown, "--cooldown", "--cooldown-time")]
    {
        match window {
            Some(LoadWindow::Requests(n)) => args.extend([requests.into(), n.to_string()]),
            Some(LoadWindow::Seconds(s)) => args.extend([seconds.into(), s.to_string()]),
            None => {}
        }
    }
    if let Some(s) = job.max_duration_s {
        args.extend(["--max-duration".into(), s.to_string()]);
    }
    if job.ignore_eos {
        args.push("--ignore-eos".into());
    }
    if let Some(body) = &job.extra_body {
        args.extend(["--extra-body".into(), body.clone()]);
    }
    if !job.goodput.is_empty() {
        args.push("--goodput".into());
        args.extend(job.goodput.iter().cloned());
    }
    if let Some(path) = &run.processor_path {
        args.extend(["--processor".into(), path.display().to_string()]);
    }
    // The dataset's seed makes the prompts; the profile's, the arrivals.
    let generated = |output_tokens: &u32, seed: &u64| -> [String; 6] {
        [
            "--random-output-len".into(),
            output_tokens.to_string(),
            "--seed".into(),
            seed.to_string(),
            "--arrival-seed".into(),
            job.seed.to_string(),
        ]
    };
    match &job.dataset {
        LoadDataset::Random { input_tokens, output_tokens, seed } => {
            args.extend([
                "--dataset-name".into(),
                "random".into(),
                "--random-input-len".into(),
                input_tokens.to_string(),
            ]);
            args.extend(generated(output_tokens, seed));
        }
        LoadDataset::SharedPrefix { groups, prefix_tokens, suffix_tokens, output_tokens, seed } => {
            args.extend([
                "--dataset-name".into(),
                "prefix".into(),
                "--prefix-groups".into(),
                groups.to_string(),
                "--prefix-len".into(),
                prefix_tokens.to_string(),
                "--random-input-len".into(),
                suffix_tokens.to_string(),
            ]);
            args.extend(generated(output_tokens, seed));
        }
        LoadDataset::ShareGpt { output_tokens, .. } => {
            // A ShareGPT file has no seed of its own: the profile's drives
            // the arrivals.
            args.extend(["--dataset-name".into(), "sharegpt".into(), "--seed".into(), job.seed.to_string()]);
            if let Some(path) = &run.dataset_path {
                args.extend(["--dataset-path".into(), path.display().to_string()]);
            }
            if let Some(n) = output_tokens {
                args.extend(["--sharegpt-output-len".into(), n.to_string()]);
            }
        }
    }
    args.extend([
        "--report-to".into(),
        run.ingest_url.clone(),
        "--run-id".into(),
        job.attempt.run_id.clone(),
        "--job".into(),
        job.attempt.job.to_string(),
        "--attempt".into(),
        job.attempt.attempt.to_string(),
        "--epoch".into(),
        job.attempt.epoch.to_string(),
    ]);
    if let Some(ca) = &run.report.ca {
        args.extend(["--report-ca".into(), ca.display().to_string()]);
    }
    if run.report.insecure {
        args.push("--report-insecure".into());
    }
    args
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

    use benchfleet_loadgen::{Arrival, Dataset, Endpoint, Window};

    use super::*;
    use crate::job::{Attempt, LoadJob};

    fn run_of(job: LoadJob, dataset_path: Option<PathBuf>) -> LoadRun {
        LoadRun {
            job,
            base_url: "http://127.0.0.1:8123".into(),
            model: "m".into(),
            ingest_url: "http://127.0.0.1:7070".into(),
            report: Default::default(),
            dataset_path,
            processor_path: None,
        }
    }

    fn job() -> LoadJob {
        LoadJob {
            attempt: Attempt { run_id: "17".into(), job: 4, attempt: 2, epoch: 9 },
            profile: "p".into(),
            repeat: 3,
            endpoint: "chat".into(),
            rate: Some(12.5),
            arrival: "poisson".into(),
            requests: 321,
            max_concurrency: Some(9),
            seed: 77,
            dataset: LoadDataset::Random { input_tokens: 100, output_tokens: 20, seed: 5 },
            lag_limit_ms: Some(12.5),
            rate_tolerance: Some(0.025),
            warmup: Some(LoadWindow::Requests(7)),
            cooldown: Some(LoadWindow::Seconds(2.5)),
            max_duration_s: Some(90.0),
            ignore_eos: true,
            extra_body: Some(r#"{"temperature":0}"#.into()),
            goodput: vec!["ttft:200".into(), "tpot:50".into()],
            processor: Some(("tokenizer.json".into(), "ab".repeat(32))),
            ingest_token: Some(crate::docker::Secret::new("c0ffee")),
        }
    }

    #[test]
    fn every_field_of_a_job_reaches_loadgen() {
        // Every field, by name: one added to the job fails to compile here
        // until it is mapped (or said not to be loadgen's) and checked.
        let LoadJob {
            attempt,
            profile: _,
            repeat: _,
            endpoint,
            rate,
            arrival,
            requests,
            max_concurrency,
            seed,
            dataset,
            lag_limit_ms,
            rate_tolerance,
            warmup,
            cooldown,
            max_duration_s,
            ignore_eos,
            extra_body,
            goodput,
            processor,
            ingest_token,
        } = job();
        // The tokenizer, fetched by its hash, is passed as the file on disk.
        let tokenizer =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../loadgen/tests/fixtures/tokenizer.json");
        assert!(processor.is_some());
        let run = LoadRun { processor_path: Some(tokenizer.clone()), ..run_of(job(), None) };
        let (args, config, sink) = benchfleet_loadgen::cli::parse(&loadgen_args(&run)).expect("flags");
        assert_eq!(args.processor.as_deref(), Some(tokenizer.as_path()));
        assert!(matches!(config.tokens, benchfleet_loadgen::TokenCounter::Tokenizer(_)));
        assert_eq!((endpoint.as_str(), config.endpoint), ("chat", Endpoint::ChatCompletions));
        assert_eq!(config.request_rate, rate);
        assert_eq!((arrival.as_str(), config.arrival), ("poisson", Arrival::Poisson { seed }));
        assert_eq!(config.num_requests as u64, requests);
        assert_eq!(config.max_concurrency.map(|n| n as u64), max_concurrency);
        assert_eq!((config.lag_limit_ms, Some(config.rate_tolerance)), (lag_limit_ms, rate_tolerance));
        assert_eq!((warmup, config.warmup), (Some(LoadWindow::Requests(7)), Window::Requests(7)));
        assert_eq!(
            (cooldown, config.cooldown),
            (Some(LoadWindow::Seconds(2.5)), Window::Time(Duration::from_millis(2500)))
        );
        assert_eq!(config.max_duration.map(|d| d.as_secs_f64()), max_duration_s);
        assert!(ignore_eos && config.extra_body.get("ignore_eos") == Some(&serde_json::Value::Bool(true)));
        let body: serde_json::Value = serde_json::from_str(extra_body.as_deref().unwrap_or_default()).expect("json");
        assert_eq!(config.extra_body.get("temperature"), body.get("temperature"));
        assert_eq!(config.goodput.map(|g| g.words()), Some(goodput));
        let LoadDataset::Random { input_tokens, output_tokens, seed: prompts } = dataset else { unreachable!() };
        assert!(
            matches!(config.dataset, Dataset::Random { input_tokens: i, output_tokens: o, seed: s } if (i, o, s) == (input_tokens, output_tokens, prompts)),
            "{:?}",
            config.dataset
        );
        assert_eq!((config.base_url.as_str(), config.model.as_str()), ("http://127.0.0.1:8123", "m"));
        // The credential goes in loadgen's environment, never its arguments.
        let token = ingest_token.expect("a credential");
        assert!(!loadgen_args(&run).iter().any(|a| a.contains(token.expose())));
        let env = loadgen_env(&run, |_| None);
        assert_eq!(env, [("BENCHFLEET_INGEST_TOKEN".to_owned(), token.expose().to_owned())]);
        let sink = sink.expect("records go to the controller");
        assert_eq!(
            (sink.url.as_str(), sink.run_id.as_str(), sink.job, sink.attempt, sink.epoch),
            ("http://127.0.0.1:7070", attempt.run_id.as_str(), attempt.job, attempt.attempt, attempt.epoch)
        );
    }

    #[test]
    fn the_profile_s_seed_drives_arrivals_and_the_dataset_s_the_prompts() {
        let arrivals =
            |job: LoadJob| benchfleet_loadgen::cli::parse(&loadgen_args(&run_of(job, None))).expect("flags").1;
        let other_arrivals = LoadJob { seed: 78, ..job() };
        let (a, b) = (arrivals(job()), arrivals(other_arrivals));
        assert_eq!((a.arrival, b.arrival), (Arrival::Poisson { seed: 77 }, Arrival::Poisson { seed: 78 }));
        // Different arrival seeds, the same prompts; a different dataset
        // seed, different prompts.
        let prompts =
            |c: &benchfleet_loadgen::LoadConfig| benchfleet_loadgen::dataset::prompt_texts(&c.dataset, 5, &c.tokens);
        assert_eq!(prompts(&a), prompts(&b));
        let reseeded =
            LoadJob { dataset: LoadDataset::Random { input_tokens: 100, output_tokens: 20, seed: 6 }, ..job() };
        assert_ne!(prompts(&a), prompts(&arrivals(reseeded)));
        // Constant arrivals need no seed; ShareGPT's only seed is the
        // profile's.
        let constant = arrivals(LoadJob { arrival: "constant".into(), ..job() });
        assert_eq!(constant.arrival, Arrival::Constant);
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("d.json");
        std::fs::write(
            &file,
            r#"[{"conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello you"}]}]"#,
        )
        .expect("write");
        let sharegpt = LoadJob {
            dataset: LoadDataset::ShareGpt { name: "d.json".into(), sha256: String::new(), output_tokens: Some(4) },
            ..job()
        };
        let (_, c, _) = benchfleet_loadgen::cli::parse(&loadgen_args(&run_of(sharegpt, Some(file)))).expect("flags");
        assert_eq!(c.arrival, Arrival::Poisson { seed: 77 });
        // The profile's seed also orders the conversations, as vLLM's does.
        assert!(matches!(c.dataset, Dataset::ShareGpt { output_tokens: Some(4), shuffle: Some(77), .. }));
    }
}
