//! Why a request failed, as a type: each way to fail is a variant holding
//! what it knows. Its `kind` says what broke (a refused or reset
//! connection, which timeout, the server's status, a reply that breaks the
//! protocol, a connection closed early, a cancel) and gives the record its
//! outcome; its text is the record's error. Nothing is told apart by its
//! words.

use std::io;
use std::time::Duration;

use crate::record::Outcome;

/// What broke, in a word. The record's outcome follows from it alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The server refused the connection: nothing listens on its port.
    Refused,
    /// The connection was reset (or aborted, or its pipe broke) before any
    /// response came.
    Reset,
    /// Any other failure to open a connection.
    Connect,
    /// No connection within the connect timeout.
    ConnectTimeout,
    /// The TLS handshake failed, or TLS records could not be sealed or
    /// opened.
    Tls,
    /// The connection ended (or failed) before any response came.
    Closed,
    /// No token within the first-token timeout of the send.
    FirstTokenTimeout,
    /// No bytes within the idle timeout, once a token came.
    IdleTimeout,
    /// No complete response within the total timeout of the send.
    TotalTimeout,
    /// The server answered with a status other than 2xx.
    HttpStatus,
    /// The server said, inside the stream or the body, that it failed.
    ServerError,
    /// The reply breaks the protocol: HTTP framing, a chunk or body that is
    /// not the JSON expected, a streamed reply that is not an event stream,
    /// a reply without text.
    Protocol,
    /// The response began, and the connection ended or broke before it was
    /// done.
    ClosedEarly,
    /// The run ended before the response did.
    Cancelled,
}

impl ErrorKind {
    /// The outcome a request that failed this way is recorded with.
    pub fn outcome(self) -> Outcome {
        match self {
            ErrorKind::Refused | ErrorKind::Reset | ErrorKind::Connect | ErrorKind::Tls | ErrorKind::Closed => {
                Outcome::TransportError
            }
            ErrorKind::ConnectTimeout
            | ErrorKind::FirstTokenTimeout
            | ErrorKind::IdleTimeout
            | ErrorKind::TotalTimeout => Outcome::Timeout,
            ErrorKind::HttpStatus => Outcome::HttpError,
            ErrorKind::ServerError => Outcome::Incomplete,
            ErrorKind::Protocol => Outcome::Malformed,
            ErrorKind::ClosedEarly => Outcome::Disconnected,
            ErrorKind::Cancelled => Outcome::Cancelled,
        }
    }

    /// An I/O error's kind where the system says what happened (refused,
    /// reset), else `otherwise`.
    fn of_io(error: &io::Error, otherwise: ErrorKind) -> ErrorKind {
        match error.kind() {
            io::ErrorKind::ConnectionRefused => ErrorKind::Refused,
            io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted | io::ErrorKind::BrokenPipe => {
                ErrorKind::Reset
            }
            _ => otherwise,
        }
    }
}

/// Why one request failed. Its text (`Display`) is the record's whole
/// error, its causes' words included, so it names no `source`. Texts it
/// keeps are `Box<str>`: every request's state holds room for one, which
/// is then no bigger than an outcome and its text as a `String`.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("cannot connect to {addr}: {error}")]
    Connect { addr: Box<str>, error: io::Error },
    #[error("cannot set TCP_NODELAY on {addr}: {error}")]
    NoDelay { addr: Box<str>, error: io::Error },
    #[error("TLS handshake with {addr} failed: {}", super::error_chain(.error))]
    Handshake { addr: Box<str>, error: io::Error },
    #[error("connect timeout: no connection to {addr} within {timeout:?}")]
    ConnectTimeout { addr: Box<str>, timeout: Duration },
    #[error("cannot send the request over TLS: {0}")]
    Seal(io::Error),
    #[error("cannot send the request: the connection is closed")]
    SendClosed,
    #[error("cannot send the request: {0}")]
    Send(io::Error),
    #[error("TLS error: {0}")]
    TlsRead(io::Error),
    /// Boxed: rustls's error is bigger than any other here.
    #[error("TLS error: {0}")]
    TlsRecord(Box<rustls::Error>),
    #[error("the connection closed before a response came")]
    ClosedBeforeResponse,
    #[error("no response: the connection failed before one came: {0}")]
    NoResponse(io::Error),
    #[error("disconnected: the connection closed within the response head")]
    ClosedInHead,
    #[error("disconnected: the response ended before [DONE]")]
    EndedBeforeDone,
    #[error("disconnected mid-stream: the connection closed before [DONE]")]
    ClosedMidStream,
    #[error("disconnected mid-stream: the connection broke before [DONE]: {0}")]
    BrokeMidStream(io::Error),
    /// A status other than 2xx, with the start of the body that came with it.
    #[error("http {status}: {excerpt}")]
    Status { status: u16, excerpt: Box<str> },
    #[error("malformed response: {0}")]
    BadHead(String),
    /// A response head or a chunk size line longer than any a server means.
    #[error("malformed response: {what} longer than {limit} bytes")]
    Oversized { what: &'static str, limit: usize },
    /// A 2xx answer to a streamed request that is not an event stream (a
    /// proxy's page); `media` says what it is.
    #[error(
        "malformed response: a streamed request got http {status} with {media}, not an event stream \
         (text/event-stream)"
    )]
    NotEventStream { status: u16, media: Box<str> },
    #[error("malformed stream: bad chunked framing: {0}")]
    BadFraming(String),
    /// A streamed chunk that is not the JSON expected, and its start.
    #[error("malformed stream: bad chunk ({error}): {data}")]
    BadChunk { error: serde_json::Error, data: Box<str> },
    /// A whole (non-streamed) body that is not the JSON expected, and its
    /// start.
    #[error("malformed response ({error}): {body}")]
    BadBody { error: serde_json::Error, body: Box<str> },
    /// As vLLM's bench counts it: a reply without a token is no success.
    #[error("no tokens: the stream ended without any text")]
    NoTokensStreamed,
    #[error("no tokens: the response holds no text")]
    NoTokens,
    /// The error a chunk of the stream carried.
    #[error("server error in stream: {0}")]
    InStream(String),
    /// The error a whole body carried.
    #[error("server error: {0}")]
    InBody(String),
    #[error("first-token timeout: no token within {0:?} of the send")]
    FirstTokenTimeout(Duration),
    #[error("idle timeout: no data for {0:?} between chunks")]
    IdleTimeout(Duration),
    #[error("total timeout: no complete response within {0:?}")]
    TotalTimeout(Duration),
    #[error("cancelled: the run ended before the response did")]
    Cancelled,
}

impl RequestError {
    /// What broke.
    pub fn kind(&self) -> ErrorKind {
        use RequestError as E;
        match self {
            E::Connect { error, .. } | E::NoDelay { error, .. } => ErrorKind::of_io(error, ErrorKind::Connect),
            E::Handshake { error, .. } => ErrorKind::of_io(error, ErrorKind::Tls),
            E::ConnectTimeout { .. } => ErrorKind::ConnectTimeout,
            E::Seal(_) | E::TlsRecord(_) => ErrorKind::Tls,
            E::TlsRead(error) => ErrorKind::of_io(error, ErrorKind::Tls),
            E::SendClosed | E::ClosedBeforeResponse => ErrorKind::Closed,
            E::Send(error) | E::NoResponse(error) => ErrorKind::of_io(error, ErrorKind::Closed),
            E::ClosedInHead | E::EndedBeforeDone | E::ClosedMidStream | E::BrokeMidStream(_) => ErrorKind::ClosedEarly,
            E::Status { .. } => ErrorKind::HttpStatus,
            E::BadHead(_)
            | E::Oversized { .. }
            | E::NotEventStream { .. }
            | E::BadFraming(_)
            | E::BadChunk { .. }
            | E::BadBody { .. }
            | E::NoTokensStreamed
            | E::NoTokens => ErrorKind::Protocol,
            E::InStream(_) | E::InBody(_) => ErrorKind::ServerError,
            E::FirstTokenTimeout(_) => ErrorKind::FirstTokenTimeout,
            E::IdleTimeout(_) => ErrorKind::IdleTimeout,
            E::TotalTimeout(_) => ErrorKind::TotalTimeout,
            E::Cancelled => ErrorKind::Cancelled,
        }
    }

    /// The outcome the request is recorded with.
    pub fn outcome(&self) -> Outcome {
        self.kind().outcome()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(kind: io::ErrorKind) -> io::Error {
        io::Error::from(kind)
    }

    #[test]
    fn the_system_s_word_for_a_connection_decides_its_kind_not_the_text() {
        let connect = |kind| RequestError::Connect { addr: "h:1".into(), error: io(kind) };
        assert_eq!(connect(io::ErrorKind::ConnectionRefused).kind(), ErrorKind::Refused);
        assert_eq!(connect(io::ErrorKind::ConnectionReset).kind(), ErrorKind::Reset);
        assert_eq!(connect(io::ErrorKind::HostUnreachable).kind(), ErrorKind::Connect);
        assert_eq!(RequestError::NoResponse(io(io::ErrorKind::ConnectionReset)).kind(), ErrorKind::Reset);
        assert_eq!(RequestError::Send(io(io::ErrorKind::BrokenPipe)).kind(), ErrorKind::Reset);
        assert_eq!(RequestError::NoResponse(io(io::ErrorKind::Other)).kind(), ErrorKind::Closed);
        // A reset once the response began is a disconnect, whatever the system says.
        let broke = RequestError::BrokeMidStream(io(io::ErrorKind::ConnectionReset));
        assert_eq!((broke.kind(), broke.outcome()), (ErrorKind::ClosedEarly, Outcome::Disconnected));
        // Each before any response is a transport error.
        for kind in [ErrorKind::Refused, ErrorKind::Reset, ErrorKind::Connect, ErrorKind::Tls, ErrorKind::Closed] {
            assert_eq!(kind.outcome(), Outcome::TransportError, "{kind:?}");
        }
    }

    #[test]
    fn each_timeout_is_a_timeout_that_says_which() {
        let second = Duration::from_secs(1);
        let cases = [
            (
                RequestError::ConnectTimeout { addr: "h:1".into(), timeout: second },
                ErrorKind::ConnectTimeout,
                "connect timeout: no connection to h:1 within 1s",
            ),
            (
                RequestError::FirstTokenTimeout(second),
                ErrorKind::FirstTokenTimeout,
                "first-token timeout: no token within 1s of the send",
            ),
            (RequestError::IdleTimeout(second), ErrorKind::IdleTimeout, "idle timeout: no data for 1s between chunks"),
            (
                RequestError::TotalTimeout(second),
                ErrorKind::TotalTimeout,
                "total timeout: no complete response within 1s",
            ),
        ];
        for (error, kind, text) in cases {
            assert_eq!((error.kind(), error.outcome(), error.to_string().as_str()), (kind, Outcome::Timeout, text));
        }
    }

    #[test]
    fn the_texts_are_the_records_errors() {
        let cases: [(RequestError, Outcome, &str); 6] = [
            (RequestError::Status { status: 503, excerpt: "busy".into() }, Outcome::HttpError, "http 503: busy"),
            (
                RequestError::NotEventStream { status: 200, media: "content-type text/html".into() },
                Outcome::Malformed,
                "malformed response: a streamed request got http 200 with content-type text/html, not an event \
                 stream (text/event-stream)",
            ),
            (
                RequestError::Oversized { what: "a response head", limit: 65536 },
                Outcome::Malformed,
                "malformed response: a response head longer than 65536 bytes",
            ),
            (RequestError::InStream("{}".into()), Outcome::Incomplete, "server error in stream: {}"),
            (
                RequestError::ClosedMidStream,
                Outcome::Disconnected,
                "disconnected mid-stream: the connection closed before [DONE]",
            ),
            (RequestError::Cancelled, Outcome::Cancelled, "cancelled: the run ended before the response did"),
        ];
        for (error, outcome, text) in cases {
            assert_eq!((error.outcome(), error.to_string().as_str()), (outcome, text));
        }
    }

    #[test]
    fn an_error_is_no_bigger_than_an_outcome_and_its_text() {
        // Ten thousand requests in flight each keep room for one.
        assert!(std::mem::size_of::<RequestError>() <= std::mem::size_of::<(Outcome, Option<String>)>());
    }
}
