//! Engine runtimes: how an agent starts an inference engine, waits until it
//! serves, and stops it. `process` runs the engine's command line as a local
//! process (the simulator in local mode); `external` uses an engine someone
//! else started; `docker` (in `crate::docker`) runs it in a container. All
//! of them share the log tail and the startup failure classification here.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use benchfleet_core::engine::EngineKind;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

use crate::job::EngineLaunch;
use crate::procs::{PidDir, PidFile};

/// Engine log lines kept for a failure report.
pub const LOG_TAIL_LINES: usize = 200;

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
    #[error(
        "the image `{image}` is not on this host and pulling it failed: {message}; \
         pull or load it on the agent's host, or check the image name"
    )]
    ImageMissing { image: String, message: String },
    #[error("the container runtime could not {action}: {message}")]
    Container { action: String, message: String },
    /// The agent's engine policy (`[engines]` in its config file) refuses
    /// the launch: `allow` says which key would allow it.
    #[error("{what} is not allowed on this agent: {allow}")]
    NotAllowed { what: String, allow: String },
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
    /// The digest of the image it runs, where it runs one (Docker's
    /// repository digest, else the image id).
    fn image_digest(&self) -> Option<String> {
        None
    }
    /// Stops the engine and waits until it is gone.
    async fn stop(self: Box<Self>);
}

/// Starts engines of one kind of runtime.
#[tonic::async_trait]
pub trait EngineRuntime: Send + Sync {
    /// Fetches what `start` needs, such as a container image, calling
    /// `progress` with a line now and then so the operator sees a long pull
    /// move. Most runtimes need nothing.
    async fn prepare(
        &self,
        _launch: &EngineLaunch,
        _progress: &(dyn Fn(String) + Send + Sync),
    ) -> Result<(), EngineError> {
        Ok(())
    }
    async fn start(&self, launch: &EngineLaunch) -> Result<Box<dyn Engine>, EngineError>;
}

/// The command line that starts an engine, as its documentation gives it
/// (`benchfleet_core::engine::command`, which the reports show too),
/// listening on `host:port`. A kind the controller does not send is
/// started as vLLM, as the other choices by kind here make it.
pub fn engine_command(launch: &EngineLaunch, host: &str, port: u16) -> Vec<String> {
    let kind = EngineKind::from_name(&launch.kind).unwrap_or(EngineKind::Vllm);
    benchfleet_core::engine::command(kind, &launch.model, &launch.args, Some((host, port)))
}

/// What empties an engine's prefix cache, by its kind: SGLang's
/// `POST /flush_cache`; vLLM's `POST /reset_prefix_cache`, which it serves
/// only among its development endpoints (see [`engine_env`]).
pub fn cache_reset_path(kind: &str) -> &'static str {
    match kind {
        "sglang" => "/flush_cache",
        _ => "/reset_prefix_cache",
    }
}

/// The environment an engine of this kind gets besides the runtime's: for
/// vLLM, `VLLM_SERVER_DEV_MODE=1`, without which it does not serve
/// `/reset_prefix_cache` (the engine listens on loopback only).
pub fn engine_env(kind: &str) -> Vec<(String, String)> {
    match kind {
        "sglang" => Vec::new(),
        _ => vec![("VLLM_SERVER_DEV_MODE".to_owned(), "1".to_owned())],
    }
}

/// The agent's own environment variables an engine process gets: what a
/// program needs to run at all. The rest (tokens, credentials, the agent's
/// own settings) stays with the agent.
pub const INHERITED_ENV: [&str; 5] = ["PATH", "HOME", "LANG", "LC_ALL", "TMPDIR"];

/// The simulated GPU probe's UUIDs start with this; such GPUs do not exist,
/// so an engine is given no devices for them.
pub(crate) const SIMULATED_GPU_PREFIX: &str = "GPU-sim-";

/// Runs the engine as a local process on a free loopback port.
#[derive(Clone)]
pub struct ProcessRuntime {
    /// Put before the engine's command line: the simulator binary, for
    /// simulated engines; empty to run the real `vllm`/`python3`.
    pub launcher: Vec<String>,
    /// Set in the engine's environment (for the simulator: which GPU it
    /// stands in for; for real engines, `HF_TOKEN` where the agent has
    /// one). The engine gets these, [`INHERITED_ENV`] and [`engine_env`],
    /// nothing else of the agent's environment. Values may be secrets:
    /// `Debug` shows only the names.
    pub env: Vec<(String, String)>,
    /// How long a stopped engine has to exit after SIGTERM before it is
    /// killed.
    pub stop_grace: Duration,
    /// Simulated engines only: how fast each runs against its model, from
    /// its GPUs' (`BENCHFLEET_SIM_SPEED`); `None` for real engines.
    pub sim_speed: Option<crate::gpu::SimSpeed>,
    /// Where each engine's pid file goes, so that an agent restarted after
    /// a kill stops the engines it left (`PidDir::sweep`).
    pub pids: Option<PidDir>,
}

impl std::fmt::Debug for ProcessRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env: Vec<&str> = self.env.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("ProcessRuntime")
            .field("launcher", &self.launcher)
            .field("env", &env)
            .field("stop_grace", &self.stop_grace)
            .field("pids", &self.pids)
            .finish()
    }
}

/// An engine process's whole environment, in the order set (a later value
/// of a name wins): the agent's [`INHERITED_ENV`] (from `inherited`), the
/// engine kind's [`engine_env`], its GPUs as `CUDA_VISIBLE_DEVICES` (by
/// UUID; a simulated engine counts its simulated ones from it, as a real
/// one counts its devices), then the runtime's `env`.
pub fn process_env(
    launch: &EngineLaunch,
    env: &[(String, String)],
    inherited: impl Fn(&'static str) -> Option<std::ffi::OsString>,
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let mut out: Vec<(std::ffi::OsString, std::ffi::OsString)> =
        INHERITED_ENV.iter().filter_map(|name| Some((name.into(), inherited(name)?))).collect();
    out.extend(engine_env(&launch.kind).into_iter().map(|(k, v)| (k.into(), v.into())));
    if !launch.gpu_uuids.is_empty() {
        out.push(("CUDA_VISIBLE_DEVICES".into(), launch.gpu_uuids.join(",").into()));
    }
    out.extend(env.iter().map(|(k, v)| (k.into(), v.into())));
    out
}

impl Default for ProcessRuntime {
    fn default() -> Self {
        ProcessRuntime {
            launcher: Vec::new(),
            env: Vec::new(),
            stop_grace: Duration::from_secs(30),
            pids: None,
            sim_speed: None,
        }
    }
}

#[tonic::async_trait]
impl EngineRuntime for ProcessRuntime {
    async fn start(&self, launch: &EngineLaunch) -> Result<Box<dyn Engine>, EngineError> {
        let port =
            free_port().map_err(|source| EngineError::Spawn { command: "take an engine port".into(), source })?;
        let mut words = self.launcher.clone();
        words.extend(engine_command(launch, "127.0.0.1", port.number()));
        let command = words.join(" ");
        let (program, args) = words.split_first().ok_or_else(|| EngineError::Spawn {
            command: command.clone(),
            source: std::io::Error::other("empty command"),
        })?;
        let mut child = Command::new(program)
            .args(args)
            // Nothing of the agent's environment but what `process_env`
            // names: the agent may hold tokens the engine has no need of.
            .env_clear()
            .envs(process_env(launch, &self.env, std::env::var_os))
            .envs(self.sim_speed.as_ref().map(|s| ("BENCHFLEET_SIM_SPEED", s.of_uuids(&launch.gpu_uuids).to_string())))
            // Its own process group, so that stopping it reaches the worker
            // processes an engine forks (vLLM's engine core, SGLang's
            // schedulers) and none is left holding GPU memory.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| EngineError::Spawn { command: command.clone(), source })?;
        let pid_file = match (&self.pids, child.id()) {
            (Some(pids), Some(pid)) => {
                let name = if launch.instance_name.is_empty() {
                    format!("engine-{pid}")
                } else {
                    launch.instance_name.clone()
                };
                Some(
                    pids.record(&name, pid)
                        .map_err(|source| EngineError::Spawn { command: command.clone(), source })?,
                )
            }
            _ => None,
        };
        let log = LogTail::default();
        let open_pipes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for pipe in [
            child.stdout.take().map(|p| Box::new(p) as Box<dyn AsyncRead + Send + Unpin>),
            child.stderr.take().map(|p| Box::new(p) as _),
        ]
        .into_iter()
        .flatten()
        {
            open_pipes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (log, open) = (log.clone(), open_pipes.clone());
            tokio::spawn(async move {
                collect_lines(pipe, log).await;
                open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
        Ok(Box::new(ProcessEngine {
            child,
            port,
            log,
            stop_grace: self.stop_grace,
            pid_file,
            open_pipes,
            exited_at: None,
        }))
    }
}

/// The ports engines listen on, by default: below Linux's default ephemeral
/// range (32768-60999).
pub const DEFAULT_ENGINE_PORTS: (u16, u16) = (20000, 29999);

/// The ports engines listen on: a range outside the kernel's ephemeral range
/// (from which loadgen's connections, and every other outgoing one, take
/// their local ports, so none can take an engine's port between its check
/// and the engine's bind). Each port is checked free on loopback and kept
/// for its engine until the engine is dropped. Ports are the host's, so the
/// process has one pool ([`EnginePorts::global`]) that every runtime takes
/// from; it starts at a random place in its range, so that agents sharing a
/// host (tests, simulations) seldom try the same port at once.
#[derive(Debug)]
pub struct EnginePorts {
    state: std::sync::Mutex<PortsState>,
}

#[derive(Debug)]
struct PortsState {
    first: u16,
    last: u16,
    next: u16,
    taken: std::collections::BTreeSet<u16>,
}

/// A port kept for one engine; given back when dropped.
#[derive(Debug)]
pub struct EnginePort {
    port: u16,
    pool: &'static EnginePorts,
}

impl EnginePort {
    pub fn number(&self) -> u16 {
        self.port
    }
}

impl Drop for EnginePort {
    fn drop(&mut self) {
        self.pool.lock().taken.remove(&self.port);
    }
}

impl EnginePorts {
    /// A pool over `first..=last`.
    pub fn new(first: u16, last: u16) -> Result<EnginePorts, String> {
        if first == 0 || first > last {
            return Err(format!("engine ports {first}-{last} are not a range of ports (from 1 up)"));
        }
        let span = u32::from(last - first) + 1;
        let start = first + (std::process::id() % span) as u16;
        Ok(EnginePorts {
            state: std::sync::Mutex::new(PortsState { first, last, next: start, taken: Default::default() }),
        })
    }

    /// The process's pool, over [`DEFAULT_ENGINE_PORTS`] until
    /// [`EnginePorts::set_range`] says otherwise.
    pub fn global() -> &'static EnginePorts {
        static POOL: std::sync::OnceLock<EnginePorts> = std::sync::OnceLock::new();
        POOL.get_or_init(|| {
            EnginePorts::new(DEFAULT_ENGINE_PORTS.0, DEFAULT_ENGINE_PORTS.1).expect("the default range is one")
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PortsState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes ports from `first..=last` from now on, once checked against the
    /// kernel's ephemeral range (`ephemeral`, as `ephemeral_range` reads it).
    pub fn set_range(&self, first: u16, last: u16, ephemeral: Option<(u16, u16)>) -> Result<(), String> {
        let fresh = EnginePorts::new(first, last)?;
        if let Some((lo, hi)) = ephemeral
            && first <= hi
            && lo <= last
        {
            return Err(format!(
                "engine ports {first}-{last} overlap the kernel's ephemeral range {lo}-{hi} \
                 (net.ipv4.ip_local_port_range), from which outgoing connections take their ports: \
                 choose a range outside it"
            ));
        }
        let fresh = fresh.state.into_inner().unwrap_or_else(|e| e.into_inner());
        let mut state = self.lock();
        (state.first, state.last, state.next) = (fresh.first, fresh.last, fresh.next);
        Ok(())
    }

    /// A free port of the range, kept until the returned guard is dropped.
    pub fn take(&'static self) -> std::io::Result<EnginePort> {
        let mut state = self.lock();
        let (first, last) = (state.first, state.last);
        let span = u32::from(last - first) + 1;
        for _ in 0..span {
            let port = state.next;
            state.next = if port == last { first } else { port + 1 };
            if state.taken.contains(&port) {
                continue;
            }
            // Free now: nothing listens on it, and no connection of ours can
            // come to use it (it is outside the ephemeral range).
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                state.taken.insert(port);
                return Ok(EnginePort { port, pool: self });
            }
        }
        Err(std::io::Error::other(format!(
            "no free engine port in {first}-{last}: {} kept for engines, the rest in use",
            state.taken.len()
        )))
    }

    /// Parses `FIRST-LAST`, e.g. `20000-29999`.
    pub fn parse_range(text: &str) -> Result<(u16, u16), String> {
        let bad = || format!("engine ports must be FIRST-LAST, e.g. 20000-29999, got '{text}'");
        let (a, b) = text.split_once('-').ok_or_else(bad)?;
        Ok((a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?))
    }
}

/// The kernel's ephemeral port range, where it says.
pub fn ephemeral_range() -> Option<(u16, u16)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut words = text.split_whitespace().map(|w| w.parse::<u16>().ok());
    Some((words.next()??, words.next()??))
}

/// A port for an engine to listen on, from the process's pool.
pub(crate) fn free_port() -> std::io::Result<EnginePort> {
    EnginePorts::global().take()
}

/// The last `LOG_TAIL_LINES` lines of an engine's log, shared between the
/// tasks that read the log and the engine that reports it.
#[derive(Clone, Debug, Default)]
pub struct LogTail(Arc<Mutex<VecDeque<String>>>);

impl LogTail {
    pub fn push(&self, line: String) {
        let mut log = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() == LOG_TAIL_LINES {
            log.pop_front();
        }
        log.push_back(line);
    }

    /// Adds a chunk of output that may end mid-line: complete lines are kept,
    /// the rest waits in `partial` for the next chunk (or `finish`).
    pub fn push_bytes(&self, partial: &mut Vec<u8>, chunk: &[u8]) {
        partial.extend_from_slice(chunk);
        while let Some(end) = partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = partial.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line[..end]);
            self.push(line.trim_end_matches('\r').to_owned());
        }
    }

    /// Keeps what is left of a log that did not end with a newline.
    pub fn finish(&self, partial: &mut Vec<u8>) {
        if !partial.is_empty() {
            self.push(String::from_utf8_lossy(partial).into_owned());
            partial.clear();
        }
    }

    pub fn text(&self) -> String {
        let log = self.0.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().map(String::as_str).collect::<Vec<_>>().join("\n")
    }
}

async fn collect_lines(stream: impl AsyncRead + Unpin, log: LogTail) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        log.push(line);
    }
}

struct ProcessEngine {
    child: Child,
    port: EnginePort,
    log: LogTail,
    stop_grace: Duration,
    pid_file: Option<PidFile>,
    /// Output pipes still being read: an exit is told once its last words
    /// are in the log.
    open_pipes: Arc<std::sync::atomic::AtomicUsize>,
    /// When the exit was first seen.
    exited_at: Option<Instant>,
}

#[tonic::async_trait]
impl Engine for ProcessEngine {
    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port.number())
    }

    fn log_tail(&self) -> String {
        self.log.text()
    }

    fn exit_status(&mut self) -> Option<String> {
        let status = self.child.try_wait().ok().flatten()?;
        let seen = *self.exited_at.get_or_insert_with(Instant::now);
        // The pipes close once the last of the engine's output is read (a
        // worker that outlives the leader may hold them: not for long).
        let drained = self.open_pipes.load(std::sync::atomic::Ordering::SeqCst) == 0;
        (drained || seen.elapsed() > Duration::from_secs(2)).then(|| status.to_string())
    }

    async fn stop(mut self: Box<Self>) {
        // SIGTERM first, so that a real engine shuts its workers down and
        // frees GPU memory cleanly; SIGKILL to the whole group after the
        // grace period, or at once if the signal cannot be sent.
        let group = self.child.id().and_then(|id| rustix::process::Pid::from_raw(id as i32));
        let asked =
            group.is_some_and(|g| rustix::process::kill_process_group(g, rustix::process::Signal::TERM).is_ok());
        if !(asked && tokio::time::timeout(self.stop_grace, self.child.wait()).await.is_ok()) {
            let _ = self.child.kill().await;
        }
        // The leader is gone; workers that outlived it go too.
        if let Some(group) = group {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        if let Some(f) = self.pid_file.take() {
            f.remove();
        }
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

/// The engine's version as it says it: vLLM's `GET /version`, SGLang's
/// `GET /get_server_info` (its `version`); `None` when it does not answer.
pub async fn engine_version(http: &reqwest::Client, base_url: &str, kind: &str) -> Option<String> {
    let path = if kind == "sglang" { "/get_server_info" } else { "/version" };
    let response = http.get(format!("{base_url}{path}")).timeout(Duration::from_secs(5)).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    let body: serde_json::Value = response.json().await.ok()?;
    body.get("version")?.as_str().filter(|v| !v.is_empty()).map(str::to_owned)
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

/// The status text of an engine the kernel killed for using too much
/// memory; runtimes that can tell (Docker) put it in the exit status.
pub const OOM_KILLED: &str = "killed by the out-of-memory killer";

/// The engines' own processing of their arguments after the parser
/// (SGLang's `ServerArgs` checks, vLLM's `EngineArgs`): an exception raised
/// there refuses the flags, as it would on every host of the kind (a few of
/// their checks read the GPU, such as an attention backend only one
/// generation has: on a mixed fleet those fail on that generation's hosts).
/// vLLM's configuration classes are pydantic's: their refusals say
/// `Value error, `.
const ARGUMENT_PROCESSING: [&str; 2] = ["sglang/srt/server_args.py\"", "vllm/engine/arg_utils.py\""];

/// The exception line of the log's last traceback, when its innermost frame
/// is the engine's processing of its arguments ([`ARGUMENT_PROCESSING`]): a
/// check of a value that failed there, not something the host did.
fn argument_refusal(log: &str) -> Option<String> {
    // An exception raised while handling another, or because of it, may carry a failure of the
    // host's (a download) into the argument processing: not read as the flags'.
    if log.contains("The above exception was the direct cause")
        || log.contains("During handling of the above exception")
    {
        return None;
    }
    // vLLM's processes prefix their lines, coloured on a terminal: `(APIServer pid=1) `.
    let unprefixed = |line: &str| {
        let plain = without_ansi(line);
        match plain.strip_prefix('(').and_then(|rest| rest.split_once(") ")) {
            Some((_, text)) => text.to_owned(),
            None => plain,
        }
    };
    let lines: Vec<String> = log.lines().map(unprefixed).collect();
    let start = lines.iter().rposition(|l| l.contains("Traceback (most recent call last):"))?;
    // The traceback's frames and their source lines are indented; its exception's line, which
    // ends it, is not.
    let mut innermost = None;
    for line in &lines[start + 1..] {
        if line.trim_start().starts_with("File \"") {
            innermost = Some(line);
        } else if !line.is_empty() && !line.starts_with(' ') {
            let file = innermost?;
            return ARGUMENT_PROCESSING.iter().any(|f| file.contains(f)).then(|| line.trim().to_owned());
        }
    }
    None
}

/// `line` without its ANSI escape sequences (a terminal's colours).
fn without_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: `ESC [` parameters, then a final byte from `@` to `~`.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Names the reason an engine exited during startup, from its exit status
/// and its log.
pub fn classify_exit(status: String, log: &str) -> EngineError {
    let last = |pat: &[&str]| {
        log.lines().rev().find(|l| pat.iter().any(|p| l.to_lowercase().contains(p))).map(|l| l.trim().to_owned())
    };
    if status.contains(OOM_KILLED) {
        return EngineError::OutOfMemory { message: status };
    }
    // What argparse refuses, and what vLLM's configuration checks refuse
    // after it (pydantic's "Value error, " line says why; a parallel size
    // over the GPUs it was given among them): the same flags fail on every
    // host.
    let refused = [
        "unrecognized arguments",
        "invalid choice",
        "unknown flag",
        "invalid value",
        "ambiguous option",
        "expected one argument",
        "expected at least one argument",
        "ignored explicit argument",
        "the following arguments are required",
        "value error, ",
    ];
    if let Some(line) = last(&refused) {
        return EngineError::BadFlag { message: line };
    }
    if let Some(line) = argument_refusal(log) {
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

    /// A pool of its own, outside the default range the other tests' engines
    /// take from.
    fn pool(first: u16, last: u16) -> &'static EnginePorts {
        Box::leak(Box::new(EnginePorts::new(first, last).expect("a range")))
    }

    #[test]
    fn engine_ports_come_from_their_range_once_each_until_given_back() {
        let ports = pool(31100, 31103);
        let held: Vec<EnginePort> = (0..4).map(|_| ports.take().expect("a free port")).collect();
        let mut numbers: Vec<u16> = held.iter().map(EnginePort::number).collect();
        numbers.sort_unstable();
        assert_eq!(numbers, [31100, 31101, 31102, 31103], "each port once");
        let full = ports.take().expect_err("all four are kept");
        assert!(full.to_string().contains("no free engine port in 31100-31103: 4 kept for engines"), "{full}");
        drop(held);
        assert!((31100..=31103).contains(&ports.take().expect("given back").number()));
    }

    #[test]
    fn a_port_someone_listens_on_is_skipped() {
        let ports = pool(31110, 31111);
        let busy = std::net::TcpListener::bind(("127.0.0.1", 31110)).expect("bind");
        let a = ports.take().expect("the other port");
        assert_eq!(a.number(), 31111);
        assert!(ports.take().is_err(), "31110 is in use, 31111 kept");
        drop(busy);
        assert_eq!(ports.take().expect("free again").number(), 31110);
    }

    #[test]
    fn each_engine_kind_empties_its_cache_its_own_way() {
        assert_eq!(cache_reset_path("sglang"), "/flush_cache");
        assert_eq!(cache_reset_path("vllm"), "/reset_prefix_cache");
        // vLLM serves its reset only in development mode; SGLang always.
        assert_eq!(engine_env("vllm"), [("VLLM_SERVER_DEV_MODE".to_owned(), "1".to_owned())]);
        assert!(engine_env("sglang").is_empty());
    }

    #[test]
    fn engine_port_ranges_are_checked() {
        assert_eq!(EnginePorts::parse_range("20000-29999"), Ok((20000, 29999)));
        assert!(EnginePorts::parse_range("20000").expect_err("no range").contains("FIRST-LAST"));
        assert!(EnginePorts::parse_range("a-b").is_err());
        assert!(EnginePorts::new(300, 200).is_err());
        let ports = pool(31120, 31121);
        let overlap = ports.set_range(30000, 40000, Some((32768, 60999))).expect_err("overlaps");
        assert!(overlap.contains("overlap the kernel's ephemeral range 32768-60999"), "{overlap}");
        ports.set_range(31130, 31130, Some((32768, 60999))).expect("outside");
        assert_eq!(ports.take().expect("the one port").number(), 31130);
        // The default range is outside the usual ephemeral range.
        let (lo, hi) = DEFAULT_ENGINE_PORTS;
        assert!(hi < 32768 && lo <= hi);
    }

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
        check(
            "(APIServer pid=1) pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig\n  \
             Value error, World size (2) is larger than the number of available GPUs (1) in this node.",
            "the engine rejected its flags: Value error, World size (2) is larger than the number of available GPUs \
             (1) in this node.",
        );
        check(
            "usage: launch_server.py\nlaunch_server.py: error: ambiguous option: --pp could match --pp-size, --pp-async-batch-depth",
            "the engine rejected its flags: launch_server.py: error: ambiguous option: --pp could match --pp-size, \
             --pp-async-batch-depth",
        );
        // What the engines' own checks of their arguments raise, after the parser: the innermost
        // frame of the traceback is their argument processing.
        check(
            "Traceback (most recent call last):\n  File \"<frozen runpy>\", line 198, in _run_module_as_main\n  \
             File \"/sgl-workspace/sglang/python/sglang/srt/server_args.py\", line 709, in __post_init__\n    \
             self._handle_speculative_decoding()\n  \
             File \"/sgl-workspace/sglang/python/sglang/srt/server_args.py\", line 2508, in _handle_speculative_decoding\n    \
             raise ValueError(\n\
             ValueError: Currently ngram speculative decoding does not support dp attention.\n[shutting down]",
            "the engine rejected its flags: ValueError: Currently ngram speculative decoding does not support dp \
             attention.",
        );
        check(
            "(APIServer pid=1) Traceback (most recent call last):\n\
             (APIServer pid=1)   File \"/usr/local/lib/python3.12/dist-packages/vllm/engine/arg_utils.py\", line 1499, in create_engine_config\n\
             (APIServer pid=1)     raise ValueError(\"...\")\n\
             (APIServer pid=1)     ^^^^^^^^^^^^^^^^\n\
             (APIServer pid=1) ValueError: --kv-sharing-fast-prefill requires a model with shared layers",
            "the engine rejected its flags: ValueError: --kv-sharing-fast-prefill requires a model with shared layers",
        );
        // A traceback that passed through the argument processing but failed deeper (the model's
        // config could not be fetched) is the host's or the network's, not the flags'.
        check(
            "Traceback (most recent call last):\n  \
             File \"/sgl-workspace/sglang/python/sglang/srt/server_args.py\", line 2397, in _handle_speculative_decoding\n    \
             model_arch = self.get_model_config().hf_config.architectures[0]\n  \
             File \"/usr/lib/python3/dist-packages/huggingface_hub/file_download.py\", line 1484, in hf_hub_download\n\
             OSError: We couldn't connect to 'https://huggingface.co'",
            "the engine exited during startup (exit status: 2): OSError: We couldn't connect to 'https://huggingface.co'",
        );
        // Coloured prefixes are read through; a traceback raised while handling another is not
        // the flags' (the first may be the host's), nor is a frame after the exception's line.
        check(
            "\x1b[1;36m(APIServer pid=1)\x1b[0;0m Traceback (most recent call last):\n\
             \x1b[1;36m(APIServer pid=1)\x1b[0;0m   File \"/v/vllm/engine/arg_utils.py\", line 9, in create_engine_config\n\
             \x1b[1;36m(APIServer pid=1)\x1b[0;0m ValueError: bad value",
            "the engine rejected its flags: ValueError: bad value",
        );
        check(
            "Traceback (most recent call last):\n  File \"/h/huggingface_hub/file_download.py\", line 1, in get\n\
             OSError: no network\n\nThe above exception was the direct cause of the following exception:\n\n\
             Traceback (most recent call last):\n  File \"/s/sglang/srt/server_args.py\", line 2, in __post_init__\n\
             ValueError: failed to load config",
            "the engine exited during startup (exit status: 2): ValueError: failed to load config",
        );
        check(
            "Traceback (most recent call last):\n  File \"/p/sglang/srt/model_runner.py\", line 3, in load\n\
             RuntimeError: CUDA error\nFatal Python error: Aborted\n  File \"/s/sglang/srt/server_args.py\", line 4 in f",
            "the engine exited during startup (exit status: 2):   File \"/s/sglang/srt/server_args.py\", line 4 in f",
        );
        check("loading\nsegfault", "the engine exited during startup (exit status: 2): segfault");
        assert_eq!(
            classify_exit(format!("exit status: 137, {OOM_KILLED}"), "loading weights").to_string(),
            format!("the engine ran out of memory: exit status: 137, {OOM_KILLED}")
        );
    }

    #[test]
    fn the_log_tail_keeps_whole_lines_and_the_last_ones() {
        let tail = LogTail::default();
        let mut partial = Vec::new();
        tail.push_bytes(&mut partial, b"first\r\nsec");
        tail.push_bytes(&mut partial, b"ond\nthi");
        assert_eq!(tail.text(), "first\nsecond");
        tail.finish(&mut partial);
        assert_eq!(tail.text(), "first\nsecond\nthi");
        for i in 0..LOG_TAIL_LINES {
            tail.push(format!("line {i}"));
        }
        let text = tail.text();
        assert_eq!(text.lines().count(), LOG_TAIL_LINES);
        assert!(text.starts_with("line 0\n") && text.ends_with(&format!("line {}", LOG_TAIL_LINES - 1)));
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

    /// A stand-in engine: a shell that runs `script` with a worker process in
    /// its group, writing the worker's pid to `pid_file`.
    async fn shell_engine(script: &str, pid_file: &std::path::Path, grace: Duration) -> Box<dyn Engine> {
        let script = format!("{script}; sleep 1000 & echo $! > {}; wait", pid_file.display());
        let runtime = ProcessRuntime {
            launcher: vec!["sh".into(), "-c".into(), script, "sh".into()],
            env: Vec::new(),
            stop_grace: grace,
            pids: None,
            sim_speed: None,
        };
        let launch = EngineLaunch { kind: "vllm".into(), model: "m".into(), ..EngineLaunch::default() };
        let engine = runtime.start(&launch).await.expect("the shell starts");
        for _ in 0..100 {
            if std::fs::read_to_string(pid_file).is_ok_and(|p| !p.trim().is_empty()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        engine
    }

    fn alive(pid_file: &std::path::Path) -> bool {
        let pid = std::fs::read_to_string(pid_file).expect("pid file");
        // A zombie has been killed; only its exit status is left to collect.
        std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).is_ok_and(|stat| !stat.contains(") Z "))
    }

    /// Whether the worker is gone within a while: a killed process takes a
    /// moment to be torn down.
    async fn gone(pid_file: &std::path::Path) -> bool {
        for _ in 0..100 {
            if !alive(pid_file) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    #[tokio::test]
    async fn stopping_a_process_engine_asks_first_and_takes_its_workers_along() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pid_file = dir.path().join("worker.pid");
        let saw_term = dir.path().join("term");
        let trap = format!("trap 'echo > {}; exit 0' TERM", saw_term.display());
        let engine = shell_engine(&trap, &pid_file, Duration::from_secs(30)).await;
        assert!(alive(&pid_file));
        let started = std::time::Instant::now();
        engine.stop().await;
        assert!(started.elapsed() < Duration::from_secs(10), "SIGTERM was enough");
        assert!(saw_term.exists(), "the engine was asked to stop with SIGTERM");
        assert!(gone(&pid_file).await, "the worker went with the engine");
    }

    #[tokio::test]
    async fn a_startup_failure_is_told_by_the_engine_s_own_last_words_every_time() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        for _ in 0..20 {
            let runtime = ProcessRuntime {
                launcher: vec![
                    "sh".into(),
                    "-c".into(),
                    "echo loading >&1; echo 'vllm: error: unrecognized arguments: --bogus' >&2; exit 2".into(),
                    "sh".into(),
                ],
                stop_grace: Duration::from_secs(1),
                ..ProcessRuntime::default()
            };
            let launch = EngineLaunch { kind: "vllm".into(), model: "m".into(), ..EngineLaunch::default() };
            let mut engine = runtime.start(&launch).await.expect("the shell starts");
            let err = wait_until_serving(engine.as_mut(), "m", Duration::from_secs(10)).await.expect_err("it exits");
            assert_eq!(err.to_string(), "the engine rejected its flags: vllm: error: unrecognized arguments: --bogus");
            engine.stop().await;
        }
    }

    #[test]
    fn an_engine_process_s_environment_is_named_not_inherited() {
        let agent = |name: &str| match name {
            "PATH" => Some("/usr/bin".into()),
            "LANG" => Some("C.UTF-8".into()),
            "HF_TOKEN" | "AWS_SECRET_ACCESS_KEY" => Some("agent_secret".into()),
            _ => None,
        };
        let launch = EngineLaunch {
            kind: "vllm".into(),
            gpu_uuids: vec!["GPU-1".into(), "GPU-2".into()],
            ..EngineLaunch::default()
        };
        let env = process_env(&launch, &[("BENCHFLEET_SIM_GPU".into(), "H200".into())], agent);
        let shown: Vec<String> =
            env.iter().map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy())).collect();
        assert_eq!(
            shown,
            [
                "PATH=/usr/bin",
                "LANG=C.UTF-8",
                "VLLM_SERVER_DEV_MODE=1",
                "CUDA_VISIBLE_DEVICES=GPU-1,GPU-2",
                "BENCHFLEET_SIM_GPU=H200"
            ]
        );
        // The simulator counts simulated GPUs from the list, as an engine counts its devices.
        let simulated = EngineLaunch { gpu_uuids: vec!["GPU-sim-h-0".into(), "GPU-sim-h-1".into()], ..launch };
        let devices = process_env(&simulated, &[], agent).into_iter().find(|(k, _)| k == "CUDA_VISIBLE_DEVICES");
        assert_eq!(devices.map(|(_, v)| v), Some("GPU-sim-h-0,GPU-sim-h-1".into()));
    }

    #[test]
    fn a_process_runtime_shows_its_environment_s_names_only() {
        let runtime =
            ProcessRuntime { env: vec![("HF_TOKEN".into(), "hf_process_secret".into())], ..ProcessRuntime::default() };
        let shown = format!("{runtime:?}");
        assert!(!shown.contains("hf_process_secret"), "{shown}");
        assert!(shown.contains("HF_TOKEN"), "{shown}");
    }

    /// The agent's environment is this test process's; one with a secret in
    /// it is this test run again, by the test binary, with the variable set.
    const AGENT_SECRET: &str = "BENCHFLEET_TEST_AGENT_SECRET";

    #[tokio::test]
    async fn a_process_engine_gets_none_of_the_agent_s_environment() {
        if std::env::var_os(AGENT_SECRET).is_none() {
            let name = "engine::tests::a_process_engine_gets_none_of_the_agent_s_environment";
            let output = std::process::Command::new(std::env::current_exe().expect("the test binary"))
                .args([name, "--exact", "--nocapture", "--test-threads=1"])
                .env(AGENT_SECRET, "agent_secret_value")
                .env("HF_TOKEN", "hf_agent_secret")
                .output()
                .expect("the test binary runs");
            let text = String::from_utf8_lossy(&output.stdout);
            assert!(output.status.success(), "{text}{}", String::from_utf8_lossy(&output.stderr));
            assert!(text.contains("1 passed"), "the test ran again: {text}");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("env");
        let runtime = ProcessRuntime {
            launcher: vec!["sh".into(), "-c".into(), format!("env > {}", out.display()), "sh".into()],
            env: vec![("BENCHFLEET_SIM_GPU".into(), "H200".into())],
            stop_grace: Duration::from_secs(1),
            pids: None,
            sim_speed: Some(crate::gpu::SimSpeed { host: Some(0.5), gpus: Default::default() }),
        };
        let launch = EngineLaunch { kind: "vllm".into(), model: "m".into(), ..EngineLaunch::default() };
        let mut engine = runtime.start(&launch).await.expect("the shell starts");
        for _ in 0..250 {
            if engine.exit_status().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        engine.stop().await;
        let env = std::fs::read_to_string(&out).expect("the engine wrote its environment");
        assert!(!env.contains("agent_secret"), "{env}");
        let names: Vec<&str> = env.lines().filter_map(|l| l.split_once('=').map(|(name, _)| name)).collect();
        // What the shell itself sets, besides what the engine was given.
        let shell = ["PWD", "OLDPWD", "SHLVL", "_"];
        let given = ["VLLM_SERVER_DEV_MODE", "BENCHFLEET_SIM_GPU", "BENCHFLEET_SIM_SPEED"];
        assert!(env.lines().any(|l| l == "BENCHFLEET_SIM_SPEED=0.5"), "a slow simulated host's speed: {env}");
        let unexpected: Vec<&&str> =
            names.iter().filter(|n| !(INHERITED_ENV.contains(n) || shell.contains(n) || given.contains(n))).collect();
        assert!(unexpected.is_empty(), "the engine inherited {unexpected:?}: {env}");
        assert!(env.lines().any(|l| l == "BENCHFLEET_SIM_GPU=H200") && env.contains("VLLM_SERVER_DEV_MODE=1"), "{env}");
        if let Ok(path) = std::env::var("PATH") {
            assert!(env.lines().any(|l| l == format!("PATH={path}")), "PATH is passed on: {env}");
        }
    }

    #[tokio::test]
    async fn an_engine_that_ignores_sigterm_is_killed_after_the_grace_period() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pid_file = dir.path().join("worker.pid");
        let engine = shell_engine("trap '' TERM", &pid_file, Duration::from_millis(300)).await;
        let started = std::time::Instant::now();
        engine.stop().await;
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(gone(&pid_file).await, "the worker was killed too");
    }
}
