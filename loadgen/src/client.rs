//! The HTTP side: one request to an OpenAI-compatible server, recorded chunk
//! by chunk.
//!
//! This is the hot path. It takes no locks and does no blocking I/O: request
//! bodies are serialized before the run, and each chunk's arrival time is
//! taken as soon as hyper hands over its bytes, before they are parsed.
//! Plain `http://` targets are spoken to with hyper's connection-level
//! HTTP/1.1 client, one connection per request in flight, reused, and driven
//! by the request's own task: no pool (whose lock and hidden connects a
//! general-purpose client would add), no extra task per connection.
//! `https://` targets go through reqwest; the parsing is shared.

use std::borrow::Cow;
use std::future::{Future, poll_fn};
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::StreamExt;
use http_body_util::Full;
use hyper::body::{Body as _, Bytes};
use hyper::client::conn::http1;
use hyper::header::{self, HeaderValue};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, SeqAccess, Visitor};
use serde_json::json;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::dataset::{Prompt, TokenCounter};
use crate::record::{Chunk, Chunks, Outcome, Phase, RequestRecord};

/// Which OpenAI API the requests use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`: the prompt as text, replies in `choices[0].text`.
    Completions,
    /// `/v1/chat/completions`: the prompt as one user message, replies in
    /// `choices[0].delta.content` or `.reasoning_content`.
    ChatCompletions,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::ChatCompletions => "/v1/chat/completions",
        }
    }

    /// The endpoint served at `path`, if it is one of ours.
    pub fn from_path(path: &str) -> Option<Endpoint> {
        [Endpoint::Completions, Endpoint::ChatCompletions].into_iter().find(|e| e.path() == path.trim_end_matches('/'))
    }
}

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
    let mut body = json!({
        "model": options.model,
        "max_tokens": prompt.max_tokens,
        "stream": options.stream,
    });
    if options.stream {
        body["stream_options"] = json!({ "include_usage": true });
    }
    match options.endpoint {
        Endpoint::Completions => body["prompt"] = json!(prompt.text),
        Endpoint::ChatCompletions => body["messages"] = json!([{ "role": "user", "content": prompt.text }]),
    }
    if prompt.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    if let Some(fields) = body.as_object_mut() {
        for (key, value) in options.extra {
            fields.insert(key.clone(), value.clone());
        }
    }
    body.to_string()
}

/// Where requests go and how.
pub(crate) enum Transport {
    /// Plain HTTP/1.1 over hyper, on our own connections.
    Http {
        /// `host:port`, to connect to.
        addr: String,
        /// The same, as the `Host` header.
        host: HeaderValue,
        path: hyper::Uri,
    },
    /// TLS through reqwest (which pools connections itself).
    Reqwest { client: reqwest::Client, url: String },
}

/// What every request of a run shares.
pub(crate) struct Target {
    pub transport: Transport,
    /// The whole `Authorization` header value.
    pub authorization: Option<HeaderValue>,
    pub api_key: Option<String>,
    pub stream: bool,
    pub timeouts: Timeouts,
    pub clock: Clock,
    /// Counts output tokens when the server gives no usage.
    pub counter: TokenCounter,
    /// Fired at the end of the run: requests still going are cancelled.
    pub cancel: CancellationToken,
}

/// hyper's side of one connection: the HTTP/1.1 state machine that does the
/// socket I/O. It is polled by whichever request task holds the connection.
type Driver = http1::Connection<TokioIo<TcpStream>, Full<Bytes>>;

/// An open keep-alive connection of the HTTP transport.
pub(crate) struct Conn {
    sender: http1::SendRequest<Full<Bytes>>,
    /// `None` once the connection has ended. Boxed: it is large, and the
    /// connection moves through every request task that uses it.
    driver: Option<Box<Driver>>,
}

/// Bytes hyper reads at a time. Small, because ten thousand connections
/// each hold one such buffer; a burst of chunks is read in several reads.
const READ_BUF: usize = 2048;

/// Opens a connection for the HTTP transport.
pub(crate) async fn connect(target: &Target) -> Result<Conn, String> {
    let Transport::Http { addr, .. } = &target.transport else {
        return Err("not an http transport".to_owned());
    };
    let tcp = match tokio::time::timeout(target.timeouts.connect, TcpStream::connect(addr.as_str())).await {
        Err(_) => return Err(format!("connect timeout: no connection to {addr} within {:?}", target.timeouts.connect)),
        Ok(Err(e)) => return Err(format!("cannot connect to {addr}: {e}")),
        Ok(Ok(tcp)) => tcp,
    };
    // Without it, Nagle holds a small request back behind the previous ack.
    tcp.set_nodelay(true).map_err(|e| format!("cannot set TCP_NODELAY on {addr}: {e}"))?;
    let (sender, driver) = http1::Builder::new()
        .read_buf_exact_size(Some(READ_BUF))
        .handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("cannot start http/1.1 on {addr}: {}", error_chain(&e)))?;
    Ok(Conn { sender, driver: Some(Box::new(driver)) })
}

/// Polls `poll` after letting the connection do its I/O, in the calling
/// task: the connection reads and decodes, `poll` takes what it decoded.
fn poll_driven<T>(
    driver: &mut Option<Box<Driver>>,
    cx: &mut Context<'_>,
    poll: impl FnOnce(&mut Context<'_>) -> Poll<T>,
) -> Poll<T> {
    if let Some(d) = driver
        && Pin::new(&mut **d).poll(cx).is_ready()
    {
        // Closed (or broken): whatever waits on it now sees the end.
        *driver = None;
    }
    poll(cx)
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
}

/// Sends one request and records it; failures are records too, never errors.
/// Returns the connection when it can carry the next request.
pub(crate) async fn send(target: &Target, request: Request, conn: Option<Conn>) -> (RequestRecord, Option<Conn>) {
    let mut rec = Recorder::new(target, &request);
    let cancel = target.cancel.clone();
    let mut kept = None;
    let outcome = tokio::select! {
        biased;
        () = cancel.cancelled() => Err(fail(Outcome::Cancelled, "cancelled: the run ended before the response did")),
        result = exchange(target, &request, conn, &mut rec, &mut kept) => result,
    };
    let completed_ns = target.clock.now_ns();
    (rec.finish(outcome, completed_ns), kept)
}

async fn exchange(
    target: &Target,
    request: &Request,
    conn: Option<Conn>,
    rec: &mut Recorder<'_>,
    kept: &mut Option<Conn>,
) -> Result<(), Failure> {
    match &target.transport {
        Transport::Http { host, path, .. } => {
            let reused = conn.is_some();
            let (result, conn) = http_exchange(target, host, path, &request.body, conn, rec).await;
            // A kept-alive connection the server closed while idle fails
            // before any response: once more on a new one.
            if reused && matches!(result, Err((Outcome::TransportError, _))) && rec.http_status.is_none() {
                // Boxed, as is reqwest's below: rare paths should not grow
                // every request task's state (ten thousand of them at once).
                let (result, conn) = Box::pin(http_exchange(target, host, path, &request.body, None, rec)).await;
                *kept = conn;
                return result;
            }
            *kept = conn;
            result
        }
        Transport::Reqwest { client, url } => Box::pin(reqwest_exchange(target, client, url, &request.body, rec)).await,
    }
}

fn http_request(
    target: &Target,
    host: &HeaderValue,
    path: &hyper::Uri,
    body: &Bytes,
) -> Result<hyper::Request<Full<Bytes>>, Failure> {
    let mut builder = hyper::Request::post(path.clone())
        .header(header::HOST, host.clone())
        .header(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .header(header::ACCEPT, HeaderValue::from_static("text/event-stream"));
    if let Some(auth) = &target.authorization {
        builder = builder.header(header::AUTHORIZATION, auth.clone());
    }
    builder
        .body(Full::new(body.clone()))
        .map_err(|e| fail(Outcome::TransportError, format!("cannot build the request: {e}")))
}

/// One request and response on a connection (opened here if `conn` is
/// `None`); returns the connection if it may be reused.
async fn http_exchange(
    target: &Target,
    host: &HeaderValue,
    path: &hyper::Uri,
    body: &Bytes,
    conn: Option<Conn>,
    rec: &mut Recorder<'_>,
) -> (Result<(), Failure>, Option<Conn>) {
    let mut conn = match conn {
        Some(conn) => conn,
        None => {
            let started = target.clock.now_ns();
            // Boxed: connecting (address parsing, the handshake) needs a
            // large state that a reused connection should not carry.
            match Box::pin(connect(target)).await {
                Ok(conn) => {
                    rec.connect_ns = Some(target.clock.now_ns() - started);
                    conn
                }
                Err(e) => {
                    let outcome =
                        if e.starts_with("connect timeout") { Outcome::Timeout } else { Outcome::TransportError };
                    rec.sent_ns = target.clock.now_ns();
                    return (Err((outcome, Some(e))), None);
                }
            }
        }
    };
    let request = match http_request(target, host, path, body) {
        Ok(request) => request,
        Err(failure) => return (Err(failure), None),
    };
    rec.sent_ns = target.clock.now_ns();
    rec.deadline = Instant::now() + target.timeouts.total;
    let result = http_response(&mut conn, request, rec).await;
    let reusable = result.as_ref().is_ok_and(|keep| *keep) && conn.driver.is_some() && !conn.sender.is_closed();
    (result.map(|_| ()), reusable.then_some(conn))
}

/// Sends the request and reads its response; `Ok(true)` when the
/// connection may be reused.
async fn http_response(
    conn: &mut Conn,
    request: hyper::Request<Full<Bytes>>,
    rec: &mut Recorder<'_>,
) -> Result<bool, Failure> {
    let Conn { sender, driver } = conn;
    // One timer for the whole exchange, moved only when a deadline comes
    // nearer, not once per chunk: see `Recorder::wait`.
    rec.timer_due = rec.read_deadline();
    let mut timer = std::pin::pin!(tokio::time::sleep_until(rec.timer_due));
    let unsent =
        |e: hyper::Error| fail(Outcome::TransportError, format!("cannot send the request: {}", error_chain(&e)));
    rec.wait(driver, timer.as_mut(), |cx| sender.poll_ready(cx)).await?.0.map_err(unsent)?;
    let mut response = std::pin::pin!(sender.send_request(request));
    let (response, _) = rec.wait(driver, timer.as_mut(), |cx| response.as_mut().poll(cx)).await?;
    let response = response.map_err(|e| {
        fail(
            Outcome::TransportError,
            format!("no response: the connection failed before one came: {}", error_chain(&e)),
        )
    })?;
    let mut at_ns = rec.target.clock.now_ns();
    rec.arrived(at_ns);
    let status = response.status();
    rec.http_status = Some(status.as_u16());
    let mut body = response.into_body();
    if !status.is_success() {
        // Read what the body has to say, but not forever.
        let mut excerpt = Vec::new();
        let read = async {
            while excerpt.len() < 200 {
                match poll_fn(|cx| poll_driven(driver, cx, |cx| Pin::new(&mut body).poll_frame(cx))).await {
                    Some(Ok(frame)) => excerpt.extend_from_slice(frame.data_ref().map_or(&[][..], |d| &d[..])),
                    _ => break,
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), read).await;
        let text = String::from_utf8_lossy(&excerpt);
        return Err(fail(Outcome::HttpError, format!("http {}: {}", status.as_u16(), head_of(text.trim()))));
    }
    loop {
        let (frame, waited) = rec.wait(driver, timer.as_mut(), |cx| Pin::new(&mut body).poll_frame(cx)).await?;
        // Frames decoded without waiting came in the same read: they share
        // its arrival time, as the read's bytes did.
        if waited {
            at_ns = rec.target.clock.now_ns();
            rec.arrived(at_ns);
        }
        match frame {
            None => {
                if rec.end(at_ns)? {
                    return Ok(true);
                }
                return Err(fail(Outcome::Disconnected, "disconnected: the response ended before [DONE]"));
            }
            Some(Err(e)) => return Err(body_failed(&e)),
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else { continue };
                if rec.feed(&data, at_ns)? {
                    break;
                }
                // The first token moves the deadline from the first-token
                // one to the idle one, which may be nearer.
                let due = rec.read_deadline();
                if due < rec.timer_due {
                    rec.timer_due = due;
                    timer.as_mut().reset(due);
                }
            }
        }
    }
    // [DONE]: the connection can carry the next request once the body's end
    // is in too, which it normally is (it came in the same read).
    loop {
        let next = poll_fn(|cx| Poll::Ready(poll_driven(driver, cx, |cx| Pin::new(&mut body).poll_frame(cx)))).await;
        match next {
            Poll::Ready(Some(Ok(_))) => {}
            Poll::Ready(None) => return Ok(true),
            Poll::Ready(Some(Err(_))) | Poll::Pending => return Ok(false),
        }
    }
}

/// The failure for a body that broke off: malformed framing, or a
/// connection that ended.
fn body_failed(e: &hyper::Error) -> Failure {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && matches!(io.kind(), std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput)
        {
            return fail(Outcome::Malformed, format!("malformed stream: bad chunked framing: {}", error_chain(e)));
        }
        source = s.source();
    }
    fail(
        Outcome::Disconnected,
        format!("disconnected mid-stream: the connection broke before [DONE]: {}", error_chain(e)),
    )
}

async fn reqwest_exchange(
    target: &Target,
    client: &reqwest::Client,
    url: &str,
    body: &Bytes,
    rec: &mut Recorder<'_>,
) -> Result<(), Failure> {
    let mut request = client.post(url).header("content-type", "application/json").body(body.clone());
    if let Some(key) = &target.api_key {
        request = request.bearer_auth(key);
    }
    rec.sent_ns = target.clock.now_ns();
    rec.deadline = Instant::now() + target.timeouts.total;
    let response = match tokio::time::timeout_at(rec.read_deadline(), request.send()).await {
        Err(_) => return Err(rec.timeout()),
        Ok(Err(e)) => return Err(fail(Outcome::TransportError, error_chain(&e))),
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    rec.http_status = Some(status.as_u16());
    if !status.is_success() {
        let body = tokio::time::timeout(Duration::from_secs(5), response.bytes()).await;
        let body = body.ok().and_then(Result::ok).unwrap_or_default();
        let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        return Err(fail(Outcome::HttpError, format!("http {status}: {}", head_of(text.trim()))));
    }
    let mut stream = response.bytes_stream();
    loop {
        let next = tokio::time::timeout_at(rec.read_deadline(), stream.next()).await;
        let at_ns = target.clock.now_ns();
        match next {
            Err(_) => return Err(rec.timeout()),
            Ok(None) => {
                if rec.end(at_ns)? {
                    return Ok(());
                }
                return Err(fail(Outcome::Disconnected, "disconnected: the stream ended before [DONE]"));
            }
            Ok(Some(Err(e))) => {
                let message =
                    format!("disconnected mid-stream: the connection broke before [DONE]: {}", error_chain(&e));
                return Err(fail(Outcome::Disconnected, message));
            }
            Ok(Some(Ok(bytes))) => {
                rec.arrived(at_ns);
                if rec.feed(&bytes, at_ns)? {
                    return Ok(());
                }
            }
        }
    }
}

type Failure = (Outcome, Option<String>);

fn fail(outcome: Outcome, error: impl Into<String>) -> Failure {
    (outcome, Some(error.into()))
}

/// A request's record in the making, and the parsing of its response.
struct Recorder<'t> {
    target: &'t Target,
    record: RequestRecord,
    connect_ns: Option<i64>,
    sent_ns: i64,
    http_status: Option<u16>,
    /// The total deadline, from the send.
    deadline: Instant,
    /// When the last bytes arrived: the idle timeout counts from here.
    last_read: Instant,
    /// Where the exchange's timer is set; never later than the real deadline.
    timer_due: Instant,
    /// Body bytes of a line not yet complete.
    pending: Vec<u8>,
    /// The data lines of the event being read.
    data: Vec<u8>,
    usage: Option<Usage>,
    /// The reply's text, kept only when a tokenizer must count it.
    text: Option<String>,
}

impl<'t> Recorder<'t> {
    fn new(target: &'t Target, request: &Request) -> Recorder<'t> {
        let now = Instant::now();
        // Sized for the reply asked for: no regrowth, no slack (a chunk per
        // token at most, and usually exactly that).
        let chunks = if target.stream { request.max_tokens.min(1 << 16) as usize } else { 1 };
        Recorder {
            target,
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
            },
            connect_ns: None,
            sent_ns: 0,
            http_status: None,
            deadline: now + target.timeouts.total,
            last_read: now,
            timer_due: now,
            pending: Vec::new(),
            data: Vec::new(),
            usage: None,
            text: target.counter.needs_text().then(String::new),
        }
    }

    /// Bytes arrived at `at_ns`: the idle timeout restarts.
    fn arrived(&mut self, at_ns: i64) {
        self.last_read = self.target.clock.at(Duration::from_nanos(u64::try_from(at_ns).unwrap_or(0)));
    }

    /// When the next bytes must have come: the first-token deadline until a
    /// token arrived, then the idle one, never past the total one.
    fn read_deadline(&self) -> Instant {
        let stage = if self.record.first_token_ns.is_none() {
            let sent = self.target.clock.at(Duration::from_nanos(u64::try_from(self.sent_ns).unwrap_or(0)));
            sent + self.target.timeouts.first_token
        } else {
            self.last_read + self.target.timeouts.idle
        };
        stage.min(self.deadline)
    }

    /// Waits for `poll` while driving the connection, until the read
    /// deadline; also says whether it had to wait (new bytes came since).
    ///
    /// The timer is set once and moved only when it fires early or a nearer
    /// deadline appears: re-arming it per chunk would cost more than the
    /// chunk's parsing.
    async fn wait<T>(
        &mut self,
        driver: &mut Option<Box<Driver>>,
        mut timer: Pin<&mut Sleep>,
        mut poll: impl FnMut(&mut Context<'_>) -> Poll<T>,
    ) -> Result<(T, bool), Failure> {
        let mut waited = false;
        let out = poll_fn(|cx| {
            if let Poll::Ready(v) = poll_driven(driver, cx, &mut poll) {
                return Poll::Ready(Some(v));
            }
            waited = true;
            loop {
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let due = self.read_deadline();
                if Instant::now() >= due {
                    return Poll::Ready(None);
                }
                self.timer_due = due;
                timer.as_mut().reset(due);
            }
        })
        .await;
        match out {
            Some(v) => Ok((v, waited)),
            None => Err(self.timeout()),
        }
    }

    /// The failure for the deadline that expired.
    fn timeout(&self) -> Failure {
        let t = &self.target.timeouts;
        let message = if Instant::now() >= self.deadline {
            format!("total timeout: no complete response within {:?}", t.total)
        } else if self.record.first_token_ns.is_none() {
            format!("first-token timeout: no token within {:?} of the send", t.first_token)
        } else {
            format!("idle timeout: no data for {:?} between chunks", t.idle)
        };
        fail(Outcome::Timeout, message)
    }

    /// Parses body bytes that arrived at `at_ns`, consuming whole lines;
    /// `Ok(true)` once the stream said `[DONE]`. A non-streamed body is
    /// gathered until its end.
    fn feed(&mut self, bytes: &[u8], at_ns: i64) -> Result<bool, Failure> {
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
    fn end(&mut self, at_ns: i64) -> Result<bool, Failure> {
        if self.target.stream {
            return Ok(false);
        }
        let body = std::mem::take(&mut self.pending);
        self.whole(&body, at_ns)?;
        Ok(true)
    }

    /// The SSE lines in `body`: how many bytes were whole lines, and whether
    /// `[DONE]` came.
    fn lines(&mut self, body: &[u8], at_ns: i64) -> Result<(usize, bool), Failure> {
        let mut consumed = 0;
        while let Some(nl) = memchr::memchr(b'\n', &body[consumed..]) {
            let line = &body[consumed..consumed + nl];
            consumed += nl + 1;
            let line = line.strip_suffix(b"\r").unwrap_or(line);
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
                if !self.data.is_empty() {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value.strip_prefix(b" ").unwrap_or(value));
            }
            // Other fields (event, id, retry) and comments carry nothing we use.
        }
        Ok((consumed, false))
    }

    /// One SSE event's data; `Ok(true)` for `[DONE]`.
    fn event(&mut self, data: &[u8], at_ns: i64) -> Result<bool, Failure> {
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            return Ok(true);
        }
        let chunk: StreamChunk<'_> = serde_json::from_slice(data).map_err(|e| {
            fail(
                Outcome::Malformed,
                format!("malformed stream: bad chunk ({e}): {}", head_of(&String::from_utf8_lossy(data))),
            )
        })?;
        if let Some(error) = chunk.error {
            return Err(fail(Outcome::Incomplete, format!("server error in stream: {}", head_of(&error.to_string()))));
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
    fn whole(&mut self, body: &[u8], at_ns: i64) -> Result<(), Failure> {
        let response: StreamChunk<'_> = serde_json::from_slice(body).map_err(|e| {
            fail(Outcome::Malformed, format!("malformed response ({e}): {}", head_of(&String::from_utf8_lossy(body))))
        })?;
        if let Some(error) = response.error {
            return Err(fail(Outcome::Incomplete, format!("server error: {}", head_of(&error.to_string()))));
        }
        if let Some(choice) = &response.choice {
            self.text_chunk(choice, at_ns);
        }
        self.usage = response.usage;
        Ok(())
    }

    fn finish(mut self, outcome: Result<(), Failure>, completed_ns: i64) -> RequestRecord {
        let r = &mut self.record;
        r.sent_ns = if self.sent_ns == 0 { completed_ns } else { self.sent_ns };
        r.connect_ns = self.connect_ns;
        r.http_status = self.http_status;
        r.completed_ns = completed_ns;
        (r.outcome, r.error) = match outcome {
            Ok(()) => (Outcome::Ok, None),
            Err(failure) => failure,
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
            (None, Some(text)) if !text.is_empty() => self.target.counter.count(text),
            (None, _) => counted,
        };
        if let Some(prompt) = self.usage.and_then(|u| u.prompt_tokens) {
            r.prompt_tokens = prompt;
        }
        self.record
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
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow)]
    delta: Option<Delta<'a>>,
    /// A non-streamed chat response.
    #[serde(borrow)]
    message: Option<Delta<'a>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    /// vLLM's newer name for `reasoning_content`.
    #[serde(borrow)]
    reasoning: Option<Cow<'a, str>>,
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
        assert_eq!(Endpoint::from_path("/v1/chat/completions/"), Some(Endpoint::ChatCompletions));
        assert_eq!(Endpoint::from_path("/v1/embeddings"), None);
    }
}
