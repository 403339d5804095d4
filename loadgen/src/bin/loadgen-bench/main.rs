//! `loadgen-bench`: how far the load generator keeps its schedule and its
//! accuracy, against a minimal streaming server of exactly known timing.
//!
//! `loadgen-bench all` runs every scenario, each as a fresh pair of
//! processes: the server pinned to one core, the client to another (with
//! `taskset`), so that neither steals from the other and the client's memory
//! high-water mark is its own. `serve` and `client` are those two halves.

use std::io::{Read as _, Write as _};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use benchfleet_loadgen::{Arrival, Dataset, LoadConfig, LoadResult, run, send_times};
use clap::{Parser, Subcommand};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

mod versus;

#[derive(Parser)]
#[command(name = "loadgen-bench", about = "Benchmarks benchfleet-loadgen against a server of known timing")]
struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every scenario, server on `--server-core`, client on `--client-core`.
    All {
        #[arg(long, default_value_t = 0)]
        server_core: u32,
        #[arg(long, default_value_t = 1)]
        client_core: u32,
        /// Seconds of load per step of the rate and concurrency searches.
        #[arg(long, default_value_t = 4.0)]
        seconds: f64,
    },
    /// The streaming server; prints its port.
    Serve {
        #[arg(long)]
        ttft_ms: u64,
        #[arg(long)]
        itl_ms: u64,
        #[arg(long, default_value_t = 128)]
        tokens: u64,
    },
    /// One client scenario against `--url`; prints a JSON line.
    Client {
        #[arg(long)]
        url: String,
        /// Requests per second (open loop, Poisson); absent: closed loop.
        #[arg(long)]
        rate: Option<f64>,
        /// Concurrent streams (closed loop), or the cap of an open loop.
        #[arg(long)]
        concurrency: Option<usize>,
        #[arg(long)]
        requests: usize,
        /// A tokenizer (`tokenizer.json`): prompts from its words, and the
        /// usage check (the server's counts against it) on.
        #[arg(long)]
        processor: Option<std::path::PathBuf>,
        /// Keep every record to the end, as a run asked for a file of them
        /// does (by default they are let go as the summary takes them).
        #[arg(long)]
        keep_records: bool,
        /// Threads the requests run on (`LoadConfig::workers`); 1 runs
        /// them on this one-thread runtime.
        #[arg(long, default_value_t = 1)]
        workers: usize,
    },
    /// benchfleet-loadgen against a peer client (vLLM's Rust `vllm-bench`,
    /// built from its source) given the same `vllm bench serve` command
    /// line: the zero-delay ceiling with and without a tokenizer, closed
    /// loops at 256/512/1024 streams, Poisson at 400/800/1600 req/s (and a
    /// million requests with `--million`); a Markdown table of medians.
    Versus {
        /// The peer's binary.
        #[arg(long)]
        peer: std::path::PathBuf,
        /// loadgen's binary; by default the one beside this one.
        #[arg(long)]
        loadgen: Option<std::path::PathBuf>,
        /// The `tokenizer.json` both are given.
        #[arg(long)]
        processor: std::path::PathBuf,
        /// Runs of each client on each load, alternating.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[arg(long, default_value_t = 0)]
        server_core: u32,
        #[arg(long, default_value_t = 1)]
        client_core: u32,
        /// Also a million requests each (minutes a run): memory and CPU.
        #[arg(long)]
        million: bool,
    },
    /// The floor under (c): the same open loop, sent by a client that only
    /// reads (a task per request, a read per wake-up, kept-alive
    /// connections; no parsing, no timing, no records); prints a JSON line.
    Bare {
        #[arg(long)]
        url: String,
        #[arg(long)]
        rate: f64,
        #[arg(long)]
        requests: usize,
    },
}

fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // One thread: the whole point is what one core can do.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("cannot start the runtime")?;
    match Args::parse().command {
        Cmd::Serve { ttft_ms, itl_ms, tokens } => rt.block_on(serve(ttft_ms, itl_ms, tokens)),
        Cmd::Client { url, rate, concurrency, requests, processor, keep_records, workers } => {
            rt.block_on(client(url, (rate, concurrency), requests, processor.as_deref(), (keep_records, workers)))
        }
        Cmd::Bare { url, rate, requests } => rt.block_on(bare(url, rate, requests)),
        Cmd::All { server_core, client_core, seconds } => all(server_core, client_core, seconds),
        Cmd::Versus { peer, loadgen, processor, runs, server_core, client_core, million } => {
            versus::versus(&versus::Versus { peer, loadgen, processor, runs, server_core, client_core, million })
        }
    }
}

// ---------------------------------------------------------------- server --

/// The server's own account of its timing: what the client must reproduce.
/// Its timer has a granularity of its own, so "50 ms" is 50.x ms in truth.
static STREAMS: AtomicU64 = AtomicU64::new(0);
static TTFT_NS: AtomicU64 = AtomicU64::new(0);
static LATENCY_NS: AtomicU64 = AtomicU64::new(0);
/// How late the server's own timer woke it for its chunks, in all: when it
/// is late, the server's core is full and it, not the client, is the limit.
static LATE_NS: AtomicU64 = AtomicU64::new(0);
static CHUNKS: AtomicU64 = AtomicU64::new(0);

async fn serve(ttft_ms: u64, itl_ms: u64, tokens: u64) -> anyhow::Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0").await.context("cannot bind the server")?;
    println!("{}", listener.local_addr()?.port());
    std::io::stdout().flush()?;
    let timing = (Duration::from_millis(ttft_ms), Duration::from_millis(itl_ms), tokens);
    loop {
        let (tcp, _) = listener.accept().await?;
        tcp.set_nodelay(true)?;
        tokio::spawn(async move {
            let _ = connection(tcp, timing).await;
        });
    }
}

/// A vLLM-sized chunk (~200 bytes), framed for chunked transfer encoding.
fn frame(data: &str) -> Vec<u8> {
    let event = format!("data: {data}\n\n");
    format!("{:x}\r\n{event}\r\n", event.len()).into_bytes()
}

async fn connection(tcp: TcpStream, (ttft, itl, tokens): (Duration, Duration, u64)) -> std::io::Result<()> {
    let chunk = frame(
        r#"{"id":"cmpl-0123456789abcdef","object":"text_completion","created":1700000000,"model":"bench","choices":[{"index":0,"text":" word","logprobs":null,"finish_reason":null}]}"#,
    );
    let usage = frame(&format!(
        r#"{{"id":"cmpl-0123456789abcdef","object":"text_completion","choices":[],"usage":{{"prompt_tokens":16,"completion_tokens":{tokens},"total_tokens":{}}}}}"#,
        tokens + 16
    ));
    benchfleet_loadgen::rx::enable(&tcp)?;
    let (read, mut write) = tcp.into_split();
    let mut buf = Vec::with_capacity(8192);
    let mut scratch = vec![0u8; 8192];
    // When the oldest bytes in `buf` reached the socket: a request arrived
    // when its first bytes did, however busy this one thread was then.
    let mut oldest: Option<Instant> = None;
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if !recv(read.as_ref(), &mut scratch, &mut buf, &mut oldest).await? {
                return Ok(());
            }
        };
        let arrived = oldest.unwrap_or_else(Instant::now);
        // The head: only the request line and the body's length matter.
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let get = head.starts_with("GET");
        let length: usize = head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, value)| value.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            if !recv(read.as_ref(), &mut scratch, &mut buf, &mut oldest).await? {
                return Ok(());
            }
        }
        buf.drain(..head_end + length);
        if buf.is_empty() {
            oldest = None;
        }
        if get {
            let stats = format!(
                r#"{{"object":"list","data":[{{"id":"bench"}}],"streams":{},"ttft_ns":{},"latency_ns":{},"late_ns":{},"chunks":{}}}"#,
                STREAMS.load(Ordering::Relaxed),
                TTFT_NS.load(Ordering::Relaxed),
                LATENCY_NS.load(Ordering::Relaxed),
                LATE_NS.load(Ordering::Relaxed),
                CHUNKS.load(Ordering::Relaxed),
            );
            let json = stats.as_str();
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{json}",
                json.len()
            );
            write.write_all(response.as_bytes()).await?;
            continue;
        }
        // Only generation streams: a peer client asking for, say, `/tokenize`
        // learns that this server has none, as from a server without it.
        if !head.starts_with("POST /v1/completions ") && !head.starts_with("POST /v1/chat/completions ") {
            write.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n").await?;
            continue;
        }
        write
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            .await?;
        if ttft.is_zero() && itl.is_zero() {
            // Instant: the whole stream in one write, so the client's parsing
            // is what is measured.
            let mut all = Vec::with_capacity(chunk.len() * tokens as usize + 256);
            for _ in 0..tokens {
                all.extend_from_slice(&chunk);
            }
            all.extend_from_slice(&usage);
            all.extend_from_slice(&frame("[DONE]"));
            all.extend_from_slice(b"0\r\n\r\n");
            write.write_all(&all).await?;
            continue;
        }
        for i in 0..tokens {
            // Absolute deadlines: timer overshoot does not add up.
            let due = arrived + ttft + itl * i as u32;
            tokio::time::sleep_until(due).await;
            LATE_NS.fetch_add(due.elapsed().as_nanos() as u64, Ordering::Relaxed);
            CHUNKS.fetch_add(1, Ordering::Relaxed);
            if i == 0 {
                TTFT_NS.fetch_add(arrived.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            write.write_all(&chunk).await?;
        }
        let mut end = usage.clone();
        end.extend_from_slice(&frame("[DONE]"));
        end.extend_from_slice(b"0\r\n\r\n");
        write.write_all(&end).await?;
        LATENCY_NS.fetch_add(arrived.elapsed().as_nanos() as u64, Ordering::Relaxed);
        STREAMS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Appends what the socket has to `buf`, noting when it arrived if `buf`
/// was empty; `false` once the peer closed.
async fn recv(
    tcp: &TcpStream,
    scratch: &mut [u8],
    buf: &mut Vec<u8>,
    oldest: &mut Option<Instant>,
) -> std::io::Result<bool> {
    let got = std::future::poll_fn(|cx| benchfleet_loadgen::rx::poll_recv(tcp, scratch, cx)).await?;
    if got.len == 0 {
        return Ok(false);
    }
    if buf.is_empty() {
        *oldest = Some(Instant::now() - got.waited);
    }
    buf.extend_from_slice(&scratch[..got.len]);
    Ok(true)
}

// ---------------------------------------------------------------- client --

async fn client(
    url: String,
    (rate, concurrency): (Option<f64>, Option<usize>),
    requests: usize,
    processor: Option<&std::path::Path>,
    (keep_records, workers): (bool, usize),
) -> anyhow::Result<()> {
    let dataset = Dataset::Random { input_tokens: 16, output_tokens: 128, seed: 1 };
    let mut config = LoadConfig::new(url, "bench", dataset, requests);
    if let Some(path) = processor {
        config.tokens = benchfleet_loadgen::TokenCounter::load(path).context("cannot load the tokenizer")?;
    }
    config.request_rate = rate;
    config.arrival = Arrival::Poisson { seed: 1 };
    config.max_concurrency = concurrency;
    config.idle_timeout = Duration::from_secs(60);
    // By default as the load generator's binary runs without a file of
    // records: the summary built as they come in, the records let go.
    config.keep_records = keep_records;
    config.workers = workers;
    let LoadResult { summary: s, .. } = run(config, None).await?;
    // Every successful request's chunks: one more than its gaps.
    let chunks = s.itl_ms.count + s.successful;
    let peak_rss_mb = peak_rss_kb().map(|kb| kb as f64 / 1024.0);
    let line = serde_json::json!({
        "requests": s.successful + s.failed + s.excluded,
        "ok": s.successful,
        "chunks": chunks,
        "duration_s": s.duration_s,
        "request_throughput": s.request_throughput,
        "offered_rate": s.offered_rate,
        "achieved_rate": s.achieved_rate,
        "ttft_mean_ms": s.ttft_ms.mean,
        "ttft_p99_ms": s.ttft_ms.p99,
        "ttft_from_scheduled_mean_ms": s.ttft_from_scheduled_ms.mean,
        "itl_mean_ms": s.itl_ms.mean,
        "lag_p99_ms": s.dispatch_lag_ms.p99,
        "cpu_s": s.client_cpu_s,
        "peak_rss_mb": peak_rss_mb,
        "peak_concurrent": s.peak_concurrent,
        "invalid": s.invalid,
        "usage_tokenized": s.usage_check.map(|u| u.outputs_compared),
        "usage_by_events": s.usage_check.map(|u| u.outputs_by_events),
    });
    println!("{line}");
    Ok(())
}

async fn bare(url: String, rate: f64, requests: usize) -> anyhow::Result<()> {
    let addr = url.trim_start_matches("http://").to_owned();
    let body = r#"{"model":"bench","max_tokens":128,"stream":true,"stream_options":{"include_usage":true},"prompt":"a b c d e f g h i j k l m n o p","ignore_eos":true}"#;
    let wire: Arc<[u8]> = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
    .into();
    let idle: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
    let reads = Arc::new(AtomicU64::new(0));
    let cpu_before = benchfleet_loadgen::cpu_time();
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for at in send_times(requests, Some(rate), Arrival::Poisson { seed: 1 }) {
        tokio::time::sleep_until(start + at).await;
        let (wire, idle, reads, addr) = (Arc::clone(&wire), Arc::clone(&idle), Arc::clone(&reads), addr.clone());
        tasks.spawn(async move {
            let kept = idle.lock().map(|mut idle| idle.pop()).unwrap_or(None);
            let mut tcp = match kept {
                Some(tcp) => tcp,
                None => {
                    let tcp = TcpStream::connect(&addr).await?;
                    tcp.set_nodelay(true)?;
                    tcp
                }
            };
            tcp.write_all(&wire).await?;
            let mut buf = vec![0u8; 4096];
            // The stream's end is the last chunk's empty frame, at the end of
            // a read: the server writes it with the usage and [DONE].
            loop {
                let n = tcp.read(&mut buf).await?;
                reads.fetch_add(1, Ordering::Relaxed);
                if n == 0 {
                    anyhow::bail!("the server closed mid-stream");
                }
                if buf[..n].ends_with(b"0\r\n\r\n") {
                    break;
                }
            }
            if let Ok(mut idle) = idle.lock() {
                idle.push(tcp);
            }
            anyhow::Ok(())
        });
    }
    let mut ok = 0usize;
    while let Some(done) = tasks.join_next().await {
        if matches!(done, Ok(Ok(()))) {
            ok += 1;
        }
    }
    let duration_s = start.elapsed().as_secs_f64();
    let cpu_s = match (cpu_before, benchfleet_loadgen::cpu_time()) {
        (Some(before), Some(after)) => (after - before).as_secs_f64(),
        _ => f64::NAN,
    };
    let chunks = ok as u64 * 128;
    let line = serde_json::json!({
        "requests": requests,
        "ok": ok,
        "chunks": chunks,
        "reads": reads.load(Ordering::Relaxed),
        "duration_s": duration_s,
        "cpu_s": cpu_s,
    });
    println!("{line}");
    Ok(())
}

/// The process's peak resident set (VmHWM), kB.
fn peak_rss_kb() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

// ------------------------------------------------------------- scenarios --

/// A running server process, killed on drop.
struct Server {
    child: std::process::Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(core: u32, ttft_ms: u64, itl_ms: u64) -> anyhow::Result<Server> {
    let me = std::env::current_exe().context("cannot find this binary")?;
    let mut child = Command::new("taskset")
        .args(["-c", &core.to_string()])
        .arg(&me)
        .args(["serve", "--ttft-ms", &ttft_ms.to_string(), "--itl-ms", &itl_ms.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the server under taskset")?;
    let mut port = String::new();
    let stdout = child.stdout.take().context("no server stdout")?;
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut port)?;
    let port: u16 = port.trim().parse().with_context(|| format!("the server printed {port:?}, not a port"))?;
    Ok(Server { child, url: format!("http://127.0.0.1:{port}") })
}

fn run_client(core: u32, url: &str, rate: Option<f64>, concurrency: Option<usize>, n: usize) -> anyhow::Result<Value> {
    let mut args =
        vec!["client".to_owned(), "--url".to_owned(), url.to_owned(), "--requests".to_owned(), n.to_string()];
    if let Some(rate) = rate {
        args.extend(["--rate".to_owned(), rate.to_string()]);
    }
    if let Some(c) = concurrency {
        args.extend(["--concurrency".to_owned(), c.to_string()]);
    }
    run_pinned(core, &args)
}

fn run_bare(core: u32, url: &str, rate: f64, n: usize) -> anyhow::Result<Value> {
    let args = ["bare", "--url", url, "--rate", &rate.to_string(), "--requests", &n.to_string()].map(str::to_owned);
    run_pinned(core, &args)
}

/// Runs this binary with `args` pinned to `core`; its last line of output,
/// as JSON.
fn run_pinned(core: u32, args: &[String]) -> anyhow::Result<Value> {
    let me = std::env::current_exe().context("cannot find this binary")?;
    let output = Command::new("taskset")
        .args(["-c", &core.to_string()])
        .arg(&me)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .with_context(|| format!("cannot run {}", args[0]))?;
    if !output.status.success() {
        bail!("{} failed: {}", args[0], String::from_utf8_lossy(&output.stderr));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).with_context(|| format!("{} printed {last:?}", args[0]))
}

type Value = serde_json::Value;

/// The server's own account, from its counters.
struct Truth {
    /// Mean TTFT, ms.
    ttft: f64,
    /// Mean latency, ms.
    latency: f64,
    /// How late its timer woke it for a chunk, on average, ms.
    late: f64,
}

fn server_truth(url: &str) -> anyhow::Result<Truth> {
    let addr = url.trim_start_matches("http://");
    let mut tcp = std::net::TcpStream::connect(addr).context("cannot reach the server for its stats")?;
    tcp.write_all(b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n")?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = vec![0; 4096];
    let n = tcp.read(&mut buf)?;
    let text = String::from_utf8_lossy(&buf[..n]);
    let body = text.split("\r\n\r\n").nth(1).context("no stats body")?;
    let v: Value = serde_json::from_str(body)?;
    let streams = num(&v, "streams").max(1.0);
    Ok(Truth {
        ttft: num(&v, "ttft_ns") / streams / 1e6,
        latency: num(&v, "latency_ns") / streams / 1e6,
        late: num(&v, "late_ns") / num(&v, "chunks").max(1.0) / 1e6,
    })
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

/// Above this mean lateness of its chunks (ms) the server's core is full.
/// About 1 ms is its timer's granularity.
const SERVER_LATE_MS: f64 = 5.0;

/// How a step of the (a) searches went.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Rate and TTFT within bounds, every request ok.
    Kept,
    /// The client missed: rate, TTFT or failures.
    Missed,
    /// The server could not keep its own timing: the step says nothing of
    /// the client, and the search ends there.
    ServerFull,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Kept => "yes",
            Verdict::Missed => "NO",
            Verdict::ServerFull => "server",
        }
    }

    /// Why the search stopped, for the summary.
    fn why(self) -> &'static str {
        match self {
            Verdict::Kept => " (the last step)",
            Verdict::Missed => " (the next step missed)",
            Verdict::ServerFull => " (the next step: the server's core was full)",
        }
    }
}

fn all(server_core: u32, client_core: u32, seconds: f64) -> anyhow::Result<()> {
    // 50 ms to the first token, 127 gaps of 10 ms: the nominal latency.
    const LATENCY_S: f64 = (50.0 + 127.0 * 10.0) / 1000.0;
    // A step judges the client only while the server keeps its own timing:
    // once its core is full, its chunks leave late and bunched, and what is
    // measured is no longer "TTFT 50 ms, a token every 10 ms".
    let verdict = |v: &Value, achieved: f64, offered: f64, truth: &Truth| {
        let rate_ok = (achieved - offered).abs() <= 0.01 * offered;
        let ttft_ok = (num(v, "ttft_mean_ms") - truth.ttft).abs() <= 0.02 * truth.ttft;
        let all_ok = num(v, "ok") as usize == v["requests"].as_u64().unwrap_or(0) as usize;
        if truth.late > SERVER_LATE_MS {
            Verdict::ServerFull
        } else if rate_ok && ttft_ok && all_ok {
            Verdict::Kept
        } else {
            Verdict::Missed
        }
    };
    println!("(a) open loop, Poisson, 128-token streams, TTFT 50 ms, 10 ms between tokens");
    println!(
        "{:>8} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>8} {:>6}",
        "rate",
        "achieved",
        "offered*",
        "true ttft",
        "ttft ms",
        "sched ms",
        "lag p99",
        "cpu s",
        "s/M chunk",
        "srv late",
        "ok?"
    );
    let mut best_rate = 0.0;
    let mut rate_stop = Verdict::Kept;
    // CPU per million chunks at the highest rate kept: each chunk came in a
    // read of its own.
    let mut streamed_per_m = f64::NAN;
    for rate in [100.0, 250.0, 500.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0] {
        let server = start_server(server_core, 50, 10)?;
        let n = (rate * seconds) as usize;
        let v = run_client(client_core, &server.url, Some(rate), None, n)?;
        // The schedule's own rate: a finite Poisson sample is not exactly `rate`.
        let offered = num(&v, "offered_rate");
        let truth = server_truth(&server.url)?;
        let true_ttft = truth.ttft;
        let verdict = verdict(&v, num(&v, "achieved_rate"), offered, &truth);
        let per_m = num(&v, "cpu_s") / num(&v, "chunks") * 1e6;
        println!(
            "{rate:>8.0} {:>10.1} {offered:>10.1} {true_ttft:>9.2} {:>9.2} {:>9.2} {:>9.3} {:>7.2} {per_m:>9.2} {:>8.3} {:>6}",
            num(&v, "achieved_rate"),
            num(&v, "ttft_mean_ms"),
            num(&v, "ttft_from_scheduled_mean_ms"),
            num(&v, "lag_p99_ms"),
            num(&v, "cpu_s"),
            truth.late,
            verdict.label()
        );
        if verdict != Verdict::Kept {
            rate_stop = verdict;
            break;
        }
        best_rate = rate;
        streamed_per_m = per_m;
    }
    // The same load read by a client that does nothing else: what reading
    // each chunk as it comes costs on this machine, whoever reads it.
    let mut floor_per_m = f64::NAN;
    if best_rate > 0.0 {
        let server = start_server(server_core, 50, 10)?;
        let n = (best_rate * seconds) as usize;
        let v = run_bare(client_core, &server.url, best_rate, n)?;
        floor_per_m = num(&v, "cpu_s") / num(&v, "chunks") * 1e6;
        println!(
            "bare reader at {best_rate:.0} req/s: {} reads for {} chunks, cpu {:.2} s, {floor_per_m:.2} s per million chunks",
            v["reads"],
            v["chunks"],
            num(&v, "cpu_s")
        );
    }
    println!("\n(a) closed loop, same server; offered = concurrency / {LATENCY_S:.2} s");
    println!(
        "{:>8} {:>10} {:>10} {:>9} {:>9} {:>9} {:>7} {:>8} {:>6}",
        "streams", "achieved", "offered", "true ttft", "ttft ms", "lag p99", "cpu s", "srv late", "ok?"
    );
    let mut best_streams = 0;
    let mut streams_stop = Verdict::Kept;
    for c in [16usize, 64, 256, 512, 1024, 2048, 4096] {
        let server = start_server(server_core, 50, 10)?;
        // Whole waves: a partial last one would take a full latency for less.
        let waves = ((seconds / LATENCY_S).round() as usize).max(3);
        let v = run_client(client_core, &server.url, None, Some(c), waves * c)?;
        // Each of the c users sends its next request as soon as one ends:
        // c / latency requests per second is what a perfect client achieves.
        let truth = server_truth(&server.url)?;
        let true_ttft = truth.ttft;
        let offered = c as f64 / (truth.latency / 1e3);
        let achieved = num(&v, "request_throughput");
        let verdict = verdict(&v, achieved, offered, &truth);
        println!(
            "{c:>8} {achieved:>10.1} {offered:>10.1} {true_ttft:>9.2} {:>9.2} {:>9.3} {:>7.2} {:>8.3} {:>6}",
            num(&v, "ttft_mean_ms"),
            num(&v, "lag_p99_ms"),
            num(&v, "cpu_s"),
            truth.late,
            verdict.label()
        );
        if verdict != Verdict::Kept {
            streams_stop = verdict;
            break;
        }
        best_streams = c;
    }

    println!("\n(b, c) an instant server: everything at once, 128-token streams");
    let server = start_server(server_core, 0, 0)?;
    let v = run_client(client_core, &server.url, None, Some(256), 40_000)?;
    let chunks = num(&v, "chunks");
    let (req_s, chunk_s) = (num(&v, "request_throughput"), chunks / num(&v, "duration_s"));
    let cpu_per_m = num(&v, "cpu_s") / chunks * 1e6;
    println!(
        "requests/s {req_s:.0}, chunks/s {chunk_s:.0}, client CPU {:.2} s, {cpu_per_m:.2} s per million chunks",
        num(&v, "cpu_s")
    );
    drop(server);

    println!("\n(d) memory with 10,000 requests in flight (TTFT 50 ms, 10 ms between tokens)");
    let server = start_server(server_core, 50, 10)?;
    let v = run_client(client_core, &server.url, None, None, 10_000)?;
    let rss = num(&v, "peak_rss_mb");
    println!("peak concurrent {}, peak RSS {rss:.1} MB, ok {}", v["peak_concurrent"], v["ok"]);
    drop(server);

    println!("\n| measure | target | measured | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| (a) open-loop Poisson rate kept within 1% / TTFT within 2% | 1,000 req/s | {best_rate:.0} req/s{} | {:.2}x |",
        rate_stop.why(),
        best_rate / 1000.0
    );
    println!(
        "| (a) closed-loop streams kept within 1% / TTFT within 2% | 1,024 | {best_streams}{} | {:.2}x |",
        streams_stop.why(),
        best_streams as f64 / 1024.0
    );
    println!("| (b) requests per second, instant server | 4,000 | {req_s:.0} | {:.2}x |", req_s / 4000.0);
    println!("| (b) streamed chunks per second, instant server | - | {chunk_s:.0} | - |");
    println!(
        "| (c) client CPU s per million chunks, bundled | < 2.5 | {cpu_per_m:.2} | {:.2}x better |",
        2.5 / cpu_per_m
    );
    println!(
        "| (c) client CPU s per million chunks, one per read ({best_rate:.0} req/s) | < 2.5 | {streamed_per_m:.2} | {:.2}x better |",
        2.5 / streamed_per_m
    );
    println!(
        "| (c) the same, a bare reader (the floor) | - | {floor_per_m:.2} | loadgen {:.2}x the floor |",
        streamed_per_m / floor_per_m
    );
    println!("| (d) peak RSS, 10,000 in flight | < 50 MB | {rss:.1} MB | {:.2}x better |", 50.0 / rss);
    Ok(())
}
