//! The HTTP side: one request to an OpenAI-compatible server, recorded chunk
//! by chunk.
//!
//! This is the hot path. It takes no locks and does no blocking I/O: request
//! bodies are serialized before the run, and each read's arrival time is
//! taken as soon as its bytes are in, before they are parsed. Targets are
//! spoken to with HTTP/1.1 framing of our own (`http1`, over `httparse`),
//! over TLS (rustls) for `https://`, one connection per request in flight,
//! reused, and driven by the request's own task: no pool, no extra task, no
//! buffer per connection.

mod error;
mod http1;

use std::borrow::Cow;
use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::io::{BufRead as _, Write as _};
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use benchfleet_core::metrics::USAGE_SAMPLE;
use bytes::Bytes;
use rustls::ClientConnection;
use rustls::pki_types::ServerName;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::json;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::dataset::{Prompt, TokenCounter};
use crate::record::{Chunk, Chunks, Outcome, Phase, RequestRecord, Turn};
pub use error::{ErrorKind, RequestError};
pub(crate) use http1::RequestHead;
use http1::{Decoder, Head, Step};

/// Which OpenAI API the requests use: the load spec's own.
pub use benchfleet_core::load::Endpoint;

/// How long each stage of a request may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Opening a connection.
    pub connect: Duration,
    /// From the send to the first token.
    pub first_token: Duration,
    /// Between two reads once the first token arrived.
    pub idle: Duration,
    /// The whole request, from its send.
    pub total: Duration,
}

/// What shapes every request body of a run.
#[derive(Clone, Debug)]
pub(crate) struct BodyOptions<'a> {
    pub endpoint: Endpoint,
    pub model: &'a str,
    pub stream: bool,
    /// Extra top-level fields, merged last (they win).
    pub extra: &'a serde_json::Map<String, serde_json::Value>,
}

/// The JSON body of one request.
pub(crate) fn request_body(options: &BodyOptions<'_>, prompt: &Prompt) -> String {
    conversation_body(options, std::slice::from_ref(&prompt.text), prompt.max_tokens, prompt.ignore_eos)
}

/// The JSON body of a request carrying a conversation: `messages` from the
/// user and the assistant in turn, the user's first and last. A chat
/// request sends them as messages; a completion, as one prompt of them on
/// lines of their own.
pub(crate) fn conversation_body(
    options: &BodyOptions<'_>,
    messages: &[String],
    max_tokens: u32,
    ignore_eos: bool,
) -> String {
    let mut body = json!({
        "model": options.model,
        "max_tokens": max_tokens,
        "stream": options.stream,
    });
    if options.stream {
        body["stream_options"] = json!({ "include_usage": true });
    }
    match options.endpoint {
        Endpoint::Completions => match messages {
            [one] => body["prompt"] = json!(one),
            _ => body["prompt"] = json!(messages.join("\n")),
        },
        Endpoint::Chat => {
            let roles = ["user", "assistant"].into_iter().cycle();
            body["messages"] = messages
                .iter()
                .zip(roles)
                .map(|(content, role)| json!({ "role": role, "content": content }))
                .collect::<serde_json::Value>();
        }
    }
    if ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    if let Some(fields) = body.as_object_mut() {
        for (key, value) in options.extra {
            fields.insert(key.clone(), value.clone());
        }
    }
    body.to_string()
}

/// Where requests go and how: HTTP/1.1 on our own connections, over TLS
/// for https.
pub(crate) struct Transport {
    /// `host:port`, as the user gave it.
    pub addr: String,
    /// Its addresses, resolved before the run; tried in order.
    pub addrs: Vec<SocketAddr>,
    /// Every request's head, but for its length.
    pub head: RequestHead,
    /// For https: how to begin TLS on each connection.
    pub tls: Option<Tls>,
}

/// TLS for an https target.
pub(crate) struct Tls {
    pub connector: tokio_rustls::TlsConnector,
    /// The name the server's certificate must carry.
    pub name: ServerName<'static>,
}

/// What every request of a run shares.
pub(crate) struct Target {
    pub transport: Arc<Transport>,
    pub stream: bool,
    pub timeouts: Timeouts,
    pub clock: Clock,
    /// Counts output tokens when the server gives no usage.
    pub counter: TokenCounter,
    /// Fired at the end of the run: requests still going are cancelled.
    pub cancel: CancellationToken,
    /// The server's token counts against the tokenizer's; `None` without
    /// a tokenizer. Whether prompts are compared (the completions endpoint).
    pub usage: Option<(UsageTally, bool)>,
    /// Successful measured replies whose usage counted fewer tokens than
    /// they streamed text events (`Summary::usage_below_events`).
    pub below_events: AtomicU64,
}

/// The running account behind `UsageCheck`.
#[derive(Default)]
pub(crate) struct UsageTally {
    prompts: [AtomicU64; 4],
    outputs: [AtomicU64; 4],
    /// Replies whose count their events agreed with, not tokenized.
    by_events: AtomicU64,
    /// Replies started: one in `USAGE_SAMPLE` keeps its text to be
    /// tokenized whatever its events say.
    started: AtomicU64,
    /// A reply came without the server's count, or with one its events did
    /// not agree with: from then on every reply keeps its text.
    distrust: AtomicBool,
}

impl UsageTally {
    fn add(counts: &[AtomicU64; 4], server: u32, tokenizer: u32) {
        counts[0].fetch_add(1, Ordering::Relaxed);
        counts[1].fetch_add(u64::from(benchfleet_core::metrics::UsageCheck::off(server, tokenizer)), Ordering::Relaxed);
        counts[2].fetch_add(u64::from(server), Ordering::Relaxed);
        counts[3].fetch_add(u64::from(tokenizer), Ordering::Relaxed);
    }

    pub fn check(&self) -> benchfleet_core::metrics::UsageCheck {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let ratio = |c: &[AtomicU64; 4]| if get(&c[3]) == 0 { 0.0 } else { get(&c[2]) as f64 / get(&c[3]) as f64 };
        benchfleet_core::metrics::UsageCheck {
            prompts_compared: get(&self.prompts[0]),
            prompts_off: get(&self.prompts[1]),
            prompt_ratio: ratio(&self.prompts),
            outputs_compared: get(&self.outputs[0]),
            outputs_off: get(&self.outputs[1]),
            output_ratio: ratio(&self.outputs),
            outputs_by_events: get(&self.by_events),
        }
    }

    /// Whether a reply about to start keeps its text for the tokenizer: one
    /// in `USAGE_SAMPLE`, and every one until a reply has agreed by its
    /// events or once one has not (its count then cannot be read off the
    /// events). Returns (keep the text, tokenize it whatever the events).
    fn keep_text(&self) -> (bool, bool) {
        let sampled = self.started.fetch_add(1, Ordering::Relaxed).is_multiple_of(USAGE_SAMPLE);
        let trusted = self.by_events.load(Ordering::Relaxed) > 0 && !self.distrust.load(Ordering::Relaxed);
        (sampled || !trusted, sampled)
    }

    /// Whether a finished reply of `server` completion tokens (if the server
    /// said) that streamed `events` text events must be tokenized: when they
    /// disagree (a server that streams several tokens an event, or
    /// miscounts) or it is in the sample; else it is counted as agreeing.
    fn must_tokenize(&self, server: Option<u32>, events: usize, sampled: bool) -> bool {
        match server {
            Some(n) if events == n as usize && !sampled => {
                self.by_events.fetch_add(1, Ordering::Relaxed);
                false
            }
            Some(n) if events == n as usize => true,
            _ => {
                self.distrust.store(true, Ordering::Relaxed);
                true
            }
        }
    }
}

/// An open keep-alive connection: its socket and, for https, its TLS state
/// (a response is read to its end before the connection is given back, so
/// no bytes are left over between requests).
pub(crate) struct Conn {
    tcp: TcpStream,
    /// Boxed: only https connections pay for it.
    tls: Option<Box<ClientConnection>>,
}

/// Bytes one read may take: a burst of chunks that arrived together is read
/// at once, and parsed before the next read of any connection of the thread.
const SCRATCH_LEN: usize = 64 * 1024;

thread_local! {
    /// Where reads land: one buffer per thread, shared by all its
    /// connections, so that ten thousand idle streams hold no read buffers.
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; SCRATCH_LEN].into_boxed_slice());
}

/// How long a connection may take, after `[DONE]`, to end its response
/// (and so be used again) before it is closed instead.
const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// Opens a connection, with its TLS handshake for https: both within
/// `timeout`.
pub(crate) async fn connect(transport: &Transport, timeout: Duration) -> Result<Conn, RequestError> {
    let Transport { addr, addrs, tls, .. } = transport;
    let opening = async {
        let tcp = TcpStream::connect(&addrs[..])
            .await
            .map_err(|error| RequestError::Connect { addr: addr.as_str().into(), error })?;
        // Without it, Nagle holds a small request back behind the previous ack.
        tcp.set_nodelay(true).map_err(|error| RequestError::NoDelay { addr: addr.as_str().into(), error })?;
        // Chunks are timed by their arrival, not their read (see `rx`);
        // without stamps they are timed by their read, so this is not worth
        // failing for.
        if let Err(e) = crate::rx::enable(&tcp) {
            tracing::debug!("no receive timestamps on {addr}: {e}");
        }
        let Some(tls) = tls else {
            return Ok(Conn { tcp, tls: None });
        };
        // Boxed: the handshake's state (a kilobyte) should not weigh on
        // every plain connection being opened.
        let stream = Box::pin(tls.connector.connect(tls.name.clone(), tcp))
            .await
            .map_err(|error| RequestError::Handshake { addr: addr.as_str().into(), error })?;
        // From here on the reads are ours (timed by arrival), the TLS state
        // rustls's.
        let (tcp, session) = stream.into_inner();
        Ok(Conn { tcp, tls: Some(Box::new(session)) })
    };
    match tokio::time::timeout(timeout, opening).await {
        Err(_) => Err(RequestError::ConnectTimeout { addr: addr.as_str().into(), timeout }),
        Ok(result) => result,
    }
}

/// One request ready to go.
pub(crate) struct Request {
    pub seq: u64,
    pub scheduled_ns: i64,
    pub slot_ns: Option<i64>,
    pub phase: Phase,
    pub body: Bytes,
    pub prompt_tokens: u32,
    /// The reply length asked for: the chunk list is sized for it up front.
    pub max_tokens: u32,
    /// Its session and turn, for a multi-turn dataset.
    pub turn: Option<Turn>,
    /// Give the reply's text back (the session's next turn carries it).
    pub keep_reply: bool,
}

/// Sends one request and records it; failures are records too, never errors.
/// Returns the connection when it can carry the next request, and the
/// reply's text when the request asked for it.
///
/// Ten thousand of these may be in flight at once, so what each holds while
/// it waits is kept small: the record in the making, the response's state,
/// the socket and one timer.
pub(crate) fn send(
    target: Arc<Target>,
    request: Request,
    mut conn: Option<Conn>,
) -> impl Future<Output = (RequestRecord, Option<Conn>, Option<String>)> + Send + 'static {
    // Built here and moved into the future, which uses them where they lie:
    // an `async fn` would keep a second copy of its arguments.
    let (mut rec, body) = Recorder::new(target, request);
    async move {
        let target = Arc::clone(&rec.target);
        let outcome = tokio::select! {
            biased;
            () = target.cancel.cancelled() => {
                // Its connection stopped mid-exchange: not to be used again.
                conn = None;
                Err(RequestError::Cancelled)
            }
            result = exchange(&target, &body, &mut conn, &mut rec) => result,
        };
        // A response that was whole before the cancel is not cancelled: only
        // the reading of its connection's last bytes was cut short (and the
        // connection is not kept).
        let outcome = match outcome {
            Err(RequestError::Cancelled) if rec.completed_ns.is_some() => Ok(()),
            other => other,
        };
        let completed_ns = rec.completed_ns.unwrap_or_else(|| target.clock.now_ns());
        let (record, reply) = rec.finish(outcome, completed_ns);
        (record, conn, reply)
    }
}

/// Sends `body` on the connection in `conn` (or a new one), leaving there
/// the connection if it may carry the next request.
async fn exchange(
    target: &Target,
    body: &Bytes,
    conn: &mut Option<Conn>,
    rec: &mut Recorder,
) -> Result<(), RequestError> {
    let head = &target.transport.head;
    let reused = conn.is_some();
    if !reused {
        // Boxed, as is the rare path below: it should not grow every
        // request task's state (ten thousand of them at once).
        *conn = Some(Box::pin(open(target, rec)).await?);
    }
    let result = match conn {
        Some(c) => http_exchange(target, head, body, c, rec).await,
        None => Ok(false),
    };
    match result {
        Ok(true) => Ok(()),
        Ok(false) => {
            *conn = None;
            Ok(())
        }
        // A kept-alive connection the server closed while idle fails before
        // any response: once more on a new one.
        Err(e) if reused && e.outcome() == Outcome::TransportError && rec.record.http_status.is_none() => {
            *conn = None;
            Box::pin(async {
                let mut fresh = open(target, rec).await?;
                let reusable = http_exchange(target, head, body, &mut fresh, rec).await?;
                *conn = reusable.then_some(fresh);
                Ok(())
            })
            .await
        }
        Err(failure) => {
            *conn = None;
            Err(failure)
        }
    }
}

/// Opens a connection for a request, recording how long it took.
async fn open(target: &Target, rec: &mut Recorder) -> Result<Conn, RequestError> {
    let started = target.clock.now_ns();
    let opened = connect(&target.transport, target.timeouts.connect).await;
    match &opened {
        Ok(_) => rec.record.connect_ns = Some(target.clock.now_ns() - started),
        Err(_) => rec.record.sent_ns = target.clock.now_ns(),
    }
    opened
}

/// One request and response on a connection; `Ok(true)` when the
/// connection may be used again.
async fn http_exchange(
    target: &Target,
    head: &RequestHead,
    body: &Bytes,
    conn: &mut Conn,
    rec: &mut Recorder,
) -> Result<bool, RequestError> {
    rec.record.sent_ns = target.clock.now_ns();
    rec.deadline = Instant::now() + target.timeouts.total;
    // One timer for the whole exchange, moved only when a deadline comes
    // nearer or it fires early, never once per chunk: see `wait`.
    rec.timer_due = rec.read_deadline();
    let mut timer = std::pin::pin!(tokio::time::sleep_until(rec.timer_due));
    {
        let mut wire = head.with_body(body);
        if let Some(tls) = &mut conn.tls {
            wire = seal(tls, &wire)?;
        }
        let mut written = 0;
        wait(rec, timer.as_mut(), |_, cx| poll_write_all(&mut conn.tcp, &wire, &mut written, cx)).await?;
    }
    let mut response = Response::new();
    wait(rec, timer.as_mut(), |rec, cx| poll_response(conn, &mut response, rec, cx)).await?;
    if !response.keep_alive() {
        return Ok(false);
    }
    if !response.ended() {
        // `[DONE]` came before the body's end (its last chunk, usually
        // written right after): read up to it, briefly, to use the
        // connection again.
        response.draining = true;
        let drained = wait(rec, timer, |rec, cx| poll_response(conn, &mut response, rec, cx)).await;
        return Ok(drained.is_ok() && response.ended());
    }
    Ok(true)
}

/// The TLS records that carry `plain`.
fn seal(tls: &mut ClientConnection, plain: &[u8]) -> Result<Vec<u8>, RequestError> {
    tls.writer().write_all(plain).map_err(RequestError::Seal)?;
    let mut wire = Vec::with_capacity(plain.len() + 64);
    while tls.wants_write() {
        tls.write_tls(&mut wire).map_err(RequestError::Seal)?;
    }
    Ok(wire)
}

fn poll_write_all(
    tcp: &mut TcpStream,
    wire: &[u8],
    written: &mut usize,
    cx: &mut Context<'_>,
) -> Poll<Result<(), RequestError>> {
    while *written < wire.len() {
        match Pin::new(&mut *tcp).poll_write(cx, &wire[*written..]) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(0)) => return Poll::Ready(Err(RequestError::SendClosed)),
            Poll::Ready(Ok(n)) => *written += n,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(RequestError::Send(e))),
        }
    }
    Poll::Ready(Ok(()))
}

/// Reads until the response is complete (or, draining, until its body's
/// end), parsing each read where it landed.
fn poll_response(
    conn: &mut Conn,
    response: &mut Response,
    rec: &mut Recorder,
    cx: &mut Context<'_>,
) -> Poll<Result<(), RequestError>> {
    SCRATCH.with_borrow_mut(|scratch| {
        loop {
            let received = match crate::rx::poll_recv(&conn.tcp, scratch, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(response.broken(e))),
                Poll::Ready(Ok(received)) => received,
            };
            let now_ns = rec.target.clock.now_ns();
            if received.len == 0 {
                return Poll::Ready(response.closed(now_ns, rec));
            }
            let bytes = &scratch[..received.len];
            // When the bytes arrived, never before what came earlier.
            let waited = i64::try_from(received.waited.as_nanos()).unwrap_or(i64::MAX);
            let at_ns = now_ns.saturating_sub(waited).max(rec.last_read_ns).max(rec.record.sent_ns);
            rec.arrived(at_ns);
            let outcome = match &mut conn.tls {
                None => response.input(bytes, at_ns, rec).map(|done| done.then_some(Ok(()))),
                Some(tls) => open_records(tls, bytes, response, at_ns, rec),
            };
            match outcome {
                Ok(None) => {}
                Ok(Some(result)) => return Poll::Ready(result),
                Err(failure) => return Poll::Ready(Err(failure)),
            }
        }
    })
}

/// Decrypts the TLS records in `cipher` and reads their plaintext as one
/// read of plain HTTP would be (all of it, even past the response's end);
/// `Some` once the response is complete, or the server closed the TLS
/// session.
fn open_records(
    tls: &mut ClientConnection,
    mut cipher: &[u8],
    response: &mut Response,
    at_ns: i64,
    rec: &mut Recorder,
) -> Result<Option<Result<(), RequestError>>, RequestError> {
    let mut complete = false;
    while !cipher.is_empty() {
        // rustls takes what it has room for; its plaintext is read out
        // before it takes more.
        if tls.read_tls(&mut cipher).map_err(RequestError::TlsRead)? == 0 {
            // Nothing taken: the session had already ended (close_notify).
            return Ok(Some(response.closed(at_ns, rec)));
        }
        let state = tls.process_new_packets().map_err(|e| RequestError::TlsRecord(Box::new(e)))?;
        let mut left = state.plaintext_bytes_to_read();
        let closed = state.peer_has_closed();
        while left > 0 {
            let plain = tls.reader().into_first_chunk().map_err(RequestError::TlsRead)?;
            let n = plain.len();
            if n == 0 {
                break;
            }
            complete = response.input(plain, at_ns, rec)?;
            tls.reader().consume(n);
            left = left.saturating_sub(n);
        }
        if closed {
            return Ok(Some(response.closed(at_ns, rec)));
        }
    }
    Ok(complete.then_some(Ok(())))
}

/// A response being read.
struct Response {
    head: Option<Head>,
    body: Decoder,
    /// The unparsed end of the previous read: part of the head or of the
    /// chunk framing, rarely more than a few bytes.
    carry: Vec<u8>,
    /// Some bytes of it came.
    began: bool,
    /// The reply is whole (`[DONE]`, or a non-streamed body's end): body
    /// bytes after it are only read to find the end.
    whole: bool,
    /// Reading only to find the body's end.
    draining: bool,
    /// Bytes came after the response's end.
    trailing: bool,
    /// A failed response's body, to say what went wrong.
    excerpt: Vec<u8>,
}

/// The most bytes of unfinished framing kept between reads: a head or a
/// chunk size line longer than this is not HTTP a server means.
const CARRY_LIMIT: usize = 64 * 1024;

/// As much of a failed response's body as is kept.
const EXCERPT_LEN: usize = 200;

impl Response {
    fn new() -> Response {
        Response {
            head: None,
            body: Decoder::Ended,
            carry: Vec::new(),
            began: false,
            whole: false,
            draining: false,
            trailing: false,
            excerpt: Vec::new(),
        }
    }

    fn ended(&self) -> bool {
        self.head.is_some() && self.body == Decoder::Ended
    }

    fn keep_alive(&self) -> bool {
        self.head.is_some_and(|h| h.keep_alive) && !self.trailing
    }

    fn failed(&self) -> bool {
        self.head.is_some_and(|h| !(200..300).contains(&h.status))
    }

    /// Takes the bytes of one read, arrived at `at_ns`; `Ok(true)` once the
    /// response is complete (draining: once its body ended).
    fn input(&mut self, bytes: &[u8], at_ns: i64, rec: &mut Recorder) -> Result<bool, RequestError> {
        self.began = true;
        let left = if self.carry.is_empty() {
            // The usual case: framing is whole within the read, parsed where
            // it lies; only an unfinished end is kept.
            let used = self.parse(bytes, at_ns, rec)?;
            let left = &bytes[used..];
            if !left.is_empty() && !self.ended() {
                self.carry.extend_from_slice(left);
            }
            left.len()
        } else {
            let mut carry = std::mem::take(&mut self.carry);
            carry.extend_from_slice(bytes);
            let used = self.parse(&carry, at_ns, rec)?;
            carry.drain(..used);
            let left = carry.len();
            if left > 0 && !self.ended() {
                self.carry = carry;
            }
            left
        };
        // Bytes past the response's end answer nothing we asked: the
        // connection is out of step and is not used again.
        self.trailing |= left > 0 && self.ended();
        if self.carry.len() > CARRY_LIMIT {
            let what = if self.head.is_none() { "a response head" } else { "a chunk size line" };
            return Err(RequestError::Oversized { what, limit: CARRY_LIMIT });
        }
        self.complete(at_ns, rec)
    }

    /// Parses what `bytes` holds whole; returns how many bytes it used.
    fn parse(&mut self, bytes: &[u8], at_ns: i64, rec: &mut Recorder) -> Result<usize, RequestError> {
        let mut used = 0;
        while self.head.is_none() {
            let Some(head) = http1::parse_head(&bytes[used..]).map_err(RequestError::BadHead)? else {
                return Ok(used);
            };
            used += head.len;
            // An interim response (100 Continue): the real one follows.
            if !(100..200).contains(&head.status) {
                rec.record.http_status = Some(head.status);
                self.head = Some(head);
                self.body = Decoder::new(head.body);
                // A proxy's or a web server's page is not a reply.
                let streamed = rec.target.stream && (200..300).contains(&head.status);
                if streamed && head.media != http1::Media::EventStream {
                    return Err(RequestError::NotEventStream {
                        status: head.status,
                        media: match head.media {
                            http1::Media::Missing => "no content-type".into(),
                            m => format!("content-type {}", m.as_str()).into(),
                        },
                    });
                }
            }
        }
        let failed = self.failed();
        loop {
            let step = self.body.step(&bytes[used..]).map_err(RequestError::BadFraming)?;
            match step {
                Step::Data { data, used: n } => {
                    used += n;
                    if failed {
                        let room = EXCERPT_LEN.saturating_sub(self.excerpt.len());
                        self.excerpt.extend_from_slice(&data[..data.len().min(room)]);
                    } else if !self.whole {
                        self.whole = rec.feed(data, at_ns)?;
                        if self.whole {
                            rec.completed_ns = Some(at_ns);
                        }
                    }
                }
                Step::More { used: n } | Step::End { used: n } => return Ok(used + n),
            }
        }
    }

    /// Whether the response is complete after the last read.
    fn complete(&mut self, at_ns: i64, rec: &mut Recorder) -> Result<bool, RequestError> {
        if self.failed() {
            if self.ended() || self.excerpt.len() >= EXCERPT_LEN {
                return Err(self.http_error());
            }
            return Ok(false);
        }
        if self.draining {
            return Ok(self.ended());
        }
        if self.whole {
            return Ok(true);
        }
        if !self.ended() {
            return Ok(false);
        }
        if rec.end(at_ns)? {
            rec.completed_ns = Some(at_ns);
            self.whole = true;
            return Ok(true);
        }
        Err(RequestError::EndedBeforeDone)
    }

    /// The server closed the connection at `at_ns`.
    fn closed(&mut self, at_ns: i64, rec: &mut Recorder) -> Result<(), RequestError> {
        if !self.began {
            return Err(RequestError::ClosedBeforeResponse);
        }
        if self.head.is_none() {
            return Err(RequestError::ClosedInHead);
        }
        if self.body.ends_at_close() {
            self.body = Decoder::Ended;
            if self.complete(at_ns, rec)? {
                return Ok(());
            }
        }
        if self.failed() {
            return Err(self.http_error());
        }
        if self.whole {
            // Complete, but the connection cannot be used again.
            self.draining = false;
            return Ok(());
        }
        Err(RequestError::ClosedMidStream)
    }

    /// The connection broke with `e`.
    fn broken(&self, e: std::io::Error) -> RequestError {
        if !self.began {
            return RequestError::NoResponse(e);
        }
        if self.failed() {
            return self.http_error();
        }
        RequestError::BrokeMidStream(e)
    }

    fn http_error(&self) -> RequestError {
        let status = self.head.map_or(0, |h| h.status);
        let text = String::from_utf8_lossy(&self.excerpt);
        RequestError::Status { status, excerpt: head_of(text.trim()).into() }
    }
}

/// Polls `poll` until it is ready or the read deadline passes.
///
/// The timer is set once and moved only when it fires early or a nearer
/// deadline appears: re-arming it per chunk would cost more than the
/// chunk's parsing.
async fn wait<T>(
    rec: &mut Recorder,
    mut timer: Pin<&mut Sleep>,
    mut poll: impl FnMut(&mut Recorder, &mut Context<'_>) -> Poll<Result<T, RequestError>>,
) -> Result<T, RequestError> {
    poll_fn(|cx| {
        if let Poll::Ready(v) = poll(rec, cx) {
            return Poll::Ready(v);
        }
        // The first token moves the deadline from the first-token one to
        // the idle one, which may be nearer.
        let due = rec.read_deadline();
        if due < rec.timer_due {
            rec.timer_due = due;
            timer.as_mut().reset(due);
        }
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let due = rec.read_deadline();
            if Instant::now() >= due {
                return Poll::Ready(Err(rec.timeout()));
            }
            rec.timer_due = due;
            timer.as_mut().reset(due);
        }
    })
    .await
}

/// A request's record in the making, and the parsing of its response.
struct Recorder {
    target: Arc<Target>,
    record: RequestRecord,
    /// The total deadline, from the send.
    deadline: Instant,
    /// When the last bytes arrived: the idle timeout counts from here.
    last_read_ns: i64,
    /// When the reply was whole: `[DONE]`, or a non-streamed body's end.
    completed_ns: Option<i64>,
    /// Where the exchange's timer is set; never later than the real deadline.
    timer_due: Instant,
    /// Body bytes of a line not yet complete.
    pending: Vec<u8>,
    /// The data lines of the event being read.
    data: Vec<u8>,
    /// The bytes so far ended with a CR: an LF that comes next is the rest
    /// of a CRLF, not a blank line.
    after_cr: bool,
    usage: Option<Usage>,
    /// The reply's text, kept only when a tokenizer must count it or the
    /// caller wants it back (`keep_reply`).
    text: Option<String>,
    keep_reply: bool,
    /// In the usage check's sample: tokenized whatever its events say.
    sampled: bool,
}

impl Recorder {
    /// The recorder of `request`, and the body to send.
    fn new(target: Arc<Target>, request: Request) -> (Recorder, Bytes) {
        let now = Instant::now();
        // Sized for the reply asked for: no regrowth, no slack (a chunk per
        // token at most, and usually exactly that).
        let chunks = if target.stream { request.max_tokens.min(1 << 16) as usize } else { 1 };
        let (keep, sampled) = match &target.usage {
            Some((tally, _)) => tally.keep_text(),
            None => (true, false),
        };
        let rec = Recorder {
            record: RequestRecord {
                seq: request.seq,
                scheduled_ns: request.scheduled_ns,
                sent_ns: 0,
                slot_ns: request.slot_ns,
                connect_ns: None,
                first_token_ns: None,
                completed_ns: 0,
                chunks: Chunks::with_capacity(chunks),
                prompt_tokens: request.prompt_tokens,
                output_tokens: 0,
                outcome: Outcome::Incomplete,
                http_status: None,
                error: None,
                phase: request.phase,
                turn: request.turn,
            },
            deadline: now + target.timeouts.total,
            last_read_ns: 0,
            completed_ns: None,
            timer_due: now,
            pending: Vec::new(),
            data: Vec::new(),
            after_cr: false,
            usage: None,
            text: ((keep && target.counter.needs_text()) || request.keep_reply).then(String::new),
            keep_reply: request.keep_reply,
            sampled,
            target,
        };
        (rec, request.body)
    }

    /// Bytes arrived at `at_ns`: the idle timeout restarts.
    fn arrived(&mut self, at_ns: i64) {
        self.last_read_ns = at_ns;
    }

    /// The instant of a clock reading.
    fn instant(&self, ns: i64) -> Instant {
        self.target.clock.at(Duration::from_nanos(u64::try_from(ns).unwrap_or(0)))
    }

    /// When the next bytes must have come: the first-token deadline until a
    /// token arrived, then the idle one, never past the total one.
    /// Once the reply is whole, the connection has a moment to end it.
    fn read_deadline(&self) -> Instant {
        let t = &self.target.timeouts;
        let stage = if let Some(completed) = self.completed_ns {
            self.instant(completed) + t.idle.min(DRAIN_LIMIT)
        } else if self.record.first_token_ns.is_none() {
            self.instant(self.record.sent_ns) + t.first_token
        } else {
            self.instant(self.last_read_ns) + t.idle
        };
        stage.min(self.deadline)
    }

    /// The failure for the deadline that expired.
    fn timeout(&self) -> RequestError {
        let t = &self.target.timeouts;
        if Instant::now() >= self.deadline {
            RequestError::TotalTimeout(t.total)
        } else if self.record.first_token_ns.is_none() {
            RequestError::FirstTokenTimeout(t.first_token)
        } else {
            RequestError::IdleTimeout(t.idle)
        }
    }

    /// Parses body bytes that arrived at `at_ns`, consuming whole lines;
    /// `Ok(true)` once the stream said `[DONE]`. A non-streamed body is
    /// gathered until its end.
    fn feed(&mut self, bytes: &[u8], at_ns: i64) -> Result<bool, RequestError> {
        if !self.target.stream {
            self.pending.extend_from_slice(bytes);
            return Ok(false);
        }
        if self.pending.is_empty() {
            // The usual case: the bytes hold whole lines; parse them where
            // they are and keep only a line's unfinished tail.
            let (consumed, done) = self.lines(bytes, at_ns)?;
            if !done {
                self.pending.extend_from_slice(&bytes[consumed..]);
            }
            return Ok(done);
        }
        let mut pending = std::mem::take(&mut self.pending);
        pending.extend_from_slice(bytes);
        let result = self.lines(&pending, at_ns);
        if let Ok((consumed, false)) = result {
            pending.drain(..consumed);
            self.pending = pending;
        }
        result.map(|(_, done)| done)
    }

    /// The body ended at `at_ns`: `Ok(true)` if the response is complete
    /// (a non-streamed body is parsed now).
    fn end(&mut self, at_ns: i64) -> Result<bool, RequestError> {
        if self.target.stream {
            return Ok(false);
        }
        let body = std::mem::take(&mut self.pending);
        self.whole(&body, at_ns)?;
        Ok(true)
    }

    /// The SSE lines in `body`: how many bytes were whole lines, and whether
    /// `[DONE]` came. As the SSE specification says, CRLF, a lone LF and a
    /// lone CR each end a line.
    fn lines(&mut self, body: &[u8], at_ns: i64) -> Result<(usize, bool), RequestError> {
        let mut consumed = 0;
        if !body.is_empty() && std::mem::take(&mut self.after_cr) && body[0] == b'\n' {
            consumed = 1;
        }
        while let Some(end) = memchr::memchr2(b'\n', b'\r', &body[consumed..]) {
            let line = &body[consumed..consumed + end];
            consumed += end + self.line_end(&body[consumed + end..]);
            if line.is_empty() {
                if !self.data.is_empty() {
                    let data = std::mem::take(&mut self.data);
                    let event = self.event(&data, at_ns);
                    self.data = data;
                    self.data.clear();
                    if event? {
                        return Ok((consumed, true));
                    }
                }
            } else if let Some(value) = line.strip_prefix(b"data:") {
                let value = value.strip_prefix(b" ").unwrap_or(value);
                // The usual event, one data line and its blank line, both
                // here: parsed where it lies, not copied.
                let rest = &body[consumed..];
                let blank = match rest {
                    [b'\n' | b'\r', ..] => self.line_end(rest),
                    _ => 0,
                };
                if blank > 0 && self.data.is_empty() {
                    consumed += blank;
                    if !value.is_empty() && self.event(value, at_ns)? {
                        return Ok((consumed, true));
                    }
                    continue;
                }
                if !self.data.is_empty() {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
            }
            // Other fields (event, id, retry) and comments carry nothing we use.
        }
        Ok((consumed, false))
    }

    /// How long the line end at the start of `rest` is (it begins with CR
    /// or LF). A CR that ends the bytes so far may be the first half of a
    /// CRLF: its LF is skipped when it comes.
    fn line_end(&mut self, rest: &[u8]) -> usize {
        match rest {
            [b'\r', b'\n', ..] => 2,
            [b'\r'] => {
                self.after_cr = true;
                1
            }
            _ => 1,
        }
    }

    /// One SSE event's data; `Ok(true)` for `[DONE]`.
    fn event(&mut self, data: &[u8], at_ns: i64) -> Result<bool, RequestError> {
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            return Ok(true);
        }
        let chunk: StreamChunk<'_> = serde_json::from_slice(data)
            .map_err(|error| RequestError::BadChunk { error, data: head_of(&String::from_utf8_lossy(data)).into() })?;
        if let Some(error) = chunk.error {
            return Err(RequestError::InStream(head_of(&error.to_string()).to_owned()));
        }
        if let Some(choice) = &chunk.choice {
            self.text_chunk(choice, at_ns);
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        Ok(false)
    }

    /// Records a chunk if the choice carries text.
    fn text_chunk(&mut self, choice: &Choice<'_>, at_ns: i64) {
        let parts = choice.parts();
        let words = words(&parts);
        if parts.iter().all(|p| p.is_empty()) {
            return;
        }
        self.record.first_token_ns.get_or_insert(at_ns);
        self.record.chunks.push(Chunk { at_ns, tokens: words.max(1) });
        if let Some(all) = &mut self.text {
            parts.iter().for_each(|p| all.push_str(p));
        }
    }

    /// A non-streamed response: one chunk, at its arrival.
    fn whole(&mut self, body: &[u8], at_ns: i64) -> Result<(), RequestError> {
        let response: StreamChunk<'_> = serde_json::from_slice(body)
            .map_err(|error| RequestError::BadBody { error, body: head_of(&String::from_utf8_lossy(body)).into() })?;
        if let Some(error) = response.error {
            return Err(RequestError::InBody(head_of(&error.to_string()).to_owned()));
        }
        if let Some(choice) = &response.choice {
            self.text_chunk(choice, at_ns);
        }
        self.usage = response.usage;
        Ok(())
    }

    fn finish(mut self, outcome: Result<(), RequestError>, completed_ns: i64) -> (RequestRecord, Option<String>) {
        let r = &mut self.record;
        if r.sent_ns == 0 {
            r.sent_ns = completed_ns;
        }
        r.completed_ns = completed_ns;
        let failure = match outcome {
            // As vLLM's bench counts it: a reply without a token has no
            // TTFT and is no success.
            Ok(()) if r.first_token_ns.is_none() => {
                Some(if self.target.stream { RequestError::NoTokensStreamed } else { RequestError::NoTokens })
            }
            Ok(()) => None,
            Err(failure) => Some(failure),
        };
        (r.outcome, r.error) = match failure {
            Some(failure) => (failure.outcome(), Some(failure.to_string())),
            None => (Outcome::Ok, None),
        };
        // A reply shorter than asked for gives its slack back.
        if r.chunks.capacity() > r.chunks.len() + r.chunks.len() / 8 + 8 {
            r.chunks.shrink_to_fit();
        }
        // The server's usage is the truth about tokens; else the tokenizer's
        // count of the reply, else the chunks' words.
        let counted: u32 = r.chunks.iter().map(|c| c.tokens).sum();
        r.output_tokens = match (self.usage.and_then(|u| u.completion_tokens), &self.text) {
            (Some(n), _) => n,
            (None, Some(text)) if !text.is_empty() && self.target.counter.needs_text() => {
                self.target.counter.count(text)
            }
            (None, _) => counted,
        };
        let measured = r.outcome.is_ok() && r.phase == benchfleet_core::record::Phase::Measured;
        if measured && self.usage.and_then(|u| u.completion_tokens).is_some_and(|n| (n as usize) < r.chunks.len()) {
            self.target.below_events.fetch_add(1, Ordering::Relaxed);
        }
        if let Some((tally, prompts)) = &self.target.usage
            && measured
        {
            if let (true, Some(server)) = (*prompts, self.usage.and_then(|u| u.prompt_tokens)) {
                UsageTally::add(&tally.prompts, server, r.prompt_tokens);
            }
            let server = self.usage.and_then(|u| u.completion_tokens);
            if tally.must_tokenize(server, r.chunks.len(), self.sampled)
                && let (Some(server), Some(text)) = (server, &self.text)
            {
                UsageTally::add(&tally.outputs, server, self.target.counter.count(text));
            }
        }
        if let Some(prompt) = self.usage.and_then(|u| u.prompt_tokens) {
            r.prompt_tokens = prompt;
        }
        let reply = if self.keep_reply { self.text } else { None };
        (self.record, reply)
    }
}

/// Whitespace-separated words of the parts taken as one text: the token
/// count of a chunk's text until the server's usage says otherwise (the
/// simulated engine counts this way).
fn words(parts: &[&str]) -> u32 {
    let mut count = 0u32;
    let mut in_word = false;
    for b in parts.iter().flat_map(|p| p.bytes()) {
        let space = b.is_ascii_whitespace();
        if !space && !in_word {
            count = count.saturating_add(1);
        }
        in_word = !space;
    }
    count
}

/// The first 200 bytes of `text`, cut at a character boundary.
fn head_of(text: &str) -> &str {
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// An error and its sources, as one line.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// One `data:` payload of the stream (or a whole non-streamed response);
/// only the fields we read, borrowed from the bytes where possible, and of
/// the choices only the first: nothing is allocated for a plain chunk.
#[derive(Deserialize)]
struct StreamChunk<'a> {
    #[serde(default, borrow, rename = "choices", deserialize_with = "first_choice")]
    choice: Option<Choice<'a>>,
    usage: Option<Usage>,
    error: Option<serde_json::Value>,
}

/// The first element of the `choices` list; the others are skipped.
fn first_choice<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Option<Choice<'a>>, D::Error> {
    struct First<'a>(PhantomData<Choice<'a>>);
    impl<'de: 'a, 'a> Visitor<'de> for First<'a> {
        type Value = Option<Choice<'a>>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of choices")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let first = seq.next_element::<Choice<'a>>()?;
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(first)
        }
    }
    d.deserialize_seq(First(PhantomData))
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default, borrow, deserialize_with = "text")]
    text: Option<Cow<'a, str>>,
    #[serde(borrow)]
    delta: Option<Delta<'a>>,
    /// A non-streamed chat response.
    #[serde(borrow)]
    message: Option<Delta<'a>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(default, borrow, deserialize_with = "text")]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "text")]
    reasoning_content: Option<Cow<'a, str>>,
    /// vLLM's newer name for `reasoning_content`.
    #[serde(default, borrow, deserialize_with = "text")]
    reasoning: Option<Cow<'a, str>>,
}

/// A string or null, borrowed from the chunk's bytes unless it has escapes
/// (serde's own `Option<Cow<str>>` always copies: an allocation per token).
fn text<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    struct Text;
    impl<'de> Visitor<'de> for Text {
        type Value = Option<Cow<'de, str>>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string or null")
        }

        fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Borrowed(v)))
        }

        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(v.to_owned())))
        }

        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
            Ok(Some(Cow::Owned(v)))
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_str(Text)
        }
    }
    d.deserialize_option(Text)
}

impl Choice<'_> {
    /// The text the choice carries, in order (reasoning, then content);
    /// all empty for a role-only, empty or usage-only chunk, which is not a
    /// token.
    fn parts(&self) -> [&str; 3] {
        fn s<'s>(s: &'s Option<Cow<'_, str>>) -> &'s str {
            s.as_deref().unwrap_or_default()
        }
        if !s(&self.text).is_empty() {
            return [s(&self.text), "", ""];
        }
        match self.delta.as_ref().or(self.message.as_ref()) {
            Some(d) => [s(&d.reasoning_content), s(&d.reasoning), s(&d.content)],
            None => ["", "", ""],
        }
    }
}

#[derive(Clone, Copy, Deserialize)]
struct Usage {
    prompt_tokens: Option<u32>,
    completion_tokens: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_chunks_with_text_are_tokens() {
        let check = |data: &str, expected: Option<&str>| {
            let chunk: StreamChunk<'_> = serde_json::from_str(data).expect("valid chunk");
            let text = chunk.choice.as_ref().map(|c| c.parts().concat()).filter(|t| !t.is_empty());
            assert_eq!(text.as_deref(), expected, "{data}");
        };
        check(r#"{"choices":[{"text":"hi"}]}"#, Some("hi"));
        check(r#"{"choices":[{"text":""}]}"#, None);
        check(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#, None);
        check(r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#, None);
        check(r#"{"choices":[{"delta":{"content":"x \"y\""}}]}"#, Some("x \"y\""));
        check(r#"{"choices":[{"delta":{"content":"caf\u00e9"}}]}"#, Some("café"));
        check(r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#, Some("hmm"));
        check(r#"{"choices":[{"delta":{"reasoning":"hmm","content":null}}]}"#, Some("hmm"));
        check(r#"{"choices":[{"message":{"content":"a b c"}}]}"#, Some("a b c"));
        check(r#"{"choices":[{"text":"a"},{"text":"b"}]}"#, Some("a"));
        check(r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#, None);
    }

    #[test]
    fn words_count_across_parts_as_one_text() {
        assert_eq!(words(&["a b", "", " c"]), 3);
        assert_eq!(words(&["a", "b", ""]), 1);
        assert_eq!(words(&["  ", "\n", ""]), 0);
        assert_eq!(words(&[" hello  world ", "", ""]), 2);
    }

    #[test]
    fn endpoints_round_trip_their_paths() {
        assert_eq!(Endpoint::from_path("/v1/completions"), Some(Endpoint::Completions));
        assert_eq!(Endpoint::from_path("/v1/chat/completions/"), Some(Endpoint::Chat));
        assert_eq!(Endpoint::from_path("/v1/embeddings"), None);
    }
}
