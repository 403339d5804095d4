//! How a client reaches the controller: the rule every client keeps (the
//! CLI, the agent, loadgen's sink) and the channel it makes.
//!
//! `https://` always verifies the controller against the CA it was given,
//! and presents a client certificate when it has one; it never falls back
//! to plain text. `http://` is plain text, allowed to a loopback host, and
//! to any other only with `--insecure` (an operator's explicit choice).
//!
//! A certificate of the fleet's CA says who its holder is: `CN` the name,
//! `OU` the role (`Role`); `peer_of` reads it on every side.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// What a client holds to reach the controller.
#[derive(Clone, Default)]
pub struct ClientTls {
    /// The CA the controller's certificate must chain to (PEM).
    pub ca: Option<Vec<u8>>,
    /// This client's certificate (PEM, leaf first) and its key (PEM).
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Plain text to a non-loopback host is allowed.
    pub insecure: bool,
    /// Where the CA and identity were read from, for error messages.
    pub source: Option<PathBuf>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca", &self.ca.as_ref().map(|_| "PEM"))
            .field("identity", &self.identity.as_ref().map(|_| "certificate and key (redacted)"))
            .field("insecure", &self.insecure)
            .field("source", &self.source)
            .finish()
    }
}

/// Why a client will not, or cannot, make a channel.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("'{0}' is not a controller URL (http://HOST:PORT or https://HOST:PORT)")]
    Url(String),
    #[error(
        "refusing to talk to {host} in plain text: use https:// (the controller's --tls-cert), or --insecure to \
         send everything unencrypted and unauthenticated"
    )]
    Plaintext { host: String },
    #[error("{url} needs the controller's CA to verify it{}", hint(.dir))]
    NoCa { url: String, dir: Option<PathBuf> },
    #[error("cannot read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("TLS setup for {url} failed: {reason}")]
    Setup { url: String, reason: String },
}

fn hint(dir: &Option<PathBuf>) -> String {
    match dir {
        Some(dir) => format!(" (no ca.pem in {})", dir.display()),
        None => String::new(),
    }
}

impl ClientTls {
    /// Who this client's certificate says it is.
    pub fn peer(&self) -> Option<Result<Peer, String>> {
        let (cert, _) = self.identity.as_ref()?;
        Some(first_cert(cert).and_then(|der| peer_of(&der)))
    }

    /// A directory's `ca.pem` and, when both are there, `NAME.pem` and
    /// `NAME-key.pem` (`agent`, `admin`, an operator's name). A missing
    /// file is simply not there; one that cannot be read is an error.
    pub fn from_dir(dir: &Path, name: &str) -> Result<ClientTls, TlsError> {
        let read = |file: &str| -> Result<Option<Vec<u8>>, TlsError> {
            let path = dir.join(file);
            match std::fs::read(&path) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(TlsError::Read { path, reason: e.to_string() }),
            }
        };
        let ca = read("ca.pem")?;
        let identity = match (read(&format!("{name}.pem"))?, read(&format!("{name}-key.pem"))?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            _ => None,
        };
        Ok(ClientTls { ca, identity, insecure: false, source: Some(dir.to_owned()) })
    }
}

/// What a certificate lets its holder do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// A GPU host: `AgentService` only.
    Agent,
    /// An operator who may change things: every `OperatorService` call.
    Admin,
    /// An operator who may look: listings, reports, watch, export, plans.
    Read,
    /// The controller itself (a server certificate).
    Controller,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Agent => "agent",
            Role::Admin => "admin",
            Role::Read => "read",
            Role::Controller => "controller",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        [Role::Agent, Role::Admin, Role::Read, Role::Controller].into_iter().find(|r| r.as_str() == s)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who a presented certificate says its holder is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub name: String,
    pub role: Role,
    /// The certificate's serial number, in hex.
    pub serial: String,
    /// When it was issued (its notBefore) and when it expires (seconds
    /// since the epoch).
    pub not_before_unix: i64,
    pub not_after_unix: i64,
    /// An agent's id in the controller's store, written at join (`UID`).
    pub agent_id: Option<u64>,
}

/// The OID of a subject's `UID` (userId): an agent's id.
pub const UID_OID: [u64; 7] = [0, 9, 2342, 19_200_300, 100, 1, 1];

/// `sha256:HEX` of a certificate's SubjectPublicKeyInfo (DER): what an
/// agent pins at join (kubeadm's `--discovery-token-ca-cert-hash`).
pub fn spki_hash(der: &[u8]) -> Result<String, String> {
    use sha2::Digest as _;
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    Ok(format!("sha256:{}", hex(&sha2::Sha256::digest(cert.public_key().raw))))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The identity in a certificate the fleet's CA issued: `CN` the name, `OU`
/// the role. Whoever calls this has verified the chain and the validity
/// (the TLS handshake), or reads its own certificate.
pub fn peer_of(der: &[u8]) -> Result<Peer, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| format!("an unreadable certificate: {e}"))?;
    let subject = cert.subject();
    let first = |mut it: Box<dyn Iterator<Item = &x509_parser::x509::AttributeTypeAndValue<'_>> + '_>| {
        it.next().and_then(|a| a.as_str().ok()).map(str::to_owned)
    };
    let name = first(Box::new(subject.iter_common_name())).ok_or("a certificate without a common name")?;
    let role = first(Box::new(subject.iter_organizational_unit()))
        .and_then(|r| Role::parse(&r))
        .ok_or_else(|| format!("the certificate of '{name}' names no benchfleet role"))?;
    let uid = UID_OID.iter().map(u64::to_string).collect::<Vec<_>>().join(".");
    let agent_id = subject
        .iter_attributes()
        .find(|a| a.attr_type().to_id_string() == uid)
        .and_then(|a| a.as_str().ok())
        .and_then(|s| s.parse().ok());
    Ok(Peer {
        name,
        role,
        agent_id,
        serial: hex(cert.raw_serial()),
        not_before_unix: cert.validity().not_before.timestamp(),
        not_after_unix: cert.validity().not_after.timestamp(),
    })
}

/// The first certificate of a PEM file, as DER.
pub fn first_cert(pem: &[u8]) -> Result<Vec<u8>, String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject as _;
    match CertificateDer::pem_slice_iter(pem).next() {
        Some(Ok(der)) => Ok(der.to_vec()),
        Some(Err(e)) => Err(format!("not a PEM certificate: {e}")),
        None => Err("no certificate in the PEM file".to_owned()),
    }
}

/// The host of a URL, when it has one.
pub fn host_of(url: &str) -> Option<String> {
    let uri: tonic::codegen::http::Uri = url.parse().ok()?;
    uri.host().map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned())
}

/// Whether a host name or address is this machine's loopback.
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The endpoint for `url` under the client rule (see the module's header).
/// Time-outs and keep-alives are the caller's to add.
pub fn endpoint(url: &str, tls: &ClientTls) -> Result<Endpoint, TlsError> {
    let bad = || TlsError::Url(url.to_owned());
    let endpoint = Endpoint::from_shared(url.to_owned()).map_err(|_| bad())?;
    let host = endpoint.uri().host().ok_or_else(bad)?.trim_start_matches('[').trim_end_matches(']').to_owned();
    match endpoint.uri().scheme_str() {
        Some("https") => {
            let ca = tls.ca.as_ref().ok_or_else(|| TlsError::NoCa { url: url.to_owned(), dir: tls.source.clone() })?;
            let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name(host);
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(Identity::from_pem(cert, key));
            }
            endpoint
                .tls_config(config)
                .map_err(|e| TlsError::Setup { url: url.to_owned(), reason: e.to_string() })
                .map(|e| e.connect_timeout(Duration::from_secs(5)))
        }
        Some("http") if is_loopback(&host) || tls.insecure => Ok(endpoint.connect_timeout(Duration::from_secs(5))),
        Some("http") => Err(TlsError::Plaintext { host }),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str, tls: &ClientTls, expected: &str) {
        let got = match endpoint(url, tls) {
            Ok(e) => format!("ok {}", e.uri()),
            Err(e) => e.to_string(),
        };
        assert!(got.starts_with(expected), "{url}: {got}");
    }

    #[test]
    fn plain_text_goes_only_to_loopback_unless_insecure() {
        let none = ClientTls::default();
        check("http://127.0.0.1:7070", &none, "ok http://127.0.0.1:7070");
        check("http://127.7.0.1:7070", &none, "ok");
        check("http://localhost:7070", &none, "ok");
        check("http://[::1]:7070", &none, "ok");
        check("http://10.0.0.5:7070", &none, "refusing to talk to 10.0.0.5 in plain text");
        check("http://controller.lab:7070", &none, "refusing to talk to controller.lab in plain text");
        let insecure = ClientTls { insecure: true, ..ClientTls::default() };
        check("http://10.0.0.5:7070", &insecure, "ok");
    }

    #[test]
    fn https_needs_a_ca_and_never_falls_back() {
        let none = ClientTls { source: Some("/etc/bf".into()), insecure: true, ..ClientTls::default() };
        check(
            "https://10.0.0.5:7070",
            &none,
            "https://10.0.0.5:7070 needs the controller's CA to verify it (no ca.pem in /etc/bf)",
        );
        check("ftp://10.0.0.5", &none, "'ftp://10.0.0.5' is not a controller URL");
        check("10.0.0.5:7070", &none, "'10.0.0.5:7070' is not a controller URL");
    }

    #[test]
    fn hosts() {
        assert_eq!(host_of("https://[::1]:7070").as_deref(), Some("::1"));
        assert!(is_loopback("::1") && is_loopback("LOCALHOST") && is_loopback("127.0.0.9"));
        assert!(!is_loopback("10.1.1.1") && !is_loopback("localhost.evil"));
    }

    #[test]
    fn debug_never_shows_a_key() {
        let tls = ClientTls { identity: Some((b"CERT".to_vec(), b"SECRET KEY".to_vec())), ..ClientTls::default() };
        assert!(!format!("{tls:?}").contains("SECRET"));
    }
}
