//! deploy/compose/: both files pass Debian's `docker-compose config` (1.29)
//! and say what a fleet needs of them (the host's network, TLS, the join
//! before the agent); and the simulator's stack runs a matrix end to end,
//! as deploy/README.md says to run it: images from deploy/build-images.sh
//! (of the binaries built here, under a tag of this test's own), the PKI and
//! a join token made with the CLI's image before `up`, `docker-compose up`,
//! a run submitted over mutual TLS as the admin, its report read back, and a
//! second `up` over the same directories (the join does nothing then).
//! Every container, and the images, are removed even when a check fails.
//! scripts/test starts the Docker daemon and installs docker-compose.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::faults::bin;

/// The controller's user in its image (deploy/build-images.sh).
const CONTROLLER_UID: u32 = 65532;

fn compose_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/compose")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// What a command printed and how it ended.
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Runs `cmd` for at most `within` (killed then); its output goes through
/// files, so a chatty command never blocks on a full pipe.
fn run(cmd: &mut Command, within: Duration) -> Ran {
    let what = format!("{cmd:?}");
    let out = tempfile::tempfile().expect("a temp file");
    let err = tempfile::tempfile().expect("a temp file");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("file"))
        .stderr(err.try_clone().expect("file"))
        .spawn()
        .unwrap_or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => panic!(
                "{what}: not installed; scripts/test installs docker.io and docker-compose (apt-get install -y \
                 docker.io docker-compose)"
            ),
            _ => panic!("cannot run {what}: {e}"),
        });
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |mut f: std::fs::File| {
        use std::io::{Read as _, Seek as _};
        let mut s = String::new();
        f.rewind().expect("rewind");
        let _ = f.read_to_string(&mut s);
        s
    };
    let (stdout, mut stderr) = (read(out), read(err));
    if status.is_none() {
        stderr.push_str(&format!("\n(killed after {within:?})"));
    }
    Ran { ok: status.is_some_and(|s| s.success()), stdout, stderr }
}

/// `docker-compose` with only the given variables of benchfleet's (none of
/// this shell's BENCHFLEET_*), colourless.
fn compose(env: &[(String, String)]) -> Command {
    let mut cmd = Command::new("docker-compose");
    for (key, _) in std::env::vars() {
        if key.starts_with("BENCHFLEET_") || key == "HF_TOKEN" || key == "RUST_LOG" {
            cmd.env_remove(key);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v))).args(["--ansi", "never"]);
    cmd
}

/// `docker-compose config` of one file, as JSON.
fn config(file: &str, env: &[(String, String)]) -> Result<Value, String> {
    let ran = run(compose(env).arg("-f").arg(compose_dir().join(file)).arg("config"), Duration::from_secs(60));
    if !ran.ok {
        return Err(ran.text());
    }
    assert!(ran.stderr.trim().is_empty(), "{file}: docker-compose config warned:\n{}", ran.stderr);
    serde_yaml_ng::from_str(&ran.stdout).map_err(|e| format!("{file}: config printed no YAML ({e}):\n{}", ran.stdout))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

const HASH: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

#[test]
fn both_compose_files_pass_docker_compose_config_and_hang_together() {
    for file in ["compose.yaml", "compose.sim.yaml"] {
        // The CA's hash has no default: `up` without it says what to run.
        let err = config(file, &[]).expect_err("a file without BENCHFLEET_CA_HASH");
        assert!(err.contains("run benchfleet certs init first"), "{file}: {err}");

        let c = config(file, &[("BENCHFLEET_CA_HASH".into(), HASH.into())]).unwrap_or_else(|e| panic!("{file}: {e}"));
        let services = c["services"].as_object().unwrap_or_else(|| panic!("{file}: no services"));
        let names: Vec<&str> = services.keys().map(String::as_str).collect();
        assert_eq!(names, ["agent", "controller", "join"], "{file}");
        for (name, s) in services {
            // CI's Docker has no bridge; the agent's engines listen on the
            // host's loopback.
            assert_eq!(s["network_mode"], "host", "{file}: service {name}");
            assert!(s["image"].as_str().is_some_and(|i| i.ends_with(":dev")), "{file}: {name}: {}", s["image"]);
        }

        let controller = &services["controller"];
        let command = strings(&controller["command"]);
        assert!(!command.contains(&"--insecure"), "{file}: the controller serves TLS");
        for flag in ["--tls-cert", "--tls-key", "--client-ca"] {
            assert!(command.contains(&flag), "{file}: the controller's {flag} is named: {command:?}");
        }
        assert_eq!(controller["user"], "65532:65532", "{file}");
        assert!(controller["volumes"].to_string().contains(":/var/lib/benchfleet:"), "{file}: the data directory");
        assert!(strings(&controller["healthcheck"]["test"]).contains(&"/usr/local/bin/benchfleet"), "{file}");

        let join = &services["join"];
        let command = strings(&join["command"]);
        assert_eq!(command.first(), Some(&"join"), "{file}: {command:?}");
        let at = command.iter().position(|w| *w == "--ca-hash").expect("--ca-hash");
        assert_eq!(command[at + 1], HASH, "{file}");
        assert!(command.iter().any(|w| w.starts_with("https://")), "{file}: {command:?}");
        assert!(command.contains(&"/run/secrets/join-token"), "{file}: {command:?}");
        assert_eq!(join["depends_on"]["controller"]["condition"], "service_healthy", "{file}");
        assert!(c["secrets"]["join-token"]["file"].is_string(), "{file}: the token file");

        let agent = &services["agent"];
        assert_eq!(agent["depends_on"]["join"]["condition"], "service_completed_successfully", "{file}");
        // The identity `join` stored is where the agent looks.
        let work = strings(&join["volumes"]);
        assert_eq!(work.len(), 1, "{file}: the join mounts the work directory alone: {work:?}");
        assert!(strings(&agent["volumes"]).contains(&work[0]), "{file}: the agent's work directory is the join's");
        let command = strings(&agent["command"]);
        assert!(command.contains(&"/var/lib/benchfleet-agent"), "{file}: {command:?}");
        let stop = agent["stop_grace_period"].as_str().unwrap_or_default();
        assert!(stop.ends_with('m') && stop[..stop.len() - 1].parse::<u64>().is_ok_and(|m| m * 60 > 630), "{stop}");
    }

    // The GPU host's agent: every GPU, the Docker socket, the model cache at
    // the host's own path (the daemon mounts it into engines).
    let c = config("compose.yaml", &[("BENCHFLEET_CA_HASH".into(), HASH.into())]).expect("config");
    let agent = &c["services"]["agent"];
    let devices = &agent["deploy"]["resources"]["reservations"]["devices"][0];
    assert_eq!(devices["driver"], "nvidia");
    assert_eq!(devices["count"], "all");
    assert_eq!(strings(&devices["capabilities"]), ["gpu"]);
    let volumes = strings(&agent["volumes"]);
    assert!(volumes.contains(&"/var/run/docker.sock:/var/run/docker.sock:rw"), "{volumes:?}");
    let cache = "/var/cache/benchfleet/huggingface";
    assert!(volumes.contains(&format!("{cache}:{cache}:rw").as_str()), "{volumes:?}");
    let command = strings(&agent["command"]);
    let at = command.iter().position(|w| *w == "--model-cache").expect("--model-cache");
    assert_eq!(command[at + 1], cache);
    // The simulator's agent: simulated GPUs and engines, no Docker.
    let c = config("compose.sim.yaml", &[("BENCHFLEET_CA_HASH".into(), HASH.into())]).expect("config");
    let command = strings(&c["services"]["agent"]["command"]);
    for word in ["--sim-gpus", "H200x8", "--sim-engines"] {
        assert!(command.contains(&word), "{command:?}");
    }
}

/// A compose project brought down (containers, networks, volumes) when
/// dropped, with the environment it was brought up with.
struct Stack {
    project: String,
    env: Vec<(String, String)>,
}

impl Stack {
    fn cmd(&self) -> Command {
        let mut cmd = compose(&self.env);
        cmd.arg("-p").arg(&self.project).arg("-f").arg(compose_dir().join("compose.sim.yaml"));
        cmd
    }

    fn up(&self) {
        let ran = run(self.cmd().args(["up", "-d"]), Duration::from_secs(240));
        assert!(ran.ok, "docker-compose up failed:\n{}\n{}", ran.text(), self.logs());
    }

    fn logs(&self) -> String {
        let ran = run(self.cmd().args(["logs", "--no-color", "--timestamps"]), Duration::from_secs(60));
        format!("the stack's logs:\n{}", ran.text())
    }

    /// What one service's containers printed.
    fn service_logs(&self, service: &str) -> String {
        run(self.cmd().args(["logs", "--no-color", service]), Duration::from_secs(60)).text()
    }

    fn down(&self, volumes: bool) -> Ran {
        let mut cmd = self.cmd();
        cmd.args(["down", "--remove-orphans", "--timeout", "30"]);
        if volumes {
            cmd.arg("-v");
        }
        run(&mut cmd, Duration::from_secs(180))
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let ran = self.down(true);
        if !ran.ok {
            eprintln!("docker-compose down -v failed for {}:\n{}", self.project, ran.text());
        }
    }
}

/// The images of one tag, removed when dropped.
struct Images(String);

impl Drop for Images {
    fn drop(&mut self) {
        let names: Vec<String> = ["benchfleet-controller", "benchfleet-agent", "benchfleet"]
            .iter()
            .map(|i| format!("{i}:{}", self.0))
            .collect();
        let _ = run(Command::new("docker").args(["image", "rm", "--force"]).args(&names), Duration::from_secs(60));
    }
}

/// `benchfleet --identity DATA/pki --controller URL ARGS...` on this host.
fn cli(pki: &Path, url: &str, args: &[&str]) -> Ran {
    let mut cmd = Command::new(bin("benchfleet"));
    cmd.arg("--identity").arg(pki).args(["--controller", url]).args(args).env("NO_COLOR", "1");
    run(&mut cmd, Duration::from_secs(120))
}

/// The CLI's image on the controller's data directory, as its user (the
/// commands deploy/README.md gives).
fn cli_image(tag: &str, data: &Path, args: &[&str]) -> Ran {
    let mut cmd = Command::new("docker");
    cmd.args(["run", "--rm", "--network", "host", "-u", "65532:65532", "-v"])
        .arg(format!("{}:/var/lib/benchfleet", data.display()))
        .arg(format!("benchfleet:{tag}"))
        .args(args);
    run(&mut cmd, Duration::from_secs(60))
}

/// Waits until an agent is ready on the controller; returns its name.
fn ready_agent(stack: &Stack, pki: &Path, url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last = String::new();
    while Instant::now() < deadline {
        let ran = cli(pki, url, &["--json", "agents"]);
        if ran.ok {
            let agents: Value = serde_json::from_str(&ran.stdout).unwrap_or(Value::Null);
            let ready =
                agents.as_array().into_iter().flatten().find(|a| a["state"] == "ready" && a["connected"] == true);
            if let Some(agent) = ready {
                let gpus = agent["gpus"].as_array().map_or(0, Vec::len);
                assert_eq!(gpus, 2, "the agent's simulated GPUs (BENCHFLEET_SIM_GPUS=H200x2): {agent}");
                return agent["name"].as_str().unwrap_or_default().to_owned();
            }
        }
        last = ran.text();
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("no agent was ready within 90 s; the last listing:\n{last}\n{}", stack.logs());
}

fn matrix(dir: &Path) -> PathBuf {
    let path = dir.join("compose.yaml");
    std::fs::write(
        &path,
        "name: compose
model: Qwen/Qwen3.5-9B
hardware: { gpu: H200, gpus_per_job: 1 }
engines:
  vllm: { runtime: process, args: [--max-model-len=4096] }
profiles:
  load:
    dataset: { random: { input_tokens: 64, output_tokens: 16, seed: 1 } }
    rate: 40
    requests: 40
",
    )
    .expect("matrix");
    path
}

#[test]
fn the_simulators_stack_runs_a_matrix_over_mutual_tls() {
    let began = Instant::now();
    let docker = run(Command::new("docker").arg("info"), Duration::from_secs(30));
    assert!(
        docker.ok,
        "this test needs a Docker daemon; start one: dockerd --bridge=none --iptables=false &\n{}",
        docker.text()
    );

    let tmp = tempfile::tempdir().expect("tmp");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("a clock after 1970");
    let unique = format!("e2e{}x{}", std::process::id(), now.as_millis() % 100_000_000);
    // The images of the binaries under test, under a tag no one else uses.
    let tag = unique.clone();
    let bin_dir = bin("benchfleet").parent().expect("the binaries' directory").to_owned();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/build-images.sh");
    let images = Images(tag.clone());
    let built =
        run(Command::new(&script).arg("--debug").arg("--bin-dir").arg(&bin_dir).arg(&tag), Duration::from_secs(300));
    assert!(built.ok, "deploy/build-images.sh failed:\n{}", built.text());

    // The controller's data directory is its image's user's, as
    // deploy/README.md has it made.
    let data = tmp.path().join("data");
    let work = tmp.path().join("work");
    std::fs::create_dir(&data).expect("data dir");
    std::fs::create_dir(&work).expect("work dir");
    std::os::unix::fs::chown(&data, Some(CONTROLLER_UID), Some(CONTROLLER_UID))
        .unwrap_or_else(|e| panic!("this test runs as root, to give the data directory to {CONTROLLER_UID}: {e}"));
    let init = cli_image(&tag, &data, &["certs", "init"]);
    assert!(init.ok, "certs init: {}", init.text());
    let ca_hash = init
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("CA hash: "))
        .unwrap_or_else(|| panic!("certs init printed no CA hash: {}", init.stdout))
        .to_owned();
    // Offline, on the store: the controller is not running yet.
    let token = cli_image(&tag, &data, &["token", "create", "--ttl", "10m"]);
    assert!(token.ok, "token create: {}", token.text());
    let token_file = tmp.path().join("join-token");
    std::fs::write(&token_file, &token.stdout).expect("token file");

    let port = free_port();
    let metrics = free_port();
    let url = format!("https://127.0.0.1:{port}");
    let env: Vec<(String, String)> = [
        ("BENCHFLEET_TAG", tag.clone()),
        ("BENCHFLEET_PORT", port.to_string()),
        ("BENCHFLEET_METRICS_PORT", metrics.to_string()),
        ("BENCHFLEET_CONTROLLER_DATA", data.display().to_string()),
        ("BENCHFLEET_AGENT_WORK", work.display().to_string()),
        ("BENCHFLEET_JOIN_TOKEN_FILE", token_file.display().to_string()),
        ("BENCHFLEET_CA_HASH", ca_hash.clone()),
        ("BENCHFLEET_SIM_GPUS", "H200x2".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let stack = Stack { project: unique.clone(), env };
    stack.up();
    let joined = stack.service_logs("join");
    assert!(joined.contains("joined as '"), "the join: {joined}");
    assert!(work.join("identity/agent.pem").is_file(), "the agent's certificate is in its work directory");

    // The admin `certs init` made, over mutual TLS from this host.
    let pki = data.join("pki");
    let agent = ready_agent(&stack, &pki, &url);
    let submitted = cli(&pki, &url, &["submit", &matrix(tmp.path()).display().to_string()]);
    assert!(submitted.ok, "submit: {}\n{}", submitted.text(), stack.logs());
    let run_id = submitted.stdout.trim().to_owned();
    assert!(run_id.parse::<u64>().is_ok(), "submit printed a run id: {}", submitted.stdout);
    let watched = cli(&pki, &url, &["watch", &run_id]);
    assert!(watched.ok, "the run did not succeed: {}\n{}", watched.text(), stack.logs());
    let report = cli(&pki, &url, &["report", &run_id]);
    assert!(report.ok, "report: {}", report.text());
    assert!(report.stdout.contains("Serving Benchmark Result"), "{}", report.stdout);
    assert!(report.stdout.contains("Successful requests:                     40"), "{}", report.stdout);
    let jobs = cli(&pki, &url, &["--json", "jobs", &run_id]);
    assert!(jobs.ok, "jobs: {}", jobs.text());
    let jobs: Value = serde_json::from_str(&jobs.stdout).expect("jobs as JSON");
    assert_eq!(jobs[0]["attempts"][0]["agent_name"], agent.as_str(), "the job ran on the stack's agent: {jobs}");

    // Down and up again over the same directories: the store keeps the run,
    // the join finds its identity and does nothing, the agent comes back.
    let down = stack.down(false);
    assert!(down.ok, "docker-compose down: {}", down.text());
    stack.up();
    let joined = stack.service_logs("join");
    assert!(joined.contains("already joined as '"), "the second join: {joined}");
    assert_eq!(ready_agent(&stack, &pki, &url), agent);
    let runs = cli(&pki, &url, &["--json", "runs"]);
    assert!(runs.ok, "runs: {}", runs.text());
    let runs: Value = serde_json::from_str(&runs.stdout).expect("runs as JSON");
    let kept = runs.as_array().into_iter().flatten().find(|r| r["run_id"] == run_id.as_str());
    assert!(kept.is_some_and(|r| r["state"] == "finished"), "the run is kept, finished: {runs}");
    drop(stack);
    drop(images);
    eprintln!("the compose stack's test took {:.1} s", began.elapsed().as_secs_f64());
}
