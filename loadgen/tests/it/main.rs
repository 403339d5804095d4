//! Integration tests of benchfleet-loadgen, against fake servers that run in
//! the test: an OpenAI-compatible one with known timings and an
//! IngestService that stands in for the controller, and a scripted raw-socket
//! server for the HTTP transport.

mod accuracy;
mod cli;
mod fake_ingest;
mod fake_openai;
mod load;
mod report;
mod spec;
mod streams;
mod transport;

use std::time::Duration;

use benchfleet_loadgen::{Dataset, LoadConfig};

/// The machine, as the tests of this binary share it: a test that holds a
/// measurement to a server's known timing, or keeps both cores busy
/// (dozens of loadgen processes), runs `alone`; every other test runs
/// `beside` the others. Run side by side, a busy test made a measured TTFT
/// a few percent late (205.97 ms against a truth of 201.38 on 2 cores).
static MACHINE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

async fn alone() -> tokio::sync::RwLockWriteGuard<'static, ()> {
    MACHINE.write().await
}

async fn beside() -> tokio::sync::RwLockReadGuard<'static, ()> {
    MACHINE.read().await
}

/// Attempts at a test that holds a measurement to a timing: a machine busy
/// with other work can delay a server's chunk or a client's read by a few
/// milliseconds, so an attempt whose timings missed (the misses it returns)
/// is inconclusive and runs again; a client that measures wrong misses
/// every time, and the test fails saying each attempt's misses. What an
/// attempt counts (requests, tokens, orders) it asserts itself, at once.
async fn attempts<F, Fut>(what: &str, mut attempt: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Vec<String>>,
{
    const ATTEMPTS: usize = 3;
    let mut said = Vec::new();
    for n in 1..=ATTEMPTS {
        let misses = attempt().await;
        if misses.is_empty() {
            return;
        }
        eprintln!("{what}: attempt {n} inconclusive: {misses:?}");
        said.push(format!("attempt {n}: {}", misses.join("; ")));
    }
    panic!("{what}: every attempt missed:\n{}", said.join("\n"));
}

/// A timing further than `share` from its truth, said in `misses`.
fn near(misses: &mut Vec<String>, name: &str, measured: f64, truth: f64, share: f64) {
    if (measured - truth).abs() > share * truth.abs() {
        misses.push(format!("{name}: measured {measured:.4}, truth {truth:.4}"));
    }
}

/// The next request a test server reads on a connection: its head
/// (lowercased) and its body, as long as its Content-Length says; `None`
/// once the client closes. `buf` keeps what was read past it.
async fn read_request(tcp: &mut (impl tokio::io::AsyncRead + Unpin), buf: &mut Vec<u8>) -> Option<(String, Vec<u8>)> {
    use tokio::io::AsyncReadExt as _;
    let mut more = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match tcp.read(&mut more).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&more[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize =
        head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    while buf.len() < head_end + length {
        match tcp.read(&mut more).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&more[..n]),
        }
    }
    let body = buf.drain(..head_end + length).skip(head_end).collect();
    Some((head, body))
}

/// A run of `n` random requests of `input` prompt and `output` reply tokens.
fn random_load(base_url: &str, model: &str, n: usize, input: u32, output: u32) -> LoadConfig {
    let dataset = Dataset::Random { input_tokens: input, output_tokens: output, seed: 42 };
    let mut config = LoadConfig::new(base_url, model, dataset, n);
    config.idle_timeout = Duration::from_secs(20);
    config.total_timeout = Duration::from_secs(60);
    config
}
