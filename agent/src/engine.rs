//! Engine runtimes: how an agent starts an inference engine, waits until it
//! serves, and stops it. `process` runs the engine's command line as a local
//! process (the simulator in local mode); `external` uses an engine someone
//! else started. The Docker runtime comes through the same trait.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

use crate::job::EngineLaunch;

/// Engine log lines kept for a failure report.
const LOG_TAIL_LINES: usize = 200;

/// Why an engine did not come up, classified for the operator.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot start the engine command `{command}`: {source}")]
    Spawn { command: String, source: std::io::Error },
    #[error("the engine rejected its flags: {message}")]
    BadFlag { message: String },
    #[error("the engine ran out of memory: {message}")]
    OutOfMemory { message: String },
    #[error("the engine exited during startup ({status}): {message}")]
    Exited { status: String, message: String },
    #[error("the engine did not serve within {0:?}")]
    Timeout(Duration),
    #[error("runtime `{0}` is not available on this agent")]
    Unsupported(String),
}

/// A running engine.
#[tonic::async_trait]
pub trait Engine: Send + Sync {
    /// Base URL of its OpenAI-compatible API, e.g. `http://127.0.0.1:8000`.
    fn base_url(&self) -> String;
    /// The last lines of its log.
    fn log_tail(&self) -> String;
    /// `Some(status)` once the engine has exited.
    fn exit_status(&mut self) -> Option<String>;
    /// Stops the engine and waits until it is gone.
    async fn stop(self: Box<Self>);
}

/// Starts engines of one kind of runtime.
#[tonic::async_trait]
pub trait EngineRuntime: Send + Sync {
    async fn start(&self, launch: &EngineLaunch) -> Result<Box<dyn Engine>, EngineError>;
}

/// The command line that starts an engine, as its documentation gives it.
pub fn engine_command(launch: &EngineLaunch, host: &str, port: u16) -> Vec<String> {
    let mut words: Vec<String> = match launch.kind.as_str() {
        "sglang" => ["python3", "-m", "sglang.launch_server", "--model-path"].map(String::from).to_vec(),
        _ => ["vllm", "serve"].map(String::from).to_vec(),
    };
    words.push(launch.model.clone());
    words.extend(["--host".to_owned(), host.to_owned(), "--port".to_owned(), port.to_string()]);
    words.extend(launch.args.iter().cloned());
    words
}

/// Runs the engine as a local process on a free loopback port.
#[derive(Clone, Debug, Default)]
pub struct ProcessRuntime {
    /// Put before the engine's command line: the simulator binary, for
    /// simulated engines; empty to run the real `vllm`/`python3`.
    pub launcher: Vec<String>,
}

#[tonic::async_trait]
impl EngineRuntime for ProcessRuntime {
    async fn start(&self, launch: &EngineLaunch) -> Result<Box<dyn Engine>, EngineError> {
        let port = free_port().map_err(|source| EngineError::Spawn { command: "bind 127.0.0.1:0".into(), source })?;
        let mut words = self.launcher.clone();
        words.extend(engine_command(launch, "127.0.0.1", port));
        let command = words.join(" ");
        let (program, args) = words.split_first().ok_or_else(|| EngineError::Spawn {
            command: command.clone(),
            source: std::io::Error::other("empty command"),
        })?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| EngineError::Spawn { command: command.clone(), source })?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(out) = child.stdout.take() {
            tokio::spawn(collect_lines(out, log.clone()));
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(collect_lines(err, log.clone()));
        }
        Ok(Box::new(ProcessEngine { child, port, log }))
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn collect_lines(stream: impl AsyncRead + Unpin, log: Arc<Mutex<VecDeque<String>>>) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() == LOG_TAIL_LINES {
            log.pop_front();
        }
        log.push_back(line);
    }
}

struct ProcessEngine {
    child: Child,
    port: u16,
    log: Arc<Mutex<VecDeque<String>>>,
}

#[tonic::async_trait]
impl Engine for ProcessEngine {
    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().map(String::as_str).collect::<Vec<_>>().join("\n")
    }

    fn exit_status(&mut self) -> Option<String> {
        self.child.try_wait().ok().flatten().map(|s| s.to_string())
    }

    async fn stop(mut self: Box<Self>) {
        // TODO(graceful stop): SIGTERM first, so a real engine frees its GPU
        // memory cleanly; needs a signal-sending crate.
        let _ = self.child.kill().await;
    }
}

/// An engine that is already running at a URL; starting and stopping it are
/// someone else's business.
#[derive(Clone, Debug, Default)]
pub struct ExternalRuntime;

#[tonic::async_trait]
impl EngineRuntime for ExternalRuntime {
    async fn start(&self, launch: &EngineLaunch) -> Result<Box<dyn Engine>, EngineError> {
        let url = launch.url.clone().ok_or_else(|| EngineError::Unsupported("external without a url".into()))?;
        Ok(Box::new(ExternalEngine { url: url.trim_end_matches('/').to_owned() }))
    }
}

struct ExternalEngine {
    url: String,
}

#[tonic::async_trait]
impl Engine for ExternalEngine {
    fn base_url(&self) -> String {
        self.url.clone()
    }
    fn log_tail(&self) -> String {
        String::new()
    }
    fn exit_status(&mut self) -> Option<String> {
        None
    }
    async fn stop(self: Box<Self>) {}
}

/// Waits until the engine answers `/health` and lists `model` in
/// `/v1/models`; returns how long that took. An engine that exits first is
/// classified from its log.
pub async fn wait_until_serving(
    engine: &mut dyn Engine,
    model: &str,
    timeout: Duration,
) -> Result<Duration, EngineError> {
    let started = Instant::now();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| EngineError::Spawn { command: "http client".into(), source: std::io::Error::other(e) })?;
    let base = engine.base_url();
    loop {
        if let Some(status) = engine.exit_status() {
            return Err(classify_exit(status, &engine.log_tail()));
        }
        if started.elapsed() > timeout {
            return Err(EngineError::Timeout(timeout));
        }
        let healthy = client.get(format!("{base}/health")).send().await.is_ok_and(|r| r.status().is_success());
        if healthy {
            let models = client.get(format!("{base}/v1/models")).send().await;
            if let Ok(r) = models {
                let body = r.text().await.unwrap_or_default();
                if body.contains(&format!("\"{model}\"")) {
                    return Ok(started.elapsed());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Names the reason an engine exited during startup, from its log.
pub fn classify_exit(status: String, log: &str) -> EngineError {
    let last =
        |pat: &[&str]| log.lines().rev().find(|l| pat.iter().any(|p| l.to_lowercase().contains(p))).map(str::to_owned);
    if let Some(line) = last(&["unrecognized arguments", "invalid choice", "unknown flag", "invalid value"]) {
        return EngineError::BadFlag { message: line };
    }
    if let Some(line) = last(&["out of memory", "outofmemory", "not enough memory", "kv cache"]) {
        return EngineError::OutOfMemory { message: line };
    }
    let message = log.lines().last().unwrap_or("no output").to_owned();
    EngineError::Exited { status, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(log: &str, expected: &str) {
        assert_eq!(classify_exit("exit status: 2".into(), log).to_string(), expected);
    }

    #[test]
    fn startup_failures_are_classified() {
        check(
            "usage: vllm serve\nvllm: error: unrecognized arguments: --bogus",
            "the engine rejected its flags: vllm: error: unrecognized arguments: --bogus",
        );
        check(
            "ValueError: To serve at least one request with max seq len (131072), 16.0 GiB KV cache is needed, which is larger than the available KV cache memory (9.1 GiB).",
            "the engine ran out of memory: ValueError: To serve at least one request with max seq len (131072), 16.0 GiB KV cache is needed, which is larger than the available KV cache memory (9.1 GiB).",
        );
        check("loading\nsegfault", "the engine exited during startup (exit status: 2): segfault");
    }

    #[test]
    fn command_lines_follow_each_engine() {
        let launch = EngineLaunch {
            kind: "sglang".into(),
            model: "m".into(),
            args: vec!["--context-length=8".into()],
            ..EngineLaunch::default()
        };
        assert_eq!(
            engine_command(&launch, "127.0.0.1", 9).join(" "),
            "python3 -m sglang.launch_server --model-path m --host 127.0.0.1 --port 9 --context-length=8"
        );
        let vllm = EngineLaunch { kind: "vllm".into(), ..launch };
        assert_eq!(
            engine_command(&vllm, "127.0.0.1", 9).join(" "),
            "vllm serve m --host 127.0.0.1 --port 9 --context-length=8"
        );
    }
}
