//! The HTTP/1.1 transport against a scripted server on a raw socket: replies
//! that arrive a byte at a time, bodies framed by length, chunks or close,
//! connections kept alive, closed while idle, or closed by the server's word.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use benchfleet_loadgen::{LoadConfig, Outcome, run};
use rustls::pki_types::PrivateKeyDer;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::random_load;

/// How the scripted server answers a completion request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reply {
    /// A chunked SSE stream of three tokens, kept alive.
    Chunked,
    /// The same stream without framing: its end is the connection's close.
    UntilClose,
    /// A non-streamed JSON reply with a Content-Length, kept alive.
    Whole,
    /// The chunked stream with `Connection: close`.
    ChunkedThenClose,
    /// The chunked stream, then the connection closes without a word.
    ChunkedThenSilentClose,
    /// The chunked stream and bytes after its end, on a kept connection.
    ChunkedThenJunk,
    /// 503 with a body.
    Overloaded,
    /// A head that never ends.
    EndlessHead,
}

/// How the server writes.
#[derive(Clone, Copy, Debug)]
enum Pace {
    /// Every reply in one write.
    AtOnce,
    /// A byte per write, so the client's reads end anywhere.
    ByteByByte,
    /// Every line its own TLS record, all in one write: one read brings
    /// the reply's end in records after the one with `[DONE]`.
    RecordPerLine,
}

/// A server's side of a connection, plain or TLS.
trait Wire: AsyncRead + AsyncWrite + Unpin {
    /// Writes `parts` with one write to the socket, each part its own TLS
    /// record when there is TLS.
    async fn write_parts(&mut self, parts: &[&[u8]]) -> std::io::Result<()>;
}

impl Wire for TcpStream {
    async fn write_parts(&mut self, parts: &[&[u8]]) -> std::io::Result<()> {
        self.write_all(&parts.concat()).await
    }
}

impl Wire for TlsStream<TcpStream> {
    async fn write_parts(&mut self, parts: &[&[u8]]) -> std::io::Result<()> {
        use std::io::Write;
        let (tcp, session) = self.get_mut();
        for part in parts {
            session.writer().write_all(part)?;
        }
        let mut records = Vec::new();
        while session.wants_write() {
            session.write_tls(&mut records)?;
        }
        tcp.write_all(&records).await
    }
}

struct Scripted {
    url: String,
    connections: Arc<AtomicUsize>,
}

const EVENTS: [&str; 5] = [
    r#"{"choices":[{"text":"one"}]}"#,
    r#"{"choices":[{"text":" two"}]}"#,
    r#"{"choices":[{"text":" three"}]}"#,
    r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}"#,
    "[DONE]",
];

fn sse() -> String {
    EVENTS.iter().map(|e| format!("data: {e}\n\n")).collect()
}

fn chunked(body: &str) -> String {
    // One HTTP chunk per SSE event, as servers write them.
    let mut out: String = body.split_inclusive("\n\n").map(|e| format!("{:x}\r\n{e}\r\n", e.len())).collect();
    out.push_str("0\r\n\r\n");
    out
}

fn response(reply: Reply) -> (String, bool) {
    let stream = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n";
    match reply {
        Reply::Chunked => (format!("{stream}\r\n{}", chunked(&sse())), true),
        Reply::ChunkedThenClose => (format!("{stream}connection: close\r\n\r\n{}", chunked(&sse())), false),
        Reply::ChunkedThenSilentClose => (format!("{stream}\r\n{}", chunked(&sse())), false),
        Reply::ChunkedThenJunk => (format!("{stream}\r\n{}HTTP/1.1 200 OK\r\n", chunked(&sse())), true),
        Reply::UntilClose => (format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n{}", sse()), false),
        Reply::Whole => {
            let body = r#"{"choices":[{"text":"one two three"}],"usage":{"prompt_tokens":5,"completion_tokens":3}}"#;
            (format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len()), true)
        }
        Reply::EndlessHead => (format!("HTTP/1.1 200 OK\r\nx-pad: {}", "a".repeat(100_000)), true),
        Reply::Overloaded => {
            let body = "overloaded: try again later";
            (format!("HTTP/1.1 503 Service Unavailable\r\ncontent-length: {}\r\n\r\n{body}", body.len()), true)
        }
    }
}

async fn start(reply: Reply, pace: Pace) -> Scripted {
    start_with(reply, pace, None).await
}

/// The scripted server behind TLS, with a self-signed certificate for
/// 127.0.0.1, written as PEM into `dir` (the file is the second value).
async fn start_tls(reply: Reply, pace: Pace, dir: &std::path::Path) -> (Scripted, std::path::PathBuf) {
    let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).expect("certificate");
    let pem = dir.join("ca.pem");
    std::fs::write(&pem, key.cert.pem()).expect("write the certificate");
    let private = PrivateKeyDer::Pkcs8(key.signing_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![key.cert.der().clone()], private)
        .expect("server config");
    let server = start_with(reply, pace, Some(TlsAcceptor::from(Arc::new(config)))).await;
    (server, pem)
}

async fn start_with(reply: Reply, pace: Pace, tls: Option<TlsAcceptor>) -> Scripted {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{}", listener.local_addr().expect("addr"));
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::Relaxed);
            let _ = tcp.set_nodelay(true);
            match &tls {
                None => drop(tokio::spawn(serve(tcp, reply, pace))),
                Some(acceptor) => {
                    let acceptor = acceptor.clone();
                    tokio::spawn(async move {
                        if let Ok(stream) = acceptor.accept(tcp).await {
                            serve(stream, reply, pace).await;
                        }
                    });
                }
            }
        }
    });
    Scripted { url, connections }
}

/// Answers the requests of one connection until either side closes it.
async fn serve(mut tcp: impl Wire, reply: Reply, pace: Pace) {
    let mut buf = Vec::new();
    while let Some((head, _)) = crate::read_request(&mut tcp, &mut buf).await {
        let (text, keep) = if head.starts_with("get /v1/models") {
            let body = r#"{"object":"list","data":[{"id":"m"}]}"#;
            (format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len()), true)
        } else {
            response(reply)
        };
        let written = match pace {
            Pace::AtOnce => tcp.write_all(text.as_bytes()).await,
            Pace::RecordPerLine => {
                let lines: Vec<&[u8]> = text.split_inclusive('\n').map(str::as_bytes).collect();
                tcp.write_parts(&lines).await
            }
            Pace::ByteByByte => {
                let mut result = Ok(());
                for b in text.as_bytes() {
                    result = tcp.write_all(std::slice::from_ref(b)).await;
                    if result.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_micros(200)).await;
                }
                result
            }
        };
        if written.is_err() || !keep {
            // Said in the reply: the server ends its side properly (over TLS,
            // a close_notify). Unsaid: the connection just goes.
            if reply == Reply::ChunkedThenClose {
                let _ = tcp.shutdown().await;
            }
            return;
        }
    }
}

/// `n` requests, one at a time, on the scripted server.
fn one_at_a_time(server: &Scripted, n: usize, stream: bool) -> LoadConfig {
    let mut config = random_load(&server.url, "m", n, 5, 3);
    config.stream = stream;
    config.max_concurrency = Some(1);
    config.idle_timeout = Duration::from_secs(5);
    config
}

fn assert_all_ok(result: &benchfleet_loadgen::LoadResult, chunks: usize) {
    assert_eq!(result.summary.failed, 0, "{:?}", result.records.iter().map(|r| &r.error).collect::<Vec<_>>());
    for r in &result.records {
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        assert_eq!((r.output_tokens, r.prompt_tokens), (3, 5), "usage is the truth about tokens");
        assert_eq!(r.chunks.len(), chunks, "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_that_arrive_a_byte_at_a_time_read_the_same_and_keep_the_connection() {
    let _machine = crate::beside().await;
    for pace in [Pace::AtOnce, Pace::ByteByByte] {
        let server = start(Reply::Chunked, pace).await;
        let result = run(one_at_a_time(&server, 3, true), None).await.expect("run");
        assert_all_ok(&result, 3);
        // The models check's connection, and one for all three requests:
        // each reply was read to its very end, after `[DONE]`, before the
        // next request went on the same connection.
        assert_eq!(server.connections.load(Ordering::Relaxed), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_framed_by_length_or_by_close_are_read_whole() {
    let _machine = crate::beside().await;
    let server = start(Reply::Whole, Pace::ByteByByte).await;
    let result = run(one_at_a_time(&server, 2, false), None).await.expect("run");
    assert_all_ok(&result, 1);
    assert_eq!(server.connections.load(Ordering::Relaxed), 2, "kept alive");

    let server = start(Reply::UntilClose, Pace::AtOnce).await;
    let result = run(one_at_a_time(&server, 2, true), None).await.expect("run");
    assert_all_ok(&result, 3);
    assert_eq!(server.connections.load(Ordering::Relaxed), 1 + 2, "a body ended by its close ends the connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_the_server_closes_or_garbles_are_not_used_again() {
    let _machine = crate::beside().await;
    // Said in the reply, or not said at all: the next request goes on a new
    // connection either way (when unsaid, after its send on the old one
    // found it closed), and no request fails for it. Bytes after a reply's
    // end leave a connection out of step: it is not used again either.
    for reply in [Reply::ChunkedThenClose, Reply::ChunkedThenSilentClose, Reply::ChunkedThenJunk] {
        let server = start(reply, Pace::AtOnce).await;
        let result = run(one_at_a_time(&server, 3, true), None).await.expect("run");
        assert_all_ok(&result, 3);
        assert_eq!(server.connections.load(Ordering::Relaxed), 1 + 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_status_keeps_the_start_of_its_body() {
    let _machine = crate::beside().await;
    let server = start(Reply::Overloaded, Pace::ByteByByte).await;
    let result = run(one_at_a_time(&server, 2, true), None).await.expect("run");
    assert_eq!(result.summary.failed, 2);
    for r in &result.records {
        assert_eq!((r.outcome, r.http_status), (Outcome::HttpError, Some(503)), "{r:?}");
        assert_eq!(r.error.as_deref(), Some("http 503: overloaded: try again later"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_name_works_whichever_of_its_addresses_listens() {
    let _machine = crate::beside().await;
    let server = start(Reply::Chunked, Pace::AtOnce).await;
    // `localhost` may resolve to ::1 first, where nothing listens: the
    // connection goes to the next address.
    let by_name = server.url.replace("127.0.0.1", "localhost");
    let mut config = random_load(&by_name, "m", 4, 5, 3);
    config.max_concurrency = Some(2);
    let result = run(config, None).await.expect("run");
    assert_all_ok(&result, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_that_never_ends_is_malformed_not_kept_in_memory() {
    let _machine = crate::beside().await;
    let server = start(Reply::EndlessHead, Pace::AtOnce).await;
    let result = run(one_at_a_time(&server, 1, true), None).await.expect("run");
    let r = &result.records[0];
    assert_eq!(r.outcome, Outcome::Malformed, "{r:?}");
    assert_eq!(r.error.as_deref(), Some("malformed response: a response head longer than 65536 bytes"));
}

/// A server on a thread of its own: the first token 50 ms after the
/// request, the second 250 ms after that, the third 100 ms later. It says
/// when a completion request came in.
fn paced_server(requested: Arc<std::sync::atomic::AtomicBool>) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(mut tcp) = tcp else { return };
            let requested = Arc::clone(&requested);
            std::thread::spawn(move || {
                let _ = tcp.set_nodelay(true);
                let mut buf = Vec::new();
                let mut more = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match tcp.read(&mut more) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&more[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < end + 4 + length {
                        match tcp.read(&mut more) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&more[..n]),
                        }
                    }
                    buf.drain(..end + 4 + length);
                    if head.starts_with("get /v1/models") {
                        let body = r#"{"object":"list","data":[{"id":"m"}]}"#;
                        let reply = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
                        let _ = tcp.write_all(reply.as_bytes());
                        continue;
                    }
                    requested.store(true, Ordering::SeqCst);
                    let events = sse();
                    let mut parts = events.split_inclusive("\n\n").map(|e| format!("{:x}\r\n{e}\r\n", e.len()));
                    let head =
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                    let _ = tcp.write_all(head.as_bytes());
                    for pause in [50, 250, 100] {
                        std::thread::sleep(Duration::from_millis(pause));
                        let _ = tcp.write_all(parts.next().unwrap_or_default().as_bytes());
                    }
                    let rest: String = parts.chain(["0\r\n\r\n".to_owned()]).collect();
                    let _ = tcp.write_all(rest.as_bytes());
                }
            });
        }
    });
    url
}

/// One thread for the client, and it is kept busy while the first token
/// arrives: the token is timed by its arrival, not by the late read.
#[tokio::test(flavor = "current_thread")]
async fn a_chunk_is_timed_by_its_arrival_not_by_a_late_read() {
    let _machine = crate::alone().await;
    let requested = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let url = paced_server(Arc::clone(&requested));
    tokio::spawn(async move {
        while !requested.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // The whole runtime stops here, from about the request until long
        // after the first token came (at 50 ms).
        std::thread::sleep(Duration::from_millis(200));
    });
    let mut config = random_load(&url, "m", 1, 5, 3);
    config.max_concurrency = Some(1);
    let result = run(config, None).await.expect("run");
    let r = &result.records[0];
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let ms = |ns: i64| ns as f64 / 1e6;
    let times: Vec<f64> = r.chunks.iter().map(|c| ms(c.at_ns - r.sent_ns)).collect();
    // Read at 200 ms or later, it arrived at 50 ms; the next ones were read
    // as they came, at 300 and 400 ms.
    assert!((45.0..150.0).contains(&times[0]), "first token at {times:?} ms");
    assert!((295.0..400.0).contains(&times[1]) && times[2] - times[1] >= 95.0, "{times:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_streams_read_the_same_and_keep_their_connection() {
    let _machine = crate::beside().await;
    let dir = tempfile::tempdir().expect("tempdir");
    // A byte per write is a TLS record per byte; a record per line in one
    // write brings records past the reply's `[DONE]` in the same read.
    for pace in [Pace::AtOnce, Pace::ByteByByte, Pace::RecordPerLine] {
        let (server, ca) = start_tls(Reply::Chunked, pace, dir.path()).await;
        let mut config = one_at_a_time(&server, 3, true);
        config.ca_cert = Some(ca);
        let result = run(config, None).await.expect("run");
        assert_all_ok(&result, 3);
        // The models check's connection, and one for all three requests.
        assert_eq!(server.connections.load(Ordering::Relaxed), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_connections_closed_with_or_without_a_word_are_not_used_again() {
    let _machine = crate::beside().await;
    let dir = tempfile::tempdir().expect("tempdir");
    // With a close_notify after `Connection: close`, or a bare TCP close.
    for reply in [Reply::ChunkedThenClose, Reply::ChunkedThenSilentClose] {
        let (server, ca) = start_tls(reply, Pace::AtOnce, dir.path()).await;
        let mut config = one_at_a_time(&server, 3, true);
        config.ca_cert = Some(ca);
        let result = run(config, None).await.expect("run");
        assert_all_ok(&result, 3);
        assert_eq!(server.connections.load(Ordering::Relaxed), 1 + 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_or_an_unreadable_ca_file_fails_the_run_and_says_why() {
    let _machine = crate::beside().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (server, _) = start_tls(Reply::Chunked, Pace::AtOnce, dir.path()).await;
    let error = run(one_at_a_time(&server, 1, true), None).await.expect_err("an unknown issuer");
    // As the command line prints it.
    let chain = format!("{:#}", anyhow::Error::from(error));
    assert!(chain.contains("is its certificate trusted (--ca-cert)?") && chain.contains("UnknownIssuer"), "{chain}");

    let mut config = one_at_a_time(&server, 1, true);
    config.ca_cert = Some(dir.path().join("missing.pem"));
    let error = run(config, None).await.expect_err("no such file").to_string();
    assert!(error.starts_with("cannot read CA certificates from ") && error.contains("missing.pem"), "{error}");

    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate\n").expect("write");
    let mut config = one_at_a_time(&server, 1, true);
    config.ca_cert = Some(empty);
    let error = run(config, None).await.expect_err("no certificate in it").to_string();
    assert!(error.ends_with("it holds no certificate"), "{error}");
}

/// A server that counts prompt tokens its own way (5 whatever the prompt):
/// with a tokenizer, loadgen says so in its summary and its check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_token_counts_disagree_with_the_tokenizer_is_told() {
    let _machine = crate::beside().await;
    let server = start(Reply::Chunked, Pace::AtOnce).await;
    let mut config = one_at_a_time(&server, 3, true);
    config.dataset = benchfleet_loadgen::Dataset::Random { input_tokens: 40, output_tokens: 3, seed: 1 };
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    config.tokens = benchfleet_loadgen::TokenCounter::load(&fixture).expect("the fixture tokenizer");
    let result = run(config, None).await.expect("run");
    let check = result.summary.usage_check.expect("compared, with a tokenizer");
    assert_eq!((check.prompts_compared, check.prompts_off), (3, 3));
    assert!((check.prompt_ratio - 5.0 / 40.0).abs() < 1e-9, "{check:?}");
    // "one", " two", " three": three events of a token, as the server
    // counts; the first such reply is tokenized all the same (one in 128).
    assert_eq!((check.outputs_compared, check.outputs_off, check.output_ratio), (1, 0, 1.0));
    assert_eq!(check.outputs_by_events, 2, "agreed by their events, not tokenized again");
    let said = check.describe().expect("a disagreement");
    assert!(
        said.contains("prompt token counts differ from the tokenizer's on 3 of 3 requests (server / tokenizer 0.12)")
    );
    assert!(benchfleet_loadgen::block::render_self_check(&result.summary).contains("Token counts:"));
    // One event of three tokens: its count cannot be read off the events,
    // so every such reply is tokenized.
    let whole = start(Reply::Whole, Pace::AtOnce).await;
    let mut config = one_at_a_time(&whole, 3, false);
    config.tokens = benchfleet_loadgen::TokenCounter::load(&fixture).expect("the fixture tokenizer");
    let check = run(config, None).await.expect("run").summary.usage_check.expect("compared");
    assert_eq!((check.outputs_compared, check.outputs_off, check.outputs_by_events), (3, 0, 0));
    // Without a tokenizer nothing is compared: words are not tokens.
    let result = run(one_at_a_time(&server, 1, true), None).await.expect("run");
    assert_eq!(result.summary.usage_check, None);
}
