//! `loadgen-bench versus`: benchfleet-loadgen and a peer client (vLLM's
//! Rust `vllm-bench`) side by side, given the same `vllm bench serve`
//! command line, each against a fresh server of known timing on one core,
//! the client on another, alternating run by run.
//!
//! Each client's figures are its own (the result file it writes: vLLM's
//! JSON for the peer, `--save-summary` for loadgen, which keeps no record
//! then); the truth is the server's; CPU time is the client process's (the
//! kernel's account of the child once it is reaped) and its peak RSS its
//! VmHWM, read while it runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::{SERVER_LATE_MS, Server, Truth, Value, num, server_truth, start_server};

/// What to compare, and how often.
pub struct Versus {
    pub peer: PathBuf,
    pub loadgen: Option<PathBuf>,
    pub processor: PathBuf,
    pub runs: usize,
    pub server_core: u32,
    pub client_core: u32,
    pub million: bool,
}

/// One client of a comparison.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Client {
    Loadgen { tokenizer: bool },
    Peer,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Client::Loadgen { tokenizer: true } => "loadgen",
            Client::Loadgen { tokenizer: false } => "loadgen, no tokenizer",
            Client::Peer => "vllm-bench",
        }
    }
}

/// Each client's outcomes on one load, run by run.
type Runs = Vec<(Client, Vec<Outcome>)>;

/// One load: the server's timing and the client's command.
struct Load {
    name: String,
    ttft_ms: u64,
    itl_ms: u64,
    requests: usize,
    concurrency: Option<usize>,
    rate: Option<f64>,
    clients: Vec<Client>,
}

/// What one run of one client gave.
#[derive(Clone, Copy, Debug)]
struct Outcome {
    rate: f64,
    ttft_ms: f64,
    completed: f64,
    cpu_s: f64,
    rss_mb: f64,
    truth_ttft_ms: f64,
    truth_latency_ms: f64,
    server_late_ms: f64,
}

pub fn versus(v: &Versus) -> anyhow::Result<()> {
    let loadgen = match &v.loadgen {
        Some(path) => path.clone(),
        None => std::env::current_exe().context("cannot find this binary")?.with_file_name("benchfleet-loadgen"),
    };
    for binary in [&loadgen, &v.peer] {
        if !binary.is_file() {
            bail!("{} is not a file", binary.display());
        }
    }
    let both = vec![Client::Loadgen { tokenizer: true }, Client::Peer];
    let mut loads = vec![Load {
        name: "zero-delay server, closed loop C=64, 20,000 requests".into(),
        ttft_ms: 0,
        itl_ms: 0,
        requests: 20_000,
        concurrency: Some(64),
        rate: None,
        clients: vec![Client::Loadgen { tokenizer: true }, Client::Loadgen { tokenizer: false }, Client::Peer],
    }];
    for c in [256, 512, 1024] {
        loads.push(Load {
            name: format!("TTFT 50 ms, ITL 10 ms, closed loop C={c}, {} requests", 4 * c),
            ttft_ms: 50,
            itl_ms: 10,
            requests: 4 * c,
            concurrency: Some(c),
            rate: None,
            clients: both.clone(),
        });
    }
    for rate in [400.0, 800.0, 1600.0] {
        loads.push(Load {
            name: format!("TTFT 50 ms, ITL 10 ms, Poisson {rate} req/s, 6 s"),
            ttft_ms: 50,
            itl_ms: 10,
            requests: (rate * 6.0) as usize,
            concurrency: None,
            rate: Some(rate),
            clients: both.clone(),
        });
    }
    if v.million {
        loads.push(Load {
            name: "zero-delay server, closed loop C=64, 1,000,000 requests".into(),
            ttft_ms: 0,
            itl_ms: 0,
            requests: 1_000_000,
            concurrency: Some(64),
            rate: None,
            clients: both.clone(),
        });
    }
    let dir = ResultDir::new()?;
    let mut table = Vec::new();
    for load in &loads {
        println!("\n{}", load.name);
        let mut got: Runs = load.clients.iter().map(|&c| (c, Vec::new())).collect();
        for run in 0..v.runs {
            for (client, outcomes) in &mut got {
                let server = start_server(v.server_core, load.ttft_ms, load.itl_ms)?;
                let outcome = one(v, &loadgen, *client, load, &server, &dir.0)
                    .with_context(|| format!("{} on {}", client.name(), load.name))?;
                println!(
                    "  run {} {:<22} {:>9.1} req/s  ttft {:>8.3} ms (server {:>8.3})  cpu {:>6.2} s  rss {:>7.1} MB  \
                     srv late {:.2} ms",
                    run + 1,
                    client.name(),
                    outcome.rate,
                    outcome.ttft_ms,
                    outcome.truth_ttft_ms,
                    outcome.cpu_s,
                    outcome.rss_mb,
                    outcome.server_late_ms
                );
                outcomes.push(outcome);
            }
        }
        table.push((load, got));
    }
    print_table(&table);
    Ok(())
}

/// A directory for the clients' result files, removed at the end.
struct ResultDir(PathBuf);

impl ResultDir {
    fn new() -> anyhow::Result<ResultDir> {
        let dir = std::env::temp_dir().join(format!("loadgen-versus-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot make {}", dir.display()))?;
        Ok(ResultDir(dir))
    }
}

impl Drop for ResultDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `client` once against `server`.
fn one(
    v: &Versus,
    loadgen: &Path,
    client: Client,
    load: &Load,
    server: &Server,
    dir: &Path,
) -> anyhow::Result<Outcome> {
    let port = server.url.rsplit(':').next().unwrap_or_default();
    let mut args: Vec<String> = [
        "--backend",
        "openai",
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "--model",
        "bench",
        "--dataset-name",
        "random",
        "--random-input-len",
        "16",
        "--random-output-len",
        "128",
        "--ignore-eos",
        "--seed",
        "1",
        "--num-prompts",
    ]
    .map(str::to_owned)
    .to_vec();
    args.push(load.requests.to_string());
    if let Some(c) = load.concurrency {
        args.extend(["--max-concurrency".to_owned(), c.to_string()]);
    }
    if let Some(rate) = load.rate {
        args.extend(["--request-rate".to_owned(), rate.to_string()]);
    }
    if client != (Client::Loadgen { tokenizer: false }) {
        args.extend(["--tokenizer".to_owned(), v.processor.display().to_string()]);
    }
    let result = dir.join(format!("{}.json", client.name().replace([' ', ','], "-")));
    let _ = std::fs::remove_file(&result);
    let binary = match client {
        Client::Loadgen { .. } => {
            args.extend(["--quiet".to_owned(), "--save-summary".to_owned(), result.display().to_string()]);
            loadgen
        }
        Client::Peer => {
            args.extend(["--disable-tqdm", "--save-result", "--result-dir"].map(str::to_owned));
            args.push(dir.display().to_string());
            args.push("--result-filename".to_owned());
            args.push(result.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
            &v.peer
        }
    };
    let (cpu_s, rss_mb) = run_measured(v.client_core, binary, &args)?;
    let text = std::fs::read_to_string(&result).with_context(|| format!("no result file {}", result.display()))?;
    let out: Value = serde_json::from_str(&text).context("the result file is not JSON")?;
    let (rate, ttft_ms, completed) = match client {
        Client::Loadgen { .. } => {
            (num(&out, "request_throughput"), num(&out["ttft_ms"], "mean"), num(&out, "successful"))
        }
        Client::Peer => (num(&out, "request_throughput"), num(&out, "mean_ttft_ms"), num(&out, "completed")),
    };
    let Truth { ttft, latency, late } = server_truth(&server.url)?;
    Ok(Outcome {
        rate,
        ttft_ms,
        completed,
        cpu_s,
        rss_mb,
        truth_ttft_ms: ttft,
        truth_latency_ms: latency,
        server_late_ms: late,
    })
}

/// Runs `binary args` pinned to `core`; its CPU time (s) and peak RSS (MB).
fn run_measured(core: u32, binary: &Path, args: &[String]) -> anyhow::Result<(f64, f64)> {
    // Every child reaped so far: the servers of the runs before.
    let before = children_cpu_s().context("cannot read the children's CPU time")?;
    let mut child = Command::new("taskset")
        .args(["-c", &core.to_string()])
        .arg(binary)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    // taskset execs the client: the pid is the client's.
    let status_path = format!("/proc/{}/status", child.id());
    let mut rss_kb = 0u64;
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if let Some(kb) = std::fs::read_to_string(&status_path).ok().as_deref().and_then(vm_hwm_kb) {
            rss_kb = rss_kb.max(kb);
        }
        if started.elapsed() > Duration::from_secs(3600) {
            let _ = child.kill();
            bail!("{} ran over an hour", binary.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
    }
    if !status.success() {
        bail!("{} exited with {status}: {}", binary.display(), stderr.trim());
    }
    // The client is the only child reaped since (its server still runs).
    let cpu_s = children_cpu_s().context("cannot read the children's CPU time")? - before;
    Ok((cpu_s, rss_kb as f64 / 1024.0))
}

/// CPU time (user + system) of every child reaped so far, s: fields 16 and
/// 17 of `/proc/self/stat` (cutime, cstime), in ticks of 1/100 s.
fn children_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let ticks = fields.get(13)?.parse::<u64>().ok()? + fields.get(14)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn vm_hwm_kb(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// The medians of each client on each load, and loadgen's against the peer.
/// The ideal rate of a closed loop is its streams over the server's
/// latency; of an open loop, its requests over the schedule's length plus
/// one latency (the last request sent still takes that long; a Poisson
/// schedule's length varies with its draw). A load on which the server's
/// timer woke it more than `SERVER_LATE_MS` late on average measured the
/// server's core, not the client: its row says so.
fn print_table(table: &[(&Load, Runs)]) {
    println!(
        "\n| load | client | req/s | achieved / ideal | mean TTFT / server's | CPU per request | peak RSS | server late |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (load, got) in table {
        let mut peer_rate = f64::NAN;
        let mut rows = Vec::new();
        for (client, outcomes) in got {
            let m = |f: fn(&Outcome) -> f64| median(outcomes.iter().map(f).collect());
            let rate = m(|o| o.rate);
            // A closed loop's ideal: its streams over the server's latency;
            // an open loop's: the offered rate.
            let latency_s = m(|o| o.truth_latency_ms) / 1000.0;
            let ideal = match (load.rate, load.concurrency) {
                (Some(rate), _) => load.requests as f64 / (load.requests as f64 / rate + latency_s),
                (None, Some(c)) if load.ttft_ms > 0 => c as f64 / latency_s,
                _ => f64::NAN,
            };
            let ttft = m(|o| o.ttft_ms);
            let truth = m(|o| o.truth_ttft_ms);
            let cpu_per_request_ms = m(|o| o.cpu_s / o.completed.max(1.0) * 1000.0);
            if *client == Client::Peer {
                peer_rate = rate;
            }
            let late = m(|o| o.server_late_ms);
            rows.push((client, rate, ideal, ttft, truth, cpu_per_request_ms, m(|o| o.rss_mb), late));
        }
        for (client, rate, ideal, ttft, truth, cpu, rss, late) in rows {
            let against = if *client == Client::Peer { String::new() } else { format!(" ({:.2}x)", rate / peer_rate) };
            let ideal = if ideal.is_nan() { "-".to_owned() } else { format!("{:.3}", rate / ideal) };
            let ttft = if load.ttft_ms == 0 {
                format!("{ttft:.3} ms / {truth:.3} ms")
            } else {
                format!("{:+.1}%", (ttft / truth - 1.0) * 100.0)
            };
            let late =
                if late > SERVER_LATE_MS { format!("{late:.1} ms: its core is full") } else { format!("{late:.1} ms") };
            println!(
                "| {} | {} | {rate:.0}{against} | {ideal} | {ttft} | {cpu:.3} ms | {rss:.1} MB | {late} |",
                load.name,
                client.name()
            );
        }
    }
}
