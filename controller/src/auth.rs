//! Who may call what: one table from a gRPC method to the certificate it
//! needs, enforced by a tower layer in front of every service, so a method
//! added later is refused until the table names it.
//!
//! Under TLS, agent certificates open `AgentService` only and operator
//! certificates `OperatorService` only (read: listings, reports, watch,
//! export, plans; admin: everything); enrolment and ingest need no
//! certificate (they carry their own credential), health and reflection
//! are open. A revoked certificate opens nothing. The
//! caller's identity (`pki::Peer`) goes into the request's extensions for
//! the handlers. Without TLS (loopback, `--insecure`) nothing is checked
//! and no handler finds a peer.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use tonic::Status;
use tonic::codegen::http;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::pki::{self, Peer, Role};

/// What a method needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// No certificate: health, reflection; enrolment and ingest, which
    /// carry a credential of their own.
    Open,
    /// An agent's certificate.
    Agent,
    /// An operator's certificate, read or admin.
    Read,
    /// An admin operator's certificate.
    Admin,
}

/// The OperatorService methods a read operator may call.
const READ_METHODS: &[&str] = &["ListRuns", "GetReport", "WatchRun", "ListJobs", "ListAgents", "ExportRun", "PlanRun"];

/// The access `path` (`/package.Service/Method`) needs; `None` for a
/// method no one may call.
pub fn access(path: &str) -> Option<Access> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    match service {
        "grpc.health.v1.Health" | "grpc.reflection.v1.ServerReflection" => Some(Access::Open),
        "benchfleet.v1.IngestService" | "benchfleet.v1.EnrollService" => Some(Access::Open),
        "benchfleet.v1.AgentService" => Some(Access::Agent),
        "benchfleet.v1.OperatorService" if READ_METHODS.contains(&method) => Some(Access::Read),
        "benchfleet.v1.OperatorService" => Some(Access::Admin),
        _ => None,
    }
}

/// Whether `role` may make a call that needs `access`; the refusal says why.
pub fn allows(access: Access, peer: &Peer, method: &str) -> Result<(), Status> {
    let ok = match access {
        Access::Open => true,
        Access::Agent => peer.role == Role::Agent,
        Access::Read => matches!(peer.role, Role::Read | Role::Admin),
        Access::Admin => peer.role == Role::Admin,
    };
    if ok {
        return Ok(());
    }
    let needs = match access {
        Access::Agent => "an agent's certificate",
        Access::Read => "an operator's certificate",
        Access::Admin => "an admin operator's certificate",
        Access::Open => "nothing",
    };
    Err(Status::permission_denied(format!(
        "{} '{}' may not call {method}: it needs {needs}",
        who(peer.role),
        peer.name
    )))
}

fn who(role: Role) -> &'static str {
    match role {
        Role::Agent => "agent",
        Role::Admin => "admin operator",
        Role::Read => "read-only operator",
        Role::Controller => "controller",
    }
}

/// The revocations, by name (certificates of that name issued before the
/// time are revoked; see `enrol`), shared by the layer and whoever
/// revokes.
#[derive(Clone, Debug, Default)]
pub struct Revoked(Arc<RwLock<HashMap<String, i64>>>);

impl Revoked {
    pub fn contains(&self, peer: &Peer) -> bool {
        let names = self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        names.get(&peer.name).is_some_and(|at| peer.not_before_unix < *at)
    }

    pub fn insert(&self, name: String, at_unix: i64) {
        self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner).insert(name, at_unix);
    }
}

/// The identity a request's connection presented, checked against the
/// revocation list; `Ok(None)` without a certificate.
pub fn peer_of_request<B>(req: &http::Request<B>, revoked: &Revoked) -> Result<Option<Peer>, Status> {
    let certs = req.extensions().get::<TlsConnectInfo<TcpConnectInfo>>().and_then(TlsConnectInfo::peer_certs);
    let Some(leaf) = certs.as_ref().and_then(|c| c.first()) else { return Ok(None) };
    let peer = pki::peer_of(leaf).map_err(Status::unauthenticated)?;
    if revoked.contains(&peer) {
        return Err(Status::permission_denied(format!(
            "the certificate of {} '{}' (serial {}) is revoked",
            who(peer.role),
            peer.name,
            peer.serial
        )));
    }
    Ok(Some(peer))
}

/// The layer: `enabled` under TLS.
#[derive(Clone, Debug)]
pub struct AuthLayer {
    pub enabled: bool,
    pub revoked: Revoked,
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService { inner, layer: self.clone() }
    }
}

#[derive(Clone, Debug)]
pub struct AuthService<S> {
    inner: S,
    layer: AuthLayer,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for AuthService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Default + Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = S::Error;
    type Future = BoxFuture<Result<http::Response<R>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        if self.layer.enabled {
            match check(&mut req, &self.layer.revoked) {
                Ok(()) => {}
                Err(status) => {
                    tracing::warn!(path = %req.uri().path(), "call refused: {}", status.message());
                    return Box::pin(std::future::ready(Ok(status.into_http())));
                }
            }
        }
        // The service that was made ready is the one that is called.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(inner.call(req))
    }
}

fn check<B>(req: &mut http::Request<B>, revoked: &Revoked) -> Result<(), Status> {
    let path = req.uri().path();
    let method = path.rsplit('/').next().unwrap_or(path).to_owned();
    let access = access(path).ok_or_else(|| Status::permission_denied(format!("no one may call {path}")))?;
    let peer = peer_of_request(req, revoked)?;
    match (access, peer) {
        (Access::Open, peer) => {
            if let Some(peer) = peer {
                req.extensions_mut().insert(peer);
            }
            Ok(())
        }
        (_, None) => Err(Status::unauthenticated(format!(
            "{method} needs a client certificate: operators give --identity DIR (see `benchfleet certs issue`), \
             agents join first (`benchfleet-agent join`)"
        ))),
        (access, Some(peer)) => {
            allows(access, &peer, &method)?;
            req.extensions_mut().insert(peer);
            Ok(())
        }
    }
}

/// The metadata key loadgen's record stream carries its credential in.
pub const INGEST_TOKEN_HEADER: &str = "x-benchfleet-ingest-token";

/// The key of the attempts' ingest credentials: each `JobSpec` carries
/// HMAC-SHA256(run, job, attempt, epoch) under it, the agent hands it to
/// loadgen in its environment, and the ingest service takes a batch only
/// under its own attempt's credential. Kept in `--pki-dir` (`ingest.key`),
/// so that a restarted controller still takes running attempts' records.
#[derive(Clone)]
pub struct IngestKey(ring::hmac::Key);

impl std::fmt::Debug for IngestKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IngestKey(redacted)")
    }
}

impl IngestKey {
    pub fn new(secret: &[u8]) -> IngestKey {
        IngestKey(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret))
    }

    /// The key in `dir/ingest.key`, made (0600) when there is none.
    pub fn read_or_make(dir: &std::path::Path) -> Result<IngestKey, pki::PkiError> {
        let path = dir.join(pki::INGEST_KEY);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(IngestKey::new(text.trim().as_bytes())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                pki::private_dir(dir)?;
                let secret = pki::hex(&pki::random::<32>()?);
                pki::write_new(&path, secret.as_bytes(), true)?;
                Ok(IngestKey::new(secret.as_bytes()))
            }
            Err(e) => Err(pki::PkiError::Io { path, reason: e.to_string() }),
        }
    }

    fn message(run: &str, job: u64, attempt: u32, epoch: u64) -> String {
        format!("benchfleet-ingest/v1\0{run}\0{job}\0{attempt}\0{epoch}")
    }

    /// The credential of one attempt, hex.
    pub fn sign(&self, run: &str, job: u64, attempt: u32, epoch: u64) -> String {
        pki::hex(ring::hmac::sign(&self.0, Self::message(run, job, attempt, epoch).as_bytes()).as_ref())
    }

    /// Whether `token` is that attempt's credential (compared in constant
    /// time).
    pub fn verify(&self, run: &str, job: u64, attempt: u32, epoch: u64, token: &str) -> bool {
        let Some(tag) = unhex(token) else { return false };
        ring::hmac::verify(&self.0, Self::message(run, job, attempt, epoch).as_bytes(), &tag).is_ok()
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// The caller's identity, when the call came over TLS with a certificate.
pub fn caller<T>(req: &tonic::Request<T>) -> Option<&Peer> {
    req.extensions().get::<Peer>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(role: Role) -> Peer {
        Peer { name: "x".into(), role, serial: "01".into(), not_before_unix: 0, not_after_unix: 0, agent_id: None }
    }

    #[test]
    fn every_method_has_a_rule() {
        // Every method the proto declares is in the table, and none is open
        // by accident.
        let proto = include_str!("../../proto/proto/benchfleet/v1/benchfleet.proto");
        let mut service = "";
        let mut seen = 0;
        for line in proto.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("service ") {
                service = rest.split_whitespace().next().unwrap_or_default();
            }
            if let Some(rest) = line.strip_prefix("rpc ") {
                let method = rest.split('(').next().unwrap_or_default();
                let path = format!("/benchfleet.v1.{service}/{method}");
                let got = access(&path).unwrap_or_else(|| panic!("{path} has no rule"));
                let open = matches!(service, "IngestService" | "EnrollService");
                assert_eq!(got == Access::Open, open, "{path}");
                seen += 1;
            }
        }
        assert!(seen >= 18, "{seen} methods read");
        // Deleting a run is an admin's.
        assert_eq!(access("/benchfleet.v1.OperatorService/DeleteRun"), Some(Access::Admin));
        assert_eq!(access("/benchfleet.v1.Other/Thing"), None);
        assert_eq!(access("nonsense"), None);
    }

    #[test]
    fn an_ingest_credential_opens_its_own_attempt_only() {
        let key = IngestKey::new(b"k");
        let token = key.sign("7", 3, 2, 9);
        assert_eq!(token.len(), 64);
        assert!(key.verify("7", 3, 2, 9, &token));
        for (run, job, attempt, epoch) in [("8", 3, 2, 9), ("7", 4, 2, 9), ("7", 3, 3, 9), ("7", 3, 2, 10)] {
            assert!(!key.verify(run, job, attempt, epoch, &token), "{run} {job} {attempt} {epoch}");
        }
        assert!(!IngestKey::new(b"other").verify("7", 3, 2, 9, &token));
        for bad in ["", "zz", "abc", &token[..62]] {
            assert!(!key.verify("7", 3, 2, 9, bad), "{bad}");
        }
        assert_eq!(format!("{key:?}"), "IngestKey(redacted)");
    }

    #[test]
    fn roles_open_their_own_services_only() {
        use Access::*;
        let table = [
            (Agent, Role::Agent, true),
            (Agent, Role::Admin, false),
            (Read, Role::Agent, false),
            (Read, Role::Read, true),
            (Read, Role::Admin, true),
            (Admin, Role::Read, false),
            (Admin, Role::Admin, true),
            (Admin, Role::Agent, false),
            (Agent, Role::Controller, false),
        ];
        for (access, role, ok) in table {
            assert_eq!(allows(access, &peer(role), "M").is_ok(), ok, "{access:?} {role:?}");
        }
        let e = allows(Admin, &peer(Role::Read), "SubmitRun").expect_err("refused");
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            e.message(),
            "read-only operator 'x' may not call SubmitRun: it needs an admin operator's certificate"
        );
    }
}
