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

use crate::job::{LoadDataset, LoadRun};
use crate::procs::{PidDir, stop_group};

#[tonic::async_trait]
pub trait LoadRunner: Send + Sync {
    /// Runs the job's load; when `stop` fires, loadgen is stopped and
    /// awaited before this returns.
    async fn run(&self, run: &LoadRun, stop: &CancellationToken) -> anyhow::Result<()>;
}

/// Runs the `benchfleet-loadgen` binary, in its own process group with a
/// pid file, so an agent restarted after a kill stops one it left.
#[derive(Clone, Debug)]
pub struct ProcessLoadRunner {
    pub binary: PathBuf,
    pub pids: Option<PidDir>,
}

impl ProcessLoadRunner {
    pub fn new(binary: PathBuf) -> ProcessLoadRunner {
        ProcessLoadRunner { binary, pids: None }
    }
}

/// loadgen's command line for a job, `vllm bench serve`-style.
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
    match &job.dataset {
        LoadDataset::Random { input_tokens, output_tokens, seed } => args.extend([
            "--dataset-name".into(),
            "random".into(),
            "--random-input-len".into(),
            input_tokens.to_string(),
            "--random-output-len".into(),
            output_tokens.to_string(),
            "--seed".into(),
            seed.to_string(),
        ]),
        LoadDataset::ShareGpt { output_tokens, .. } => {
            // loadgen has one seed; for ShareGPT it only drives arrivals.
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
    args
}

#[tonic::async_trait]
impl LoadRunner for ProcessLoadRunner {
    async fn run(&self, run: &LoadRun, stop: &CancellationToken) -> anyhow::Result<()> {
        let mut child = Command::new(&self.binary)
            .args(loadgen_args(run))
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
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        anyhow::bail!("loadgen failed ({status}): {}", tail.join("\n"))
    }
}
