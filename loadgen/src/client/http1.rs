//! HTTP/1.1 framing for the plain `http://` transport: the request's bytes,
//! the response's head (parsed by `httparse`) and its body's framing
//! (content length, chunks, or until close).
//!
//! Pure: bytes in, body bytes out; the exchange in `client` does the I/O.
//! It is this small on purpose. A load generator holds one connection per
//! request in flight, ten thousand at once, and reads a chunk of a few
//! hundred bytes per wake-up: here a connection is its socket and nothing
//! else, a read lands in a buffer shared by the thread, and body bytes are
//! handed to the SSE parser where they lie, never through a channel.

use httparse::Status;

/// The bytes of a request, up to its `Content-Length` value.
#[derive(Clone, Debug)]
pub(crate) struct RequestHead {
    prefix: Box<[u8]>,
}

impl RequestHead {
    /// A JSON `POST` to `path` on `host`; `authorization` is the whole
    /// header value. Errors name the part that a header cannot carry.
    pub fn post(path: &str, host: &str, authorization: Option<&str>) -> Result<RequestHead, String> {
        if !path.starts_with('/') || path.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(format!("the path {path:?} is not a valid request target"));
        }
        if host.is_empty() || host.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(format!("the host {host:?} is not a valid Host header"));
        }
        let mut head = format!(
            "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
        );
        if let Some(auth) = authorization {
            // Visible ASCII and spaces only: a line break would end the
            // header and let the rest be read as another.
            if auth.bytes().any(|b| !(b.is_ascii_graphic() || b == b' ')) {
                return Err("the api key holds characters a header cannot carry".to_owned());
            }
            head.push_str("Authorization: ");
            head.push_str(auth);
            head.push_str("\r\n");
        }
        head.push_str("Content-Length: ");
        Ok(RequestHead { prefix: head.into_bytes().into_boxed_slice() })
    }

    /// The whole request with `body`, ready for one write.
    pub fn with_body(&self, body: &[u8]) -> Vec<u8> {
        let length = body.len().to_string();
        let mut wire = Vec::with_capacity(self.prefix.len() + length.len() + 4 + body.len());
        wire.extend_from_slice(&self.prefix);
        wire.extend_from_slice(length.as_bytes());
        wire.extend_from_slice(b"\r\n\r\n");
        wire.extend_from_slice(body);
        wire
    }
}

/// What a response's head says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Head {
    pub status: u16,
    pub body: Framing,
    /// Whether the connection may carry another request after this one.
    pub keep_alive: bool,
    /// Bytes the head took.
    pub len: usize,
    /// What its content-type says the body is.
    pub media: Media,
}

/// A response body's media type, as far as a client of inference servers
/// tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Media {
    EventStream,
    Json,
    Html,
    Text,
    Other,
    /// No content-type header.
    Missing,
}

impl Media {
    fn of(value: &str) -> Media {
        let essence = value.split(';').next().unwrap_or_default().trim();
        let is = |t: &str| essence.eq_ignore_ascii_case(t);
        if is("text/event-stream") {
            Media::EventStream
        } else if is("application/json") {
            Media::Json
        } else if is("text/html") {
            Media::Html
        } else if is("text/plain") {
            Media::Text
        } else {
            Media::Other
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Media::EventStream => "text/event-stream",
            Media::Json => "application/json",
            Media::Html => "text/html",
            Media::Text => "text/plain",
            Media::Other => "another media type",
            Media::Missing => "no content-type",
        }
    }
}

/// How a response's body is delimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framing {
    Length(u64),
    Chunked,
    /// Until the server closes the connection.
    UntilClose,
}

/// Most headers a response head may have.
const MAX_HEADERS: usize = 64;

/// Parses a response head from the start of `bytes`: `None` while it is
/// incomplete. An interim (1xx) head is returned too: its caller skips it.
pub(crate) fn parse_head(bytes: &[u8]) -> Result<Option<Head>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(bytes) {
        Ok(Status::Complete(len)) => len,
        Ok(Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad response head: {e}")),
    };
    let status = response.code.unwrap_or_default();
    let http11 = response.version == Some(1);
    let (mut chunked, mut length, mut close, mut keep_alive_token) = (false, None, false, false);
    let mut media = Media::Missing;
    for header in response.headers.iter() {
        let value = std::str::from_utf8(header.value).unwrap_or_default().trim();
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            // Chunked only if it is the last coding applied.
            chunked = value.rsplit(',').next().is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        } else if header.name.eq_ignore_ascii_case("content-length") {
            let n: u64 = value.parse().map_err(|_| format!("bad response head: content-length {value:?}"))?;
            if length.is_some_and(|l| l != n) {
                return Err("bad response head: two different content-length values".to_owned());
            }
            length = Some(n);
        } else if header.name.eq_ignore_ascii_case("content-type") {
            media = Media::of(value);
        } else if header.name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                close |= token.eq_ignore_ascii_case("close");
                keep_alive_token |= token.eq_ignore_ascii_case("keep-alive");
            }
        }
    }
    let body = if (100..200).contains(&status) || status == 204 || status == 304 {
        Framing::Length(0)
    } else if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    let keep_alive = !close && (http11 || keep_alive_token) && body != Framing::UntilClose;
    Ok(Some(Head { status, body, keep_alive, len, media }))
}

/// Where a body's decoding stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decoder {
    /// Bytes of the body still to come.
    Length(u64),
    /// Before a chunk's size line.
    ChunkSize,
    /// Bytes of the current chunk still to come.
    ChunkData(u64),
    /// The line break after a chunk's data.
    ChunkEnd,
    /// The trailer lines after the last chunk, up to an empty line.
    Trailers,
    UntilClose,
    Ended,
}

/// One step of decoding: `used` bytes of the input were taken.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step<'a> {
    /// Body bytes; more may follow in the rest of the input.
    Data { data: &'a [u8], used: usize },
    /// The input ends within framing: keep its rest for the next read.
    More { used: usize },
    /// The body is complete.
    End { used: usize },
}

impl Decoder {
    pub fn new(framing: Framing) -> Decoder {
        match framing {
            Framing::Length(0) => Decoder::Ended,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::ChunkSize,
            Framing::UntilClose => Decoder::UntilClose,
        }
    }

    /// Decodes from the start of `input` up to the next body bytes, the
    /// body's end, or the end of what framing the input holds.
    pub fn step<'a>(&mut self, input: &'a [u8]) -> Result<Step<'a>, String> {
        let mut used = 0;
        loop {
            let rest = &input[used..];
            match *self {
                Decoder::Ended => return Ok(Step::End { used }),
                Decoder::Length(n) | Decoder::ChunkData(n) => {
                    if rest.is_empty() {
                        return Ok(Step::More { used });
                    }
                    let take = rest.len().min(usize::try_from(n).unwrap_or(usize::MAX));
                    let left = n - take as u64;
                    *self = match (*self, left) {
                        (Decoder::Length(_), 0) => Decoder::Ended,
                        (Decoder::Length(_), _) => Decoder::Length(left),
                        (_, 0) => Decoder::ChunkEnd,
                        _ => Decoder::ChunkData(left),
                    };
                    return Ok(Step::Data { data: &rest[..take], used: used + take });
                }
                Decoder::UntilClose => {
                    if rest.is_empty() {
                        return Ok(Step::More { used });
                    }
                    return Ok(Step::Data { data: rest, used: used + rest.len() });
                }
                Decoder::ChunkSize => match httparse::parse_chunk_size(rest) {
                    Ok(Status::Complete((n, 0))) => {
                        used += n;
                        *self = Decoder::Trailers;
                    }
                    Ok(Status::Complete((n, size))) => {
                        used += n;
                        *self = Decoder::ChunkData(size);
                    }
                    Ok(Status::Partial) => return Ok(Step::More { used }),
                    Err(_) => return Err(format!("bad chunk size line: {:?}", excerpt(rest))),
                },
                Decoder::ChunkEnd => match rest {
                    [b'\r', b'\n', ..] => {
                        used += 2;
                        *self = Decoder::ChunkSize;
                    }
                    [] | [b'\r'] => return Ok(Step::More { used }),
                    _ => return Err(format!("chunk data longer than its size: {:?}", excerpt(rest))),
                },
                Decoder::Trailers => match memchr::memchr(b'\n', rest) {
                    None => return Ok(Step::More { used }),
                    Some(nl) => {
                        used += nl + 1;
                        if rest[..nl].strip_suffix(b"\r").unwrap_or(&rest[..nl]).is_empty() {
                            *self = Decoder::Ended;
                        }
                    }
                },
            }
        }
    }

    /// Whether the connection ending now ends the body well.
    pub fn ends_at_close(self) -> bool {
        matches!(self, Decoder::UntilClose | Decoder::Ended)
    }
}

fn excerpt(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire` split at every position: the body and whether it ended
    /// must not depend on where reads end.
    fn decode_split(framing: Framing, wire: &[u8]) -> Result<(Vec<u8>, bool), String> {
        let mut outcome = None;
        for split in 0..=wire.len() {
            let mut decoder = Decoder::new(framing);
            let (mut body, mut carry, mut ended) = (Vec::new(), Vec::new(), false);
            for part in [&wire[..split], &wire[split..]] {
                carry.extend_from_slice(part);
                let mut at = 0;
                loop {
                    match decoder.step(&carry[at..])? {
                        Step::Data { data, used } => {
                            body.extend_from_slice(data);
                            at += used;
                        }
                        Step::More { used } => {
                            at += used;
                            break;
                        }
                        Step::End { used } => {
                            at += used;
                            ended = true;
                            break;
                        }
                    }
                }
                carry.drain(..at);
                if ended {
                    break;
                }
            }
            let got = (body, ended);
            if let Some(first) = &outcome {
                assert_eq!(&got, first, "split at {split}");
            }
            outcome = Some(got);
        }
        outcome.ok_or_else(|| "no outcome".to_owned())
    }

    #[test]
    fn chunked_bodies_decode_wherever_reads_end() {
        let check = |wire: &str, body: &str, ended: bool| {
            let got = decode_split(Framing::Chunked, wire.as_bytes()).expect("decodes");
            assert_eq!((String::from_utf8_lossy(&got.0).as_ref(), got.1), (body, ended), "{wire:?}");
        };
        check("5\r\nhello\r\n0\r\n\r\n", "hello", true);
        check("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "hello world", true);
        check("5;ext=1\r\nhello\r\n0\r\nx-trailer: 1\r\n\r\n", "hello", true);
        check("a\r\n0123456789\r\n", "0123456789", false);
        check("5\r\nhel", "hel", false);
    }

    #[test]
    fn bad_chunk_framing_is_an_error() {
        let check = |wire: &str| assert!(decode_split(Framing::Chunked, wire.as_bytes()).is_err(), "{wire:?}");
        check("zz\r\nhello\r\n");
        check("3\r\nhello\r\n0\r\n\r\n");
    }

    #[test]
    fn lengths_and_close_delimit_bodies() {
        assert_eq!(decode_split(Framing::Length(5), b"hello"), Ok((b"hello".to_vec(), true)));
        assert_eq!(decode_split(Framing::Length(5), b"hel"), Ok((b"hel".to_vec(), false)));
        assert_eq!(decode_split(Framing::UntilClose, b"abc"), Ok((b"abc".to_vec(), false)));
        assert!(Decoder::new(Framing::UntilClose).ends_at_close());
        assert!(!Decoder::new(Framing::Chunked).ends_at_close());
    }

    #[test]
    fn response_heads_give_status_framing_and_reuse() {
        let check = |head: &str, expected: Option<(u16, Framing, bool)>| {
            let got = parse_head(head.as_bytes()).expect("parses").map(|h| (h.status, h.body, h.keep_alive));
            assert_eq!(got, expected, "{head:?}");
        };
        check("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", Some((200, Framing::Chunked, true)));
        check("HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n", Some((200, Framing::Length(12), true)));
        check(
            "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n",
            Some((200, Framing::Length(2), false)),
        );
        check("HTTP/1.1 200 OK\r\n\r\n", Some((200, Framing::UntilClose, false)));
        check("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n", Some((200, Framing::Length(2), false)));
        check(
            "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\ncontent-length: 2\r\n\r\n",
            Some((200, Framing::Length(2), true)),
        );
        check("HTTP/1.1 100 Continue\r\n\r\n", Some((100, Framing::Length(0), true)));
        check("HTTP/1.1 204 No Content\r\n\r\n", Some((204, Framing::Length(0), true)));
        check("HTTP/1.1 500 Internal Server Error\r\ncontent-length: 3\r\n\r\n", Some((500, Framing::Length(3), true)));
        check("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n", Some((200, Framing::Chunked, true)));
        check("HTTP/1.1 200 OK\r\ncontent-le", None);
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n").is_err());
        assert!(parse_head(b"SMTP ready\r\n\r\n").is_err());
        let media = |head: &str| parse_head(head.as_bytes()).expect("parses").expect("whole").media;
        assert_eq!(
            media("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n\r\n"),
            Media::EventStream
        );
        assert_eq!(media("HTTP/1.1 200 OK\r\ncontent-type: Text/HTML\r\n\r\n"), Media::Html);
        assert_eq!(media("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n"), Media::Json);
        assert_eq!(media("HTTP/1.1 200 OK\r\n\r\n"), Media::Missing);
    }

    #[test]
    fn request_heads_refuse_what_a_header_cannot_carry() {
        let head = RequestHead::post("/v1/completions", "127.0.0.1:8000", Some("Bearer k")).expect("valid");
        let wire = String::from_utf8(head.with_body(b"{}")).expect("ascii");
        assert_eq!(
            wire,
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Type: application/json\r\n\
             Accept: text/event-stream\r\nAuthorization: Bearer k\r\nContent-Length: 2\r\n\r\n{}"
        );
        assert!(RequestHead::post("/v1/completions", "h:1", Some("Bearer k\r\nX-Evil: 1")).is_err());
        assert!(RequestHead::post("/a b", "h:1", None).is_err());
        assert!(RequestHead::post("/a", "", None).is_err());
    }
}
