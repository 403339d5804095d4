//! The `docker` engine runtime: runs an engine's image in a container through
//! the Docker daemon's API (bollard), with the job's GPUs, host networking,
//! host IPC, the model cache mounted and a deterministic name and labels, so
//! that a restarted agent can find and remove what an earlier one left.
//!
//! The agent keeps the Docker socket to itself: nothing here mounts it into a
//! container.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, ListContainersOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use futures_util::StreamExt;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::engine::{
    Engine, EngineError, EnginePort, EngineRuntime, LogTail, SIMULATED_GPU_PREFIX, engine_command, engine_env,
    free_port,
};
use crate::job::EngineLaunch;

/// The label that names the agent owning a container; `remove_orphans`
/// selects by it.
pub const AGENT_LABEL: &str = "benchfleet.agent";

/// Where the model cache is mounted in the container: the Hugging Face cache
/// of the root user, which is who the vLLM and SGLang images run as.
pub const CONTAINER_MODEL_CACHE: &str = "/root/.cache/huggingface";

/// Requests that may take long: pulls, following a log, waiting for exit,
/// stopping with a grace period. bollard applies one timeout (120 s by
/// default) to every call of a client, so these go through a second one.
const LONG_CALL_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// How often pull progress is reported at most.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// A value that must never reach a log: its `Debug` is redacted.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret::new(s))
    }
}

/// How the agent runs engine containers.
#[derive(Clone, Debug)]
pub struct DockerOptions {
    /// The daemon's socket.
    pub socket: PathBuf,
    /// The host directory mounted at `CONTAINER_MODEL_CACHE`, so that a model
    /// is downloaded once per host, not once per container. None: no mount.
    pub model_cache: Option<PathBuf>,
    /// Passed to the engine as `HF_TOKEN` for gated models. Never logged:
    /// `Secret` hides it from `Debug`, and since bollard logs request bodies
    /// at debug level, the agent's binary caps bollard's logs at info.
    pub hf_token: Option<Secret>,
    /// None: share the host's IPC namespace (`--ipc=host`, what vLLM's and
    /// SGLang's documentation use; tensor-parallel workers exchange data
    /// through shared memory). Some: a private `/dev/shm` of this many bytes.
    pub shm_size_bytes: Option<i64>,
    /// How long an engine has to exit after SIGTERM before it is killed.
    pub stop_grace: Duration,
}

impl Default for DockerOptions {
    fn default() -> Self {
        DockerOptions {
            socket: PathBuf::from("/var/run/docker.sock"),
            model_cache: None,
            hf_token: None,
            shm_size_bytes: None,
            stop_grace: Duration::from_secs(30),
        }
    }
}

/// Whether the agent offers the `docker` runtime.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DockerMode {
    /// When the daemon's socket exists.
    #[default]
    Auto,
    /// Always; the agent does not start without a daemon.
    On,
    Off,
}

/// The agent's command-line options for the `docker` runtime.
#[derive(Clone, Debug, clap::Args)]
pub struct DockerArgs {
    /// Offer the docker runtime: auto (when the daemon's socket exists), on or off.
    #[arg(long = "docker", value_enum, default_value_t = DockerMode::Auto)]
    pub mode: DockerMode,
    /// The Docker daemon's socket.
    #[arg(long, default_value = "/var/run/docker.sock")]
    pub docker_socket: PathBuf,
    /// Host directory mounted as the engines' Hugging Face cache
    /// (default: ~/.cache/huggingface of the agent's user).
    #[arg(long)]
    pub model_cache: Option<PathBuf>,
    /// Token for gated models, given to engines as HF_TOKEN.
    #[arg(long, env = "HF_TOKEN", hide_env_values = true)]
    pub hf_token: Option<Secret>,
    /// Give each engine a private /dev/shm of this many GiB instead of the
    /// host's IPC namespace.
    #[arg(long, value_name = "GIB")]
    pub shm_size_gib: Option<u32>,
    /// Seconds an engine has to exit after SIGTERM before it is killed.
    #[arg(long, default_value_t = 30)]
    pub stop_grace_s: u64,
}

/// The docker runtime the agent's options ask for, connected, after removing
/// the containers an earlier run of agent `agent` left behind (no attempt is
/// live while an agent starts). None when the runtime is off, or on `auto`
/// without a daemon socket.
pub async fn runtime_from_args(args: &DockerArgs, agent: &str) -> anyhow::Result<Option<DockerRuntime>> {
    use anyhow::Context as _;
    if args.mode == DockerMode::Off || (args.mode == DockerMode::Auto && !args.docker_socket.exists()) {
        return Ok(None);
    }
    let model_cache = args
        .model_cache
        .clone()
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache/huggingface")));
    let options = DockerOptions {
        socket: args.docker_socket.clone(),
        model_cache,
        hf_token: args.hf_token.clone(),
        shm_size_bytes: args.shm_size_gib.map(|gib| i64::from(gib) << 30),
        stop_grace: Duration::from_secs(args.stop_grace_s),
    };
    let runtime = DockerRuntime::connect(options)
        .await
        .context("cannot offer the docker runtime (run with --docker off to go without it)")?;
    let removed = remove_orphans(runtime.client(), agent, &[])
        .await
        .context("cannot remove the containers an earlier run of this agent left")?;
    if !removed.is_empty() {
        info!(containers = ?removed, "removed engine containers an earlier run of this agent left");
    }
    Ok(Some(runtime))
}

/// Runs engines as containers of their image.
#[derive(Clone, Debug)]
pub struct DockerRuntime {
    /// For short calls, under bollard's default timeout.
    docker: Docker,
    /// The same connection with `LONG_CALL_TIMEOUT`.
    long: Docker,
    options: DockerOptions,
}

impl DockerRuntime {
    /// Connects to the daemon and agrees on an API version (Debian's daemon
    /// speaks an older one than bollard's default).
    pub async fn connect(options: DockerOptions) -> Result<Self, EngineError> {
        let socket = options.socket.display().to_string();
        let unreachable = |e: BollardError| EngineError::Container {
            action: format!("reach the Docker daemon at {socket}"),
            message: format!("{e}; start dockerd, or run engines with another runtime"),
        };
        let docker = Docker::connect_with_unix(&socket, 120, bollard::API_DEFAULT_VERSION)
            .map_err(unreachable)?
            .negotiate_version()
            .await
            .map_err(unreachable)?;
        let long = docker.clone().with_timeout(LONG_CALL_TIMEOUT);
        Ok(DockerRuntime { docker, long, options })
    }

    /// The daemon connection, for `remove_orphans` and tests.
    pub fn client(&self) -> &Docker {
        &self.docker
    }

    /// Pulls `image` unless the daemon has it already.
    async fn ensure_image(&self, image: &str, progress: &(dyn Fn(String) + Send + Sync)) -> Result<(), EngineError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => return Ok(()),
            Err(e) if status_code(&e) == Some(404) => {}
            Err(e) => return Err(container_error(format!("inspect the image {image}"), e)),
        }
        let reference = with_tag(image);
        info!(image = %reference, "pulling the engine image");
        let missing = |message: String| EngineError::ImageMissing { image: image.to_owned(), message };
        let options = CreateImageOptionsBuilder::new().from_image(&reference).build();
        let mut pull = self.long.create_image(Some(options), None, None);
        let mut layers = PullProgress::default();
        let mut last_report: Option<Instant> = None;
        while let Some(item) = pull.next().await {
            let info = item.map_err(|e| missing(server_message(e)))?;
            if let Some(error) = info.error_detail.and_then(|d| d.message) {
                return Err(missing(error));
            }
            layers.update(
                info.id.as_deref(),
                info.status.as_deref(),
                info.progress_detail.map(|p| (p.current, p.total)),
            );
            if last_report.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
                last_report = Some(Instant::now());
                progress(layers.line(&reference));
            }
        }
        progress(format!("pulled {reference}"));
        Ok(())
    }

    /// The options of one engine container.
    fn container_body(&self, launch: &EngineLaunch, cmd: Vec<String>) -> ContainerCreateBody {
        let gpus: Vec<String> =
            launch.gpu_uuids.iter().filter(|u| !u.starts_with(SIMULATED_GPU_PREFIX)).cloned().collect();
        let device_requests = (!gpus.is_empty()).then(|| {
            vec![DeviceRequest {
                driver: Some("nvidia".into()),
                device_ids: Some(gpus),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..DeviceRequest::default()
            }]
        });
        let mounts = self.options.model_cache.as_ref().map(|dir| {
            vec![Mount {
                target: Some(CONTAINER_MODEL_CACHE.into()),
                source: Some(dir.display().to_string()),
                typ: Some(MountType::BIND),
                ..Mount::default()
            }]
        });
        let mut env: Vec<String> = engine_env(&launch.kind).into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        // Real GPUs reach the container through the device request; a
        // simulated engine counts simulated ones from the list.
        let simulated: Vec<&str> =
            launch.gpu_uuids.iter().map(String::as_str).filter(|u| u.starts_with(SIMULATED_GPU_PREFIX)).collect();
        if !simulated.is_empty() {
            env.push(format!("CUDA_VISIBLE_DEVICES={}", simulated.join(",")));
        }
        env.extend(self.options.hf_token.as_ref().map(|t| format!("HF_TOKEN={}", t.expose())));
        let env = (!env.is_empty()).then_some(env);
        let (ipc_mode, shm_size) = match self.options.shm_size_bytes {
            None => (Some("host".to_owned()), None),
            Some(bytes) => (None, Some(bytes)),
        };
        ContainerCreateBody {
            image: Some(launch.image.clone()),
            cmd: Some(cmd),
            env,
            labels: Some(launch.labels.iter().cloned().collect()),
            host_config: Some(HostConfig {
                network_mode: Some("host".into()),
                ipc_mode,
                shm_size,
                mounts,
                device_requests,
                ..HostConfig::default()
            }),
            ..ContainerCreateBody::default()
        }
    }

    /// Creates the container. Names are per attempt, so one of the same name
    /// that this agent started is a leftover of this very attempt and is
    /// replaced; another agent's is left alone.
    async fn create(&self, name: &str, body: ContainerCreateBody) -> Result<(), EngineError> {
        let options = || CreateContainerOptionsBuilder::new().name(name).build();
        match self.docker.create_container(Some(options()), body.clone()).await {
            Ok(_) => return Ok(()),
            Err(e) if status_code(&e) == Some(409) => {
                let label = |labels: Option<&HashMap<String, String>>| labels.and_then(|l| l.get(AGENT_LABEL)).cloned();
                let ours = label(body.labels.as_ref());
                let theirs = match self.docker.inspect_container(name, None).await {
                    Ok(c) => label(c.config.and_then(|c| c.labels).as_ref()),
                    Err(e) => return Err(container_error(format!("inspect the existing container {name}"), e)),
                };
                if ours.is_none() || ours != theirs {
                    return Err(EngineError::Container {
                        action: format!("create the container {name}"),
                        message: format!(
                            "a container of that name already exists and belongs to agent {}; \
                             remove it (docker rm -f {name}) if nothing uses it",
                            theirs.as_deref().unwrap_or("(none)")
                        ),
                    });
                }
                warn!(container = name, "replacing a leftover container of this attempt");
                force_remove(&self.docker, name).await;
            }
            Err(e) if status_code(&e) == Some(404) => {
                let image = body.image.clone().unwrap_or_default();
                return Err(EngineError::ImageMissing { image, message: server_message(e) });
            }
            Err(e) => return Err(container_error(format!("create the container {name}"), e)),
        }
        self.docker
            .create_container(Some(options()), body)
            .await
            .map(drop)
            .map_err(|e| container_error(format!("create the container {name}"), e))
    }
}

#[tonic::async_trait]
impl EngineRuntime for DockerRuntime {
    async fn prepare(
        &self,
        launch: &EngineLaunch,
        progress: &(dyn Fn(String) + Send + Sync),
    ) -> Result<(), EngineError> {
        self.ensure_image(&launch.image, progress).await
    }

    async fn start(&self, launch: &EngineLaunch) -> Result<Box<dyn Engine>, EngineError> {
        if launch.image.is_empty() {
            return Err(EngineError::Container {
                action: format!("start the engine {}", launch.config_name),
                message: "it has no image; name one in the matrix's engine".into(),
            });
        }
        // `prepare` pulled the image already, when the agent called it.
        self.ensure_image(&launch.image, &|line| info!("{line}")).await?;
        let (entrypoint, image_digest) = match self.docker.inspect_image(&launch.image).await {
            // A pulled image has a repository digest; one built here only its id.
            Ok(image) => (
                image.config.and_then(|c| c.entrypoint).unwrap_or_default(),
                image.repo_digests.and_then(|d| d.into_iter().next()).or(image.id),
            ),
            Err(e) => return Err(container_error(format!("inspect the image {}", launch.image), e)),
        };
        let port = free_port()
            .map_err(|e| EngineError::Container { action: "take an engine port".into(), message: e.to_string() })?;
        let cmd = container_command(&entrypoint, engine_command(launch, "127.0.0.1", port.number()));
        let name = container_name(launch, port.number());
        if let Some(dir) = &self.options.model_cache {
            // A bind mount needs its source to exist; the daemon creates none.
            tokio::fs::create_dir_all(dir).await.map_err(|e| EngineError::Container {
                action: format!("create the model cache directory {}", dir.display()),
                message: e.to_string(),
            })?;
        }
        self.create(&name, self.container_body(launch, cmd)).await?;
        if let Err(e) = self.docker.start_container(&name, None).await {
            force_remove(&self.docker, &name).await;
            return Err(container_error(format!("start the container {name}"), e));
        }
        info!(container = %name, image = %launch.image, port = port.number(), "engine container started");

        let log = LogTail::default();
        let follower = tokio::spawn(follow_log(self.long.clone(), name.clone(), log.clone()));
        let exited = Arc::new(OnceLock::new());
        let watcher = tokio::spawn(watch_exit(self.long.clone(), name.clone(), follower, exited.clone()));
        Ok(Box::new(DockerEngine {
            docker: self.docker.clone(),
            long: self.long.clone(),
            name,
            port,
            log,
            exited,
            watcher,
            stop_grace: self.options.stop_grace,
            removed: false,
            image_digest,
        }))
    }
}

/// The container's command: the engine's command line without the words the
/// image's entrypoint already says. `vllm/vllm-openai` has the entrypoint
/// `vllm serve`, so it gets the model and flags; an image without an
/// entrypoint (SGLang's) or with a wrapper (the simulator's, NVIDIA's
/// `nvidia_entrypoint.sh`) gets the whole command line.
pub fn container_command(entrypoint: &[String], command: Vec<String>) -> Vec<String> {
    if !entrypoint.is_empty() && command.starts_with(entrypoint) {
        command[entrypoint.len()..].to_vec()
    } else {
        command
    }
}

/// The agent names each container after its attempt; a launch without one
/// (a caller other than the agent) gets one from its configuration and port.
fn container_name(launch: &EngineLaunch, port: u16) -> String {
    let name = if launch.instance_name.is_empty() {
        format!("benchfleet-{}-{port}", launch.config_name)
    } else {
        launch.instance_name.clone()
    };
    // Docker allows [a-zA-Z0-9_.-] after the first character.
    name.chars().map(|c| if c.is_ascii_alphanumeric() || "_.-".contains(c) { c } else { '-' }).collect()
}

/// Copies the container's output into its log tail until the container
/// stops (the daemon ends a followed log then).
async fn follow_log(docker: Docker, name: String, log: LogTail) {
    let options = LogsOptionsBuilder::new().follow(true).stdout(true).stderr(true).build();
    let mut stream = docker.logs(&name, Some(options));
    // Separate buffers, so a line cut between two chunks of one stream is
    // not joined with the other stream's output.
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Some(item) = stream.next().await {
        match item {
            Ok(bollard::container::LogOutput::StdErr { message }) => log.push_bytes(&mut err, &message),
            Ok(output) => log.push_bytes(&mut out, &output.into_bytes()),
            Err(e) => {
                log.push(format!("(benchfleet: the container's log broke off: {e})"));
                break;
            }
        }
    }
    log.finish(&mut out);
    log.finish(&mut err);
}

/// Waits until the container stops, then records how it ended, once its log
/// is complete, so the startup classification sees the last lines.
async fn watch_exit(docker: Docker, name: String, follower: JoinHandle<()>, exited: Arc<OnceLock<String>>) {
    let waited = docker.wait_container(&name, None).next().await;
    // The followed log ends with the container; a daemon that keeps it open
    // longer must not hold the status back.
    let _ = tokio::time::timeout(Duration::from_secs(5), follower).await;
    let status = match docker.inspect_container(&name, None).await {
        Ok(c) => {
            let state = c.state.unwrap_or_default();
            let mut status = format!("exit status: {}", state.exit_code.unwrap_or(-1));
            if state.oom_killed == Some(true) {
                status.push_str(&format!(", {}", crate::engine::OOM_KILLED));
            }
            status
        }
        Err(e) => match waited {
            Some(Err(BollardError::DockerContainerWaitError { code, .. })) => format!("exit status: {code}"),
            _ => format!("the container is gone: {}", server_message(e)),
        },
    };
    let _ = exited.set(status);
}

struct DockerEngine {
    docker: Docker,
    long: Docker,
    name: String,
    port: EnginePort,
    log: LogTail,
    /// Set by `watch_exit` once the container has stopped.
    exited: Arc<OnceLock<String>>,
    watcher: JoinHandle<()>,
    stop_grace: Duration,
    /// Whether `stop` removed the container; otherwise dropping the engine
    /// (an abandoned group) removes it.
    removed: bool,
    image_digest: Option<String>,
}

#[tonic::async_trait]
impl Engine for DockerEngine {
    fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port.number())
    }

    fn log_tail(&self) -> String {
        self.log.text()
    }

    fn exit_status(&mut self) -> Option<String> {
        self.exited.get().cloned()
    }

    fn image_digest(&self) -> Option<String> {
        self.image_digest.clone()
    }

    async fn stop(mut self: Box<Self>) {
        let grace = i32::try_from(self.stop_grace.as_secs()).unwrap_or(i32::MAX);
        let options = StopContainerOptionsBuilder::new().t(grace).build();
        if let Err(e) = self.long.stop_container(&self.name, Some(options)).await
            && status_code(&e) != Some(304)
        {
            warn!(container = %self.name, "cannot stop the engine container: {e}");
        }
        self.watcher.abort();
        force_remove(&self.docker, &self.name).await;
        self.removed = true;
    }
}

impl Drop for DockerEngine {
    fn drop(&mut self) {
        self.watcher.abort();
        if self.removed {
            return;
        }
        // A group abandoned with its session drops its engine without
        // stopping it; the container would hold the GPUs until the agent
        // restarts. Remove it in the background where a runtime still runs
        // (a crashed agent leaves it to `remove_orphans`).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (docker, name) = (self.docker.clone(), self.name.clone());
            runtime.spawn(async move { force_remove(&docker, &name).await });
        }
    }
}

/// Removes the containers that `agent` started and that belong to none of
/// the `live` containers (by name): those an earlier run of the agent left
/// when it died. Returns the names of the removed containers.
pub async fn remove_orphans(docker: &Docker, agent: &str, live: &[String]) -> Result<Vec<String>, EngineError> {
    let filters = HashMap::from([("label", vec![format!("{AGENT_LABEL}={agent}")])]);
    let options = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
    let containers = docker
        .list_containers(Some(options))
        .await
        .map_err(|e| container_error(format!("list the containers of agent {agent}"), e))?;
    let mut removed = Vec::new();
    for container in containers {
        let Some(name) = container.names.into_iter().flatten().next() else { continue };
        let name = name.trim_start_matches('/').to_owned();
        if live.contains(&name) {
            continue;
        }
        let options = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
        match docker.remove_container(&name, Some(options)).await {
            Ok(()) => {
                info!(container = %name, "removed a container an earlier run of this agent left");
                removed.push(name);
            }
            Err(e) if status_code(&e) == Some(404) => {}
            Err(e) => return Err(container_error(format!("remove the orphaned container {name}"), e)),
        }
    }
    Ok(removed)
}

/// Removes a container, running or not; one that is already gone is fine.
async fn force_remove(docker: &Docker, name: &str) {
    let options = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
    match docker.remove_container(name, Some(options)).await {
        Ok(()) => {}
        Err(e) if status_code(&e) == Some(404) => {}
        Err(e) => warn!(container = name, "cannot remove the engine container: {e}"),
    }
}

/// Adds `:latest` to an image without a tag or digest: the pull API fetches
/// every tag of a repository given without one.
fn with_tag(image: &str) -> String {
    let last = image.rsplit('/').next().unwrap_or(image);
    if last.contains(':') || last.contains('@') { image.to_owned() } else { format!("{image}:latest") }
}

fn status_code(e: &BollardError) -> Option<u16> {
    match e {
        BollardError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// The daemon's own words for an error, without bollard's wrapping.
fn server_message(e: BollardError) -> String {
    match e {
        BollardError::DockerResponseServerError { message, .. } => message,
        other => other.to_string(),
    }
}

fn container_error(action: String, e: BollardError) -> EngineError {
    let mut message = server_message(e);
    if message.contains("could not select device driver") {
        message.push_str(" (is the NVIDIA Container Toolkit installed and configured for Docker?)");
    }
    EngineError::Container { action, message }
}

/// The layers of a pull and how far each has come, for a one-line summary.
#[derive(Debug, Default)]
struct PullProgress {
    /// Layer id -> (bytes downloaded, bytes in all; 0 when not yet known).
    layers: HashMap<String, (i64, i64)>,
    done: usize,
}

impl PullProgress {
    fn update(&mut self, id: Option<&str>, status: Option<&str>, detail: Option<(Option<i64>, Option<i64>)>) {
        let (Some(id), Some(status)) = (id, status) else { return };
        // The first message of a pull carries the tag as its id.
        if status.starts_with("Pulling from") {
            return;
        }
        let layer = self.layers.entry(id.to_owned()).or_default();
        match status {
            "Downloading" => {
                if let Some((current, total)) = detail {
                    *layer = (current.unwrap_or(layer.0), total.unwrap_or(layer.1));
                }
            }
            "Download complete" | "Already exists" | "Pull complete" => {
                layer.0 = layer.1;
                if status != "Download complete" {
                    self.done += 1;
                }
            }
            _ => {}
        }
    }

    fn line(&self, image: &str) -> String {
        let (current, total) = self.layers.values().fold((0, 0), |(c, t), (lc, lt)| (c + lc, t + lt));
        let gb = |bytes: i64| bytes as f64 / 1e9;
        format!(
            "pulling {image}: {:.2} of {:.2} GB, {} of {} layers done",
            gb(current),
            gb(total),
            self.done.min(self.layers.len()),
            self.layers.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    fn check_command(entrypoint: &str, expected: &str) {
        let command = words("vllm serve m --host 127.0.0.1 --port 9");
        assert_eq!(container_command(&words(entrypoint), command).join(" "), expected);
    }

    #[test]
    fn the_command_skips_what_the_entrypoint_says() {
        check_command("vllm serve", "m --host 127.0.0.1 --port 9");
        check_command("", "vllm serve m --host 127.0.0.1 --port 9");
        check_command("/benchfleet-sim", "vllm serve m --host 127.0.0.1 --port 9");
        check_command("/opt/nvidia/nvidia_entrypoint.sh", "vllm serve m --host 127.0.0.1 --port 9");
    }

    #[test]
    fn images_without_a_tag_get_latest() {
        for (image, expected) in [
            ("vllm/vllm-openai", "vllm/vllm-openai:latest"),
            ("vllm/vllm-openai:v0.17.1", "vllm/vllm-openai:v0.17.1"),
            ("registry:5000/sglang", "registry:5000/sglang:latest"),
            ("sglang@sha256:abc", "sglang@sha256:abc"),
        ] {
            assert_eq!(with_tag(image), expected);
        }
    }

    #[test]
    fn container_names_are_the_attempts_and_valid() {
        let launch = EngineLaunch { instance_name: "benchfleet-r1-0-1".into(), ..EngineLaunch::default() };
        assert_eq!(container_name(&launch, 9), "benchfleet-r1-0-1");
        let launch = EngineLaunch { config_name: "vllm+fp8 kv".into(), ..EngineLaunch::default() };
        assert_eq!(container_name(&launch, 9), "benchfleet-vllm-fp8-kv-9");
    }

    fn runtime(options: DockerOptions) -> DockerRuntime {
        // Building a client does not connect, so no daemon is needed here.
        let docker = Docker::connect_with_http("http://127.0.0.1:1", 1, bollard::API_DEFAULT_VERSION)
            .expect("a client for an unused address");
        DockerRuntime { long: docker.clone(), docker, options }
    }

    #[test]
    fn containers_get_real_gpus_host_networking_and_the_cache() {
        let options = DockerOptions {
            model_cache: Some(PathBuf::from("/srv/hf")),
            hf_token: Some(Secret::new("hf_secret")),
            ..DockerOptions::default()
        };
        let launch = EngineLaunch {
            image: "vllm/vllm-openai:v0.17.1".into(),
            labels: vec![(AGENT_LABEL.into(), "a1".into())],
            gpu_uuids: vec!["GPU-1".into(), "GPU-2".into()],
            ..EngineLaunch::default()
        };
        let body = runtime(options).container_body(&launch, words("m --port 9"));
        let host = body.host_config.expect("host config");
        assert_eq!(host.network_mode.as_deref(), Some("host"));
        assert_eq!(host.ipc_mode.as_deref(), Some("host"));
        let request = &host.device_requests.expect("GPUs requested")[0];
        assert_eq!(request.driver.as_deref(), Some("nvidia"));
        assert_eq!(request.device_ids, Some(vec!["GPU-1".to_owned(), "GPU-2".to_owned()]));
        assert_eq!(request.capabilities, Some(vec![vec!["gpu".to_owned()]]));
        let mount = &host.mounts.expect("the model cache")[0];
        assert_eq!((mount.source.as_deref(), mount.target.as_deref()), (Some("/srv/hf"), Some(CONTAINER_MODEL_CACHE)));
        assert_eq!(body.env, Some(vec!["VLLM_SERVER_DEV_MODE=1".to_owned(), "HF_TOKEN=hf_secret".to_owned()]));
        assert_eq!(body.labels.expect("labels").get(AGENT_LABEL).map(String::as_str), Some("a1"));
        assert_eq!(body.cmd, Some(words("m --port 9")));
    }

    #[test]
    fn simulated_gpus_and_a_private_shm_request_no_devices() {
        let options = DockerOptions { shm_size_bytes: Some(1 << 30), ..DockerOptions::default() };
        let launch = EngineLaunch { gpu_uuids: vec!["GPU-sim-host-0".into()], ..EngineLaunch::default() };
        let body = runtime(options).container_body(&launch, Vec::new());
        // The simulator counts the job's GPUs from the list.
        assert!(body.env.expect("env").contains(&"CUDA_VISIBLE_DEVICES=GPU-sim-host-0".to_owned()));
        let host = body.host_config.expect("host config");
        assert_eq!(host.device_requests, None);
        assert_eq!((host.ipc_mode, host.shm_size), (None, Some(1 << 30)));
        assert_eq!(host.mounts, None);
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let options = DockerOptions { hf_token: Some(Secret::new("hf_secret")), ..DockerOptions::default() };
        let args = DockerArgs {
            mode: DockerMode::On,
            docker_socket: PathBuf::from("/var/run/docker.sock"),
            model_cache: None,
            hf_token: Some(Secret::new("hf_secret")),
            shm_size_gib: None,
            stop_grace_s: 30,
        };
        let process = crate::engine::ProcessRuntime {
            env: vec![("HF_TOKEN".into(), "hf_secret".into())],
            ..crate::engine::ProcessRuntime::default()
        };
        let launch = EngineLaunch { image: "vllm/vllm-openai:v1".into(), ..EngineLaunch::default() };
        let body = runtime(options.clone()).container_body(&launch, Vec::new());
        for shown in [
            format!("{:?}", runtime(options.clone())),
            format!("{options:?}"),
            format!("{args:?}"),
            format!("{process:?}"),
            format!("{launch:?}"),
            format!("{:?}", crate::policy::EnginePolicy::default()),
        ] {
            assert!(!shown.contains("hf_secret"), "{shown}");
        }
        assert!(format!("{options:?}").contains("<redacted>"));
        // What the daemon is sent has it, and bollard logs request bodies at
        // debug level: the agent's binary caps bollard's logs at info.
        assert!(body.env.expect("the engine's environment").contains(&"HF_TOKEN=hf_secret".to_owned()));
    }

    #[tokio::test]
    async fn a_refused_image_is_never_asked_of_the_daemon() {
        // Nothing listens at the client's address: any call to the daemon
        // fails as the container runtime's error, not the policy's.
        let policy = std::sync::Arc::new(crate::policy::EnginePolicy::default());
        let runtime: std::sync::Arc<dyn EngineRuntime> = std::sync::Arc::new(runtime(DockerOptions::default()));
        let offered = policy.offered([("docker".to_owned(), runtime)]);
        let launch =
            |image: &str| EngineLaunch { image: image.into(), runtime: "docker".into(), ..EngineLaunch::default() };
        let refused = offered["docker"].prepare(&launch("evil/miner:latest"), &|_| {}).await.expect_err("refused");
        assert_eq!(
            refused.to_string(),
            "image 'evil/miner:latest' is not allowed on this agent: add it to [engines] images in the agent's config file"
        );
        let reached = offered["docker"].prepare(&launch("vllm/vllm-openai:v1"), &|_| {}).await.expect_err("no daemon");
        assert!(matches!(reached, EngineError::Container { .. }), "an allowed image goes to the daemon: {reached:?}");
    }

    #[test]
    fn pull_progress_sums_the_layers() {
        let mut p = PullProgress::default();
        p.update(Some("v1"), Some("Pulling from vllm/vllm-openai"), None);
        p.update(Some("a"), Some("Already exists"), None);
        p.update(Some("b"), Some("Downloading"), Some((Some(500_000_000), Some(2_000_000_000))));
        p.update(Some("c"), Some("Downloading"), Some((Some(250_000_000), Some(1_000_000_000))));
        assert_eq!(p.line("i:t"), "pulling i:t: 0.75 of 3.00 GB, 1 of 3 layers done");
        p.update(Some("b"), Some("Download complete"), None);
        p.update(Some("b"), Some("Pull complete"), None);
        assert_eq!(p.line("i:t"), "pulling i:t: 2.25 of 3.00 GB, 2 of 3 layers done");
    }
}
