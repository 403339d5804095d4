//! A fleet check at scale, with the real binaries on loopback: a controller
//! and `--agents` agents, each with one simulated H200 and simulated
//! engines. Timed side by side in one run:
//!
//! 1. the check on one host (`--hosts` the first): one target's repeats,
//!    its engine's start included;
//! 2. the same check on every host: the ratio to (1) is what the fleet adds
//!    (scheduling, the hosts' jobs side by side, the judgement);
//! 3. its report: the controller building it from the store (`GetReport`,
//!    JSON and HTML) and the document rendered here (console, HTML).
//!
//! `cargo build --release --workspace && cargo bench -p benchfleet-tests --bench fleet -- [--agents 100] [--requests 16]`
//!
//! The simulated engines sleep out their modelled step times, so a host's
//! job costs this machine little CPU; every agent, engine and loadgen is
//! still a process of its own here, and the check's time on a small machine
//! is an upper bound of what the fleet adds.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use benchfleet_proto as pb;
use benchfleet_study::report::{self, Format, doc::ReportDoc};

struct Args {
    agents: usize,
    requests: u32,
}

fn args() -> Args {
    let mut a = Args { agents: 100, requests: 16 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--agents" => a.agents = value().parse().expect("--agents N"),
            "--requests" => a.requests = value().parse().expect("--requests N"),
            // cargo bench passes --bench.
            _ => {}
        }
    }
    a
}

fn bin(name: &str) -> PathBuf {
    benchfleet_agent::find_binary(name)
        .unwrap_or_else(|| panic!("{name} is not built: `cargo build --release --workspace` first"))
}

/// Children killed when the bench ends.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(program: &Path, args: &[String], log: PathBuf) -> Child {
    let out = std::fs::File::create(log).expect("log file");
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

fn matrix(dir: &Path, requests: u32) -> PathBuf {
    let yaml = format!(
        "name: fleet-bench
model: Qwen/Qwen3.5-9B
objective: output_throughput
hardware: {{ gpu: H200, gpus_per_job: 1 }}
strategy: fleet
repeats: 3
engines:
  vllm: {{ runtime: process, args: [--max-model-len=8192, --sim-startup-ms=0] }}
profiles:
  load:
    dataset: {{ random: {{ input_tokens: 3072, output_tokens: 48, seed: 1 }} }}
    max_concurrency: 4
    requests: {requests}
"
    );
    let path = dir.join("fleet-bench.yaml");
    std::fs::write(&path, yaml).expect("the matrix is written");
    path
}

/// `benchfleet fleet check`: its wall time and the run it made.
fn check(url: &str, matrix: &Path, extra: &[&str]) -> (Duration, String) {
    let began = Instant::now();
    let out = Command::new(bin("benchfleet"))
        .args(["--controller", url, "fleet", "check"])
        .arg(matrix)
        .args(extra)
        .env("NO_COLOR", "1")
        .output()
        .expect("benchfleet runs");
    let took = began.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    let run = text
        .lines()
        .find_map(|l| l.strip_prefix("run id: "))
        .unwrap_or_else(|| panic!("no run id in:\n{text}{}", String::from_utf8_lossy(&out.stderr)))
        .to_owned();
    let tally = text.lines().find(|l| l.starts_with("Verdicts:")).unwrap_or("no verdict line").to_owned();
    eprintln!("  {tally}");
    // What a failed or unstable target said (a loaded machine makes noisy hosts).
    for line in text.lines().filter(|l| l.contains(" failed ") || l.contains(" unstable ")).take(5) {
        eprintln!("  {}", line.trim());
    }
    (took, run)
}

async fn ready(url: &str, n: usize) {
    let began = Instant::now();
    loop {
        if let Ok(mut c) = benchfleet_cli::client::connect(url).await
            && let Ok(list) = c.list_agents(pb::ListAgentsRequest::default()).await
            && list.get_ref().agents.iter().filter(|a| a.state == "ready").count() >= n
        {
            return;
        }
        assert!(began.elapsed() < Duration::from_secs(300), "{n} agents were not ready within 5 minutes");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn report(url: &str, run: &str, format: &str) -> (Duration, String) {
    let mut c = benchfleet_cli::client::connect(url).await.expect("connect");
    let began = Instant::now();
    let text = c
        .get_report(pb::GetReportRequest { run_id: run.to_owned(), format: format.to_owned() })
        .await
        .expect("report")
        .into_inner()
        .text;
    (began.elapsed(), text)
}

fn median_of<T>(n: usize, mut f: impl FnMut() -> T) -> Duration {
    let mut times: Vec<Duration> = (0..n)
        .map(|_| {
            let began = Instant::now();
            std::hint::black_box(f());
            began.elapsed()
        })
        .collect();
    times.sort();
    times[n / 2]
}

#[tokio::main]
async fn main() {
    let a = args();
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let controller_args: Vec<String> = [
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
        &dir.path().join("controller").display().to_string(),
        "--metrics-listen",
        "127.0.0.1:0",
    ]
    .map(String::from)
    .to_vec();
    let mut procs =
        Procs(vec![spawn(&bin("benchfleet-controller"), &controller_args, dir.path().join("controller.log"))]);
    let names: Vec<String> = (0..a.agents).map(|i| format!("q{i:03}")).collect();
    for (i, name) in names.iter().enumerate() {
        let first = 20000 + 40 * i;
        let args: Vec<String> = [
            "--controller",
            &url,
            "--name",
            name,
            "--sim-engines",
            "--sim-gpus",
            "H200x1",
            "--docker",
            "off",
            "--work-dir",
            &dir.path().join(format!("agent-{name}")).display().to_string(),
            "--engine-ports",
            &format!("{first}-{}", first + 39),
        ]
        .map(String::from)
        .to_vec();
        procs.0.push(spawn(&bin("benchfleet-agent"), &args, dir.path().join(format!("agent-{name}.log"))));
    }
    let began = Instant::now();
    ready(&url, a.agents).await;
    eprintln!("{} agents ready in {:.1} s", a.agents, began.elapsed().as_secs_f64());
    let m = matrix(dir.path(), a.requests);

    eprintln!("one host:");
    let (one, _) = check(&url, &m, &["--hosts", &names[0]]);
    eprintln!("every host:");
    let (all, run) = check(&url, &m, &[]);
    let (built_json, json) = report(&url, &run, "json").await;
    let (built_html, html) = report(&url, &run, "html").await;
    let doc: ReportDoc = serde_json::from_str(&json).expect("a report document");
    let targets: usize = doc.fleet.iter().flat_map(|f| &f.cohorts).map(|c| c.rows.len()).sum();
    let console = median_of(5, || report::render_as(&doc, Format::Console));
    let rendered_html = median_of(5, || report::render_as(&doc, Format::Html));

    println!("fleet check, {} simulated agents, 3 repeats of {} requests each", a.agents, a.requests);
    println!("  one host:    {:>7.1} s", one.as_secs_f64());
    println!(
        "  every host:  {:>7.1} s  ({targets} targets; {:.2}x the one host's)",
        all.as_secs_f64(),
        all.as_secs_f64() / one.as_secs_f64()
    );
    println!("report of the {targets}-target check");
    println!("  GetReport json (from the store): {:>8.1} ms, {} KB", ms(built_json), json.len() / 1000);
    println!("  GetReport html (from the store): {:>8.1} ms, {} KB", ms(built_html), html.len() / 1000);
    println!("  rendered here, console:          {:>8.1} ms", ms(console));
    println!("  rendered here, html:             {:>8.1} ms", ms(rendered_html));
    drop(procs);
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
