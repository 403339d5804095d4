//! The HTTP side: one request to an OpenAI-compatible server, recorded chunk
//! by chunk.
//!
//! This is the hot path. It takes no locks and does no blocking I/O: request
//! bodies are serialized before the run, each read's arrival time is taken
//! before its bytes are parsed, and plain `http://` targets are spoken to over
//! a minimal HTTP/1.1 client on one connection per request in flight (a
//! general-purpose client's pool takes a lock per request and hides connect
//! time). `https://` targets go through reqwest; the parsing is shared.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::dataset::{Prompt, TokenCounter};
use crate::record::{Chunk, Outcome, Phase, RequestRecord};

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
    /// Plain HTTP/1.1 on our own connections.
    Raw { addr: String, host: String, path: String },
    /// TLS through reqwest (which pools connections itself).
    Reqwest { client: reqwest::Client, url: String },
}

/// What every request of a run shares.
pub(crate) struct Target {
    pub transport: Transport,
    pub api_key: Option<String>,
    pub stream: bool,
    pub timeouts: Timeouts,
    pub clock: Clock,
    /// Counts output tokens when the server gives no usage.
    pub counter: TokenCounter,
    /// Fired at the end of the run: requests still going are cancelled.
    pub cancel: CancellationToken,
}

/// An open keep-alive connection of the raw transport, with any bytes read
/// past the previous response.
pub(crate) struct Conn {
    tcp: TcpStream,
    buf: Vec<u8>,
}

/// Opens a connection for the raw transport.
pub(crate) async fn connect(target: &Target) -> Result<Conn, String> {
    let Transport::Raw { addr, .. } = &target.transport else {
        return Err("not a raw transport".to_owned());
    };
    let tcp = match tokio::time::timeout(target.timeouts.connect, TcpStream::connect(addr.as_str())).await {
        Err(_) => return Err(format!("connect timeout: no connection to {addr} within {:?}", target.timeouts.connect)),
        Ok(Err(e)) => return Err(format!("cannot connect to {addr}: {e}")),
        Ok(Ok(tcp)) => tcp,
    };
    // Without it, Nagle holds a small request back behind the previous ack.
    tcp.set_nodelay(true).map_err(|e| format!("cannot set TCP_NODELAY on {addr}: {e}"))?;
    Ok(Conn { tcp, buf: Vec::new() })
}

/// Bytes asked of each read, into a buffer shared by the thread's requests:
/// a request in flight holds only what it has not parsed yet, so ten
/// thousand of them fit in little memory.
const READ_BUF: usize = 64 * 1024;

/// Buffers that grew past this while a burst was parsed are given back.
const KEEP_BUF: usize = 4096;

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0; READ_BUF]);
}

/// Gives memory back once a buffer is mostly empty again.
fn trim(buf: &mut Vec<u8>) {
    if buf.capacity() > KEEP_BUF && buf.len() < KEEP_BUF / 4 {
        buf.shrink_to(KEEP_BUF / 4);
    }
}

/// One request ready to go.
pub(crate) struct Request {
    pub seq: u64,
    pub scheduled_ns: i64,
    pub slot_ns: Option<i64>,
    pub phase: Phase,
    pub body: Arc<str>,
    pub prompt_tokens: u32,
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
        Transport::Raw { host, path, .. } => {
            let head = request_head(path, host, request.body.len(), target.api_key.as_deref());
            let reused = conn.is_some();
            let (result, conn) = raw_exchange(target, &head, &request.body, conn, rec).await;
            // A kept-alive connection the server closed while idle fails
            // before any byte of the response: once more on a new one.
            if reused
                && matches!(result, Err((Outcome::TransportError, _)))
                && rec.http_status.is_none()
                && !rec.had_bytes
            {
                let (result, conn) = raw_exchange(target, &head, &request.body, None, rec).await;
                *kept = conn;
                return result;
            }
            *kept = conn;
            result
        }
        Transport::Reqwest { client, url } => reqwest_exchange(target, client, url, &request.body, rec).await,
    }
}

fn request_head(path: &str, host: &str, len: usize, api_key: Option<&str>) -> Vec<u8> {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {len}\r\n"
    );
    if let Some(key) = api_key {
        head.push_str("Authorization: Bearer ");
        head.push_str(key);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head.into_bytes()
}

/// One request and response on a raw connection (opened here if `conn` is
/// `None`); returns the connection if it may be reused.
async fn raw_exchange(
    target: &Target,
    head: &[u8],
    body: &str,
    conn: Option<Conn>,
    rec: &mut Recorder<'_>,
) -> (Result<(), Failure>, Option<Conn>) {
    let mut conn = match conn {
        Some(conn) => conn,
        None => {
            let started = target.clock.now_ns();
            match connect(target).await {
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
    rec.sent_ns = target.clock.now_ns();
    rec.deadline = Instant::now() + target.timeouts.total;
    let mut message = Vec::with_capacity(head.len() + body.len());
    message.extend_from_slice(head);
    message.extend_from_slice(body.as_bytes());
    if let Err(e) = conn.tcp.write_all(&message).await {
        return (Err(fail(Outcome::TransportError, format!("cannot send the request: {e}"))), None);
    }
    drop(message);
    let result = read_response(&mut conn, rec).await;
    let reusable = result.as_ref().is_ok_and(|keep| *keep);
    (result.map(|_| ()), reusable.then_some(conn))
}

/// Reads one response; `Ok(true)` when the connection may be reused.
async fn read_response(conn: &mut Conn, rec: &mut Recorder<'_>) -> Result<bool, Failure> {
    // The head.
    let head_end = loop {
        if let Some(end) = find(&conn.buf, b"\r\n\r\n") {
            break end + 4;
        }
        let at = rec.read(&mut conn.tcp, &mut conn.buf).await?;
        if at.is_none() {
            return Err(fail(Outcome::TransportError, "the server closed the connection before answering"));
        }
    };
    let head = Head::parse(&conn.buf[..head_end])?;
    conn.buf.drain(..head_end);
    rec.http_status = Some(head.status);
    let mut framing = head.framing();
    let mut body = Vec::new();
    if !(200..300).contains(&head.status) {
        // Read what the body has to say, but not forever.
        let mut excerpt = Vec::new();
        while excerpt.len() < 200 {
            let done = framing.decode(&mut conn.buf, &mut excerpt)?;
            if done {
                break;
            }
            if rec.read(&mut conn.tcp, &mut conn.buf).await?.is_none() {
                break;
            }
        }
        let text = String::from_utf8_lossy(&excerpt);
        return Err(fail(Outcome::HttpError, format!("http {}: {}", head.status, head_of(text.trim()))));
    }
    let mut at_ns = rec.last_read_ns;
    loop {
        let ended = framing.decode(&mut conn.buf, &mut body)?;
        let done = rec.feed(&mut body, at_ns, ended)?;
        trim(&mut conn.buf);
        trim(&mut body);
        if done {
            // Done: the connection is reusable when the body ended cleanly.
            return Ok(ended && head.keep_alive && !matches!(framing, Framing::Close));
        }
        if ended {
            return Err(fail(Outcome::Incomplete, "disconnected: the response ended before [DONE]"));
        }
        match rec.read(&mut conn.tcp, &mut conn.buf).await? {
            Some(at) => at_ns = at,
            None => match framing {
                Framing::Close => {
                    if rec.feed(&mut body, at_ns, true)? {
                        return Ok(false);
                    }
                    return Err(fail(Outcome::Incomplete, "disconnected: the stream ended before [DONE]"));
                }
                _ => {
                    return Err(fail(
                        Outcome::Incomplete,
                        "disconnected mid-stream: the connection closed before [DONE]",
                    ));
                }
            },
        }
    }
}

async fn reqwest_exchange(
    target: &Target,
    client: &reqwest::Client,
    url: &str,
    body: &str,
    rec: &mut Recorder<'_>,
) -> Result<(), Failure> {
    let mut request = client.post(url).header("content-type", "application/json").body(body.to_owned());
    if let Some(key) = &target.api_key {
        request = request.bearer_auth(key);
    }
    rec.sent_ns = target.clock.now_ns();
    rec.deadline = Instant::now() + target.timeouts.total;
    let response = match tokio::time::timeout_at(rec.read_deadline(), request.send()).await {
        Err(_) => return Err(rec.timeout()),
        Ok(Err(e)) if e.is_connect() => return Err(fail(Outcome::TransportError, error_chain(&e))),
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
    let mut pending = Vec::new();
    loop {
        let next = tokio::time::timeout_at(rec.read_deadline(), stream.next()).await;
        let at_ns = target.clock.now_ns();
        match next {
            Err(_) => return Err(rec.timeout()),
            Ok(None) => {
                if rec.feed(&mut pending, at_ns, true)? {
                    return Ok(());
                }
                return Err(fail(Outcome::Incomplete, "disconnected: the stream ended before [DONE]"));
            }
            Ok(Some(Err(e))) => {
                return Err(fail(Outcome::Incomplete, format!("disconnected mid-stream: {}", error_chain(&e))));
            }
            Ok(Some(Ok(bytes))) => {
                rec.had_bytes = true;
                pending.extend_from_slice(&bytes);
                if rec.feed(&mut pending, at_ns, false)? {
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
    last_read_ns: i64,
    last_read: Instant,
    had_bytes: bool,
    /// The data lines of the event being read.
    data: Vec<u8>,
    usage: Option<Usage>,
    /// The reply's text, kept only when a tokenizer must count it.
    text: Option<String>,
}

impl<'t> Recorder<'t> {
    fn new(target: &'t Target, request: &Request) -> Recorder<'t> {
        let now = Instant::now();
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
                chunks: Vec::new(),
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
            last_read_ns: 0,
            last_read: now,
            had_bytes: false,
            data: Vec::new(),
            usage: None,
            text: target.counter.needs_text().then(String::new),
        }
    }

    /// When the next read must have come: the first-token deadline until a
    /// token arrived, then the idle one, never past the total one.
    fn read_deadline(&self) -> Instant {
        let stage = if self.record.first_token_ns.is_none() {
            let sent_ago = Duration::from_nanos(u64::try_from(self.target.clock.now_ns() - self.sent_ns).unwrap_or(0));
            Instant::now() + self.target.timeouts.first_token.saturating_sub(sent_ago)
        } else {
            self.last_read + self.target.timeouts.idle
        };
        stage.min(self.deadline)
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

    /// Reads more bytes into `buf`; `None` at the end of the connection.
    async fn read(&mut self, tcp: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Option<i64>, Failure> {
        let deadline = self.read_deadline();
        loop {
            match tokio::time::timeout_at(deadline, tcp.readable()).await {
                Err(_) => return Err(self.timeout()),
                Ok(Err(e)) => return Err(self.read_failed(&e)),
                Ok(Ok(())) => {}
            }
            // Readiness, then a non-blocking read into the shared buffer: no
            // borrow of it is held across an await.
            let read = SCRATCH.with_borrow_mut(|scratch| {
                let n = tcp.try_read(scratch)?;
                buf.extend_from_slice(&scratch[..n]);
                Ok::<_, std::io::Error>(n)
            });
            let at_ns = self.target.clock.now_ns();
            match read {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(self.read_failed(&e)),
                Ok(0) => return Ok(None),
                Ok(_) => {
                    self.had_bytes = true;
                    self.last_read_ns = at_ns;
                    self.last_read = Instant::now();
                    return Ok(Some(at_ns));
                }
            }
        }
    }

    fn read_failed(&self, e: &std::io::Error) -> Failure {
        let outcome = if self.http_status.is_some() { Outcome::Incomplete } else { Outcome::TransportError };
        fail(outcome, format!("disconnected: read failed: {e}"))
    }

    /// Parses the body bytes in `body` that arrived at `at_ns`, consuming
    /// whole lines; `Ok(true)` once the response is complete. `ended` says
    /// the body has no more bytes (a non-streamed body is parsed then).
    fn feed(&mut self, body: &mut Vec<u8>, at_ns: i64, ended: bool) -> Result<bool, Failure> {
        if !self.target.stream {
            if !ended {
                return Ok(false);
            }
            self.whole(body, at_ns)?;
            return Ok(true);
        }
        let mut consumed = 0;
        let mut done = false;
        while let Some(nl) = body[consumed..].iter().position(|&b| b == b'\n') {
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
                        done = true;
                        break;
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
        body.drain(..consumed);
        Ok(done)
    }

    /// One SSE event's data; `Ok(true)` for `[DONE]`.
    fn event(&mut self, data: &[u8], at_ns: i64) -> Result<bool, Failure> {
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            return Ok(true);
        }
        let chunk: StreamChunk<'_> = serde_json::from_slice(data).map_err(|e| {
            fail(
                Outcome::Incomplete,
                format!("malformed stream: bad chunk ({e}): {}", head_of(&String::from_utf8_lossy(data))),
            )
        })?;
        if let Some(error) = chunk.error {
            return Err(fail(Outcome::Incomplete, format!("server error in stream: {}", head_of(&error.to_string()))));
        }
        if let Some(text) = chunk.choices.first().and_then(Choice::text) {
            self.record.first_token_ns.get_or_insert(at_ns);
            self.record.chunks.push(Chunk { at_ns, tokens: words(&text).max(1) });
            if let Some(all) = &mut self.text {
                all.push_str(&text);
            }
        }
        if chunk.usage.is_some() {
            self.usage = chunk.usage;
        }
        Ok(false)
    }

    /// A non-streamed response: one chunk, at its arrival.
    fn whole(&mut self, body: &[u8], at_ns: i64) -> Result<(), Failure> {
        let response: StreamChunk<'_> = serde_json::from_slice(body).map_err(|e| {
            fail(Outcome::Incomplete, format!("malformed response ({e}): {}", head_of(&String::from_utf8_lossy(body))))
        })?;
        if let Some(error) = response.error {
            return Err(fail(Outcome::Incomplete, format!("server error: {}", head_of(&error.to_string()))));
        }
        if let Some(text) = response.choices.first().and_then(Choice::text) {
            self.record.first_token_ns = Some(at_ns);
            self.record.chunks.push(Chunk { at_ns, tokens: words(&text).max(1) });
            if let Some(all) = &mut self.text {
                all.push_str(&text);
            }
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

/// Whitespace-separated words: the token count of a chunk's text until the
/// server's usage says otherwise (the simulated engine counts this way).
fn words(text: &str) -> u32 {
    u32::try_from(text.split_ascii_whitespace().count()).unwrap_or(u32::MAX)
}

/// The parsed head of a response.
struct Head {
    status: u16,
    content_length: Option<u64>,
    chunked: bool,
    keep_alive: bool,
}

impl Head {
    fn parse(bytes: &[u8]) -> Result<Head, Failure> {
        let text =
            std::str::from_utf8(bytes).map_err(|_| fail(Outcome::TransportError, "response head is not utf-8"))?;
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        let status = parts
            .next()
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or_else(|| fail(Outcome::TransportError, format!("not an HTTP response: {}", head_of(status_line))))?;
        let mut head = Head { status, content_length: None, chunked: false, keep_alive: version == "HTTP/1.1" };
        for line in lines {
            let Some((name, value)) = line.split_once(':') else { continue };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                head.content_length = value.parse().ok();
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                head.chunked = value.to_ascii_lowercase().contains("chunked");
            } else if name.eq_ignore_ascii_case("connection") {
                let value = value.to_ascii_lowercase();
                if value.contains("close") {
                    head.keep_alive = false;
                } else if value.contains("keep-alive") {
                    head.keep_alive = true;
                }
            }
        }
        Ok(head)
    }

    fn framing(&self) -> Framing {
        if self.chunked {
            Framing::Chunked { remaining: 0, state: ChunkState::Size }
        } else if let Some(n) = self.content_length {
            Framing::Length(n)
        } else {
            Framing::Close
        }
    }
}

/// How the body's end is known.
enum Framing {
    Chunked {
        remaining: u64,
        state: ChunkState,
    },
    Length(u64),
    /// Until the server closes the connection.
    Close,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    Size,
    Data,
    DataEnd,
    Trailers,
    Done,
}

impl Framing {
    /// Moves the body bytes in `raw` to `body`, removing the framing; `true`
    /// once the body is complete.
    fn decode(&mut self, raw: &mut Vec<u8>, body: &mut Vec<u8>) -> Result<bool, Failure> {
        match self {
            Framing::Close => {
                body.append(raw);
                Ok(false)
            }
            Framing::Length(left) => {
                let take = (*left).min(raw.len() as u64) as usize;
                body.extend_from_slice(&raw[..take]);
                raw.drain(..take);
                *left -= take as u64;
                Ok(*left == 0)
            }
            Framing::Chunked { remaining, state } => {
                let mut pos = 0;
                let result = loop {
                    match *state {
                        ChunkState::Size => {
                            let Some(end) = find(&raw[pos..], b"\r\n") else { break Ok(false) };
                            let line = &raw[pos..pos + end];
                            let hex = line.split(|&b| b == b';').next().unwrap_or_default();
                            let size = std::str::from_utf8(hex)
                                .ok()
                                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
                                .ok_or_else(|| fail(Outcome::Incomplete, "malformed stream: bad chunk size"))?;
                            pos += end + 2;
                            *remaining = size;
                            *state = if size == 0 { ChunkState::Trailers } else { ChunkState::Data };
                        }
                        ChunkState::Data => {
                            let take = (*remaining).min((raw.len() - pos) as u64) as usize;
                            body.extend_from_slice(&raw[pos..pos + take]);
                            pos += take;
                            *remaining -= take as u64;
                            if *remaining > 0 {
                                break Ok(false);
                            }
                            *state = ChunkState::DataEnd;
                        }
                        ChunkState::DataEnd => {
                            if raw.len() - pos < 2 {
                                break Ok(false);
                            }
                            pos += 2;
                            *state = ChunkState::Size;
                        }
                        ChunkState::Trailers => {
                            let Some(end) = find(&raw[pos..], b"\r\n") else { break Ok(false) };
                            pos += end + 2;
                            if end == 0 {
                                *state = ChunkState::Done;
                            }
                        }
                        ChunkState::Done => break Ok(true),
                    }
                };
                raw.drain(..pos);
                result
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
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
/// only the fields we read, borrowed from the bytes where possible.
#[derive(Deserialize)]
struct StreamChunk<'a> {
    #[serde(default, borrow)]
    choices: Vec<Choice<'a>>,
    usage: Option<Usage>,
    error: Option<serde_json::Value>,
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
    /// The text the choice carries (content and reasoning), if any: a
    /// role-only, empty or usage-only chunk is not a token.
    fn text(&self) -> Option<String> {
        let some = |s: &Option<Cow<'_, str>>| s.as_deref().filter(|s| !s.is_empty()).map(str::to_owned);
        if let Some(text) = some(&self.text) {
            return Some(text);
        }
        let delta = self.delta.as_ref().or(self.message.as_ref())?;
        let parts: Vec<String> =
            [&delta.reasoning_content, &delta.reasoning, &delta.content].into_iter().filter_map(some).collect();
        (!parts.is_empty()).then(|| parts.concat())
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
            assert_eq!(chunk.choices.first().and_then(Choice::text).as_deref(), expected, "{data}");
        };
        check(r#"{"choices":[{"text":"hi"}]}"#, Some("hi"));
        check(r#"{"choices":[{"text":""}]}"#, None);
        check(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#, None);
        check(r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#, None);
        check(r#"{"choices":[{"delta":{"content":"x \"y\""}}]}"#, Some("x \"y\""));
        check(r#"{"choices":[{"delta":{"reasoning_content":"hmm"}}]}"#, Some("hmm"));
        check(r#"{"choices":[{"delta":{"reasoning":"hmm","content":null}}]}"#, Some("hmm"));
        check(r#"{"choices":[{"message":{"content":"a b c"}}]}"#, Some("a b c"));
        check(r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#, None);
    }

    #[test]
    fn endpoints_round_trip_their_paths() {
        assert_eq!(Endpoint::from_path("/v1/completions"), Some(Endpoint::Completions));
        assert_eq!(Endpoint::from_path("/v1/chat/completions/"), Some(Endpoint::ChatCompletions));
        assert_eq!(Endpoint::from_path("/v1/embeddings"), None);
    }

    #[test]
    fn chunked_bodies_decode_across_reads() {
        let mut framing = Framing::Chunked { remaining: 0, state: ChunkState::Size };
        let mut body = Vec::new();
        let mut raw = b"5\r\nhel".to_vec();
        assert!(!framing.decode(&mut raw, &mut body).expect("decodes"));
        raw.extend_from_slice(b"lo\r\n3;ext=1\r\n wo\r\n0\r\n");
        assert!(!framing.decode(&mut raw, &mut body).expect("decodes"));
        raw.extend_from_slice(b"\r\nNEXT");
        assert!(framing.decode(&mut raw, &mut body).expect("decodes"));
        assert_eq!(body, b"hello wo");
        assert_eq!(raw, b"NEXT", "bytes of the next response stay");
    }

    #[test]
    fn response_heads_give_status_and_framing() {
        let head = Head::parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").expect("parses");
        assert!(head.chunked && head.keep_alive && head.status == 200);
        let head =
            Head::parse(b"HTTP/1.1 500 Oops\r\ncontent-length: 12\r\nConnection: close\r\n\r\n").expect("parses");
        assert!(!head.keep_alive && head.content_length == Some(12) && head.status == 500);
        assert!(Head::parse(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
    }
}
