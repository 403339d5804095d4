//! The agent's identity: its certificate, key and the fleet's CA in
//! `WORK_DIR/identity/`, and the name the certificate gives it. Under
//! `https://` the agent is who its certificate says, and nothing else; over
//! plain text (loopback, `--insecure`) it is its `--name`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use benchfleet_core::tls::{self, ClientTls, Role};

/// The certificate's and key's file names in the identity directory.
pub const CERT: &str = "agent.pem";
pub const KEY: &str = "agent-key.pem";
pub const CA: &str = "ca.pem";

pub fn dir(work_dir: &Path) -> PathBuf {
    work_dir.join("identity")
}

/// The name this agent goes by and what it holds to reach `url`.
pub fn resolve(work_dir: &Path, url: &str, name: Option<&str>, insecure: bool) -> anyhow::Result<(String, ClientTls)> {
    let https = url.starts_with("https://");
    if !https {
        let name = name.map(str::to_owned).unwrap_or_else(hostname);
        return Ok((name, ClientTls { insecure, ..ClientTls::default() }));
    }
    let dir = dir(work_dir);
    finish_renewal(&dir);
    let tls = ClientTls::from_dir(&dir, "agent")?;
    let peer = match (tls.peer(), &tls.ca) {
        (Some(peer), Some(_)) => {
            peer.map_err(anyhow::Error::msg).with_context(|| format!("{}", dir.join(CERT).display()))?
        }
        _ => anyhow::bail!(
            "no agent certificate in {}: run `benchfleet-agent join --controller {url} --token ... --ca-hash ...` first",
            dir.display()
        ),
    };
    anyhow::ensure!(
        peer.role == Role::Agent,
        "{} is a {} certificate, not an agent's",
        dir.join(CERT).display(),
        peer.role
    );
    if let Some(name) = name.filter(|n| *n != peer.name) {
        anyhow::bail!(
            "--name {name}: this agent's certificate ({}) names it '{}'",
            dir.join(CERT).display(),
            peer.name
        );
    }
    Ok((peer.name, tls))
}

/// This host's name, the agent's name by default.
pub fn hostname() -> String {
    benchfleet_core::hostname().unwrap_or_else(|| "agent".to_owned())
}

/// Whether `url` may be reached at all under the client rule (a typo'd
/// scheme or a plain-text remote is refused before anything starts).
pub fn check_url(url: &str, tls: &ClientTls) -> anyhow::Result<()> {
    tls::endpoint(url, tls).map(drop).map_err(anyhow::Error::from)
}

/// What `benchfleet-agent join` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Joined {
    /// A new identity was stored.
    New { name: String, not_after_unix: i64 },
    /// The identity already there is valid: nothing was done.
    Already { name: String, not_after_unix: i64 },
}

/// The identity in `work_dir`, when it is there, readable and unexpired.
pub fn current(work_dir: &Path) -> Option<(String, i64)> {
    let tls = ClientTls::from_dir(&dir(work_dir), "agent").ok()?;
    let peer = tls.peer()?.ok()?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() as i64;
    (tls.ca.is_some() && peer.role == Role::Agent && peer.not_after_unix > now)
        .then_some((peer.name, peer.not_after_unix))
}

/// `benchfleet-agent join`: pins the CA in the controller's chain against
/// `ca_hash`, makes a key here, sends a CSR with the token, and stores the
/// certificate, key and CA in `WORK_DIR/identity/` (mode 0600). The key
/// never leaves this host.
pub async fn join(
    url: &str,
    token: &str,
    ca_hash: &str,
    name: Option<&str>,
    work_dir: &Path,
) -> anyhow::Result<Joined> {
    if let Some((name, not_after_unix)) = current(work_dir) {
        return Ok(Joined::Already { name, not_after_unix });
    }
    anyhow::ensure!(url.starts_with("https://"), "--controller {url}: joining needs an https:// URL");
    anyhow::ensure!(
        ca_hash.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())),
        "--ca-hash {ca_hash}: expected sha256: and 64 hex digits, as `benchfleet token create` prints it"
    );
    let name = name.map(str::to_owned).unwrap_or_else(hostname);
    let ca = pinned_ca(url, &ca_hash.to_ascii_lowercase()).await?;
    let (key, csr) = new_key(&name)?;
    let tls = ClientTls { ca: Some(ca.clone().into_bytes()), ..ClientTls::default() };
    let channel = tls::endpoint(url, &tls)?.connect().await.with_context(|| format!("cannot reach {url}"))?;
    let reply = benchfleet_proto::enroll_service_client::EnrollServiceClient::new(channel)
        .join(benchfleet_proto::JoinRequest { token: token.trim().to_owned(), name: name.clone(), csr_pem: csr })
        .await
        .map_err(|s| anyhow::anyhow!("the controller refused to enrol '{name}': {}", s.message()))?
        .into_inner();
    let peer = tls::first_cert(reply.certificate_pem.as_bytes())
        .and_then(|der| tls::peer_of(&der))
        .map_err(|e| anyhow::anyhow!("the controller sent a certificate that cannot be read: {e}"))?;
    anyhow::ensure!(
        peer.role == Role::Agent && peer.name == name,
        "the controller sent a certificate for someone else"
    );
    let dir = dir(work_dir);
    write_private(&dir, KEY, key.serialize_pem().as_bytes())?;
    write_private(&dir, CERT, reply.certificate_pem.as_bytes())?;
    write_private(&dir, CA, ca.as_bytes())?;
    Ok(Joined::New { name, not_after_unix: peer.not_after_unix })
}

/// A key made here and its CSR (PEM); the controller writes the subject,
/// the CN only says which name is asked for.
fn new_key(name: &str) -> anyhow::Result<(rcgen::KeyPair, String)> {
    let key = rcgen::KeyPair::generate().context("making a key")?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).context("a CSR")?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let csr = params.serialize_request(&key).and_then(|c| c.pem()).context("a CSR")?;
    Ok((key, csr))
}

/// Writes `dir/file` (0600; the directory 0700), replacing what an earlier,
/// expired identity left.
pub fn write_private(dir: &Path, file: &str, contents: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).with_context(|| format!("{}", dir.display()))?;
    let path = dir.join(file);
    let tmp = dir.join(format!(".{file}.new"));
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("{}", tmp.display()))?;
    out.write_all(contents).and_then(|()| out.sync_all()).with_context(|| format!("{}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("{}", path.display()))
}

/// The CA certificate (PEM) in the chain the controller at `url` presents
/// whose key hashes to `ca_hash`; the handshake only collects the chain,
/// the join itself then verifies the controller against that CA.
async fn pinned_ca(url: &str, ca_hash: &str) -> anyhow::Result<String> {
    let uri: tonic::codegen::http::Uri = url.parse().with_context(|| format!("'{url}' is not a URL"))?;
    let host = uri.host().context("a URL without a host")?.trim_start_matches('[').trim_end_matches(']').to_owned();
    let port = uri.port_u16().unwrap_or(443);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let capture = Arc::new(Capture { chain: Mutex::default(), provider: provider.clone() });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(capture.clone())
        .with_no_client_auth();
    let tcp =
        tokio::time::timeout(std::time::Duration::from_secs(10), tokio::net::TcpStream::connect((host.as_str(), port)))
            .await
            .with_context(|| format!("cannot reach {url}: no answer within 10 s"))?
            .with_context(|| format!("cannot reach {url}"))?;
    let server = rustls::pki_types::ServerName::try_from(host.clone()).with_context(|| format!("'{host}'"))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(server, tcp)
        .await
        .with_context(|| format!("no TLS handshake with {url}"))?;
    let chain = capture.chain.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    let mut seen = Vec::new();
    for der in &chain {
        let hash = tls::spki_hash(der).map_err(anyhow::Error::msg)?;
        if hash == ca_hash {
            return Ok(pem::encode(&pem::Pem::new("CERTIFICATE", der.to_vec())));
        }
        seen.push(hash);
    }
    anyhow::bail!(
        "no certificate the controller at {url} presents has --ca-hash {ca_hash} (it presents {}): check the hash \
         `benchfleet token create` printed, or whether this is the controller you meant",
        seen.join(", ")
    )
}

/// A verifier that accepts any chain and keeps it, for `pinned_ca` only:
/// the handshake's signatures are still checked.
#[derive(Debug)]
struct Capture {
    chain: Mutex<Vec<rustls::pki_types::CertificateDer<'static>>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for Capture {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let chain = std::iter::once(end_entity).chain(intermediates).map(|c| c.clone().into_owned()).collect();
        *self.chain.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = chain;
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// Finishes a renewal a kill interrupted (see `renew`): a new certificate
/// whose key is already in place is moved in; a pair never moved in is
/// dropped, and the old identity stays.
pub fn finish_renewal(dir: &Path) {
    let (cert, key) = (dir.join(format!(".{CERT}.new")), dir.join(format!(".{KEY}.new")));
    if key.exists() {
        let _ = std::fs::remove_file(&key);
        let _ = std::fs::remove_file(&cert);
    } else if cert.exists() {
        let _ = std::fs::rename(&cert, dir.join(CERT));
    }
}

/// When the certificate in `dir` is due for renewal: at 2/3 of its life.
pub fn renewal_due(dir: &Path) -> Option<std::time::SystemTime> {
    let peer = ClientTls::from_dir(dir, "agent").ok()?.peer()?.ok()?;
    let life = (peer.not_after_unix - peer.not_before_unix).max(0);
    let at = peer.not_before_unix + life * 2 / 3;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::try_from(at).unwrap_or_default()))
}

/// Renews the agent's certificate over `channel` (a session's): a new key
/// made here, a CSR, and the new pair stored so that a kill at any point
/// leaves one whole identity (`finish_renewal`). Returns its expiry.
pub async fn renew(channel: tonic::transport::Channel, dir: &Path, name: &str) -> anyhow::Result<i64> {
    let (key, csr) = new_key(name)?;
    let reply = benchfleet_proto::agent_service_client::AgentServiceClient::new(channel)
        .renew(benchfleet_proto::RenewRequest { csr_pem: csr })
        .await
        .map_err(|s| anyhow::anyhow!("the controller refused to renew: {}", s.message()))?
        .into_inner();
    let peer = tls::first_cert(reply.certificate_pem.as_bytes())
        .and_then(|der| tls::peer_of(&der))
        .map_err(|e| anyhow::anyhow!("the renewed certificate cannot be read: {e}"))?;
    anyhow::ensure!(peer.role == Role::Agent && peer.name == name, "the controller renewed someone else");
    // Both new files first; then the key, then the certificate, moved in.
    write_private(dir, &format!(".{KEY}.new"), key.serialize_pem().as_bytes())?;
    write_private(dir, &format!(".{CERT}.new"), reply.certificate_pem.as_bytes())?;
    std::fs::rename(dir.join(format!(".{KEY}.new")), dir.join(KEY)).context("moving the new key in")?;
    std::fs::rename(dir.join(format!(".{CERT}.new")), dir.join(CERT)).context("moving the new certificate in")?;
    Ok(peer.not_after_unix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = std::fs::read_dir(dir)
            .expect("dir")
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read_to_string(e.path()).expect("text")))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn a_renewal_killed_at_any_point_leaves_one_whole_identity() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path();
        let old = [(CERT, "old cert"), (KEY, "old key")];
        let pair = |cert: &str, key: &str| vec![(KEY.to_owned(), key.to_owned()), (CERT.to_owned(), cert.to_owned())];
        // Killed before anything moved in (one or both new files written):
        // the old pair stays.
        for written in [&[".agent-key.pem.new"][..], &[".agent-key.pem.new", ".agent.pem.new"]] {
            for (f, text) in old {
                std::fs::write(dir.join(f), text).expect("write");
            }
            for f in written {
                std::fs::write(dir.join(f), "new").expect("write");
            }
            finish_renewal(dir);
            assert_eq!(files(dir), pair("old cert", "old key"), "{written:?}");
        }
        // Killed after the key moved in: the new certificate follows it.
        std::fs::write(dir.join(KEY), "new key").expect("write");
        std::fs::write(dir.join(".agent.pem.new"), "new cert").expect("write");
        finish_renewal(dir);
        assert_eq!(files(dir), pair("new cert", "new key"));
        // Nothing half done: nothing changes.
        finish_renewal(dir);
        assert_eq!(files(dir), pair("new cert", "new key"));
    }
}
