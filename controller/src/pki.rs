//! The fleet's certificates: the controller's CA (`benchfleet certs init`),
//! the certificates it issues (the controller's own, operators', agents'
//! from their CSRs), and the identity a presented certificate carries.
//!
//! A certificate's subject says who and what its holder is: `CN` the name,
//! `OU` the role (`agent`, `admin`, `read`, `controller`), `O=benchfleet`.
//! The controller writes every subject itself; a CSR contributes only its
//! public key. Keys are files of mode 0600 in a directory of mode 0700, and
//! nothing here overwrites a file.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use benchfleet_core::tls;
pub use benchfleet_core::tls::{Peer, Role, hex, peer_of};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SerialNumber,
};

/// The CA's certificate, which every side trusts.
pub const CA_CERT: &str = "ca.pem";
/// The CA's key: only `certs init`, `certs issue` and the controller read it.
pub const CA_KEY: &str = "ca-key.pem";
/// The controller's certificate (leaf, then the CA) and key.
pub const CONTROLLER_CERT: &str = "controller.pem";
pub const CONTROLLER_KEY: &str = "controller-key.pem";
/// The first admin operator's certificate and key.
pub const ADMIN_CERT: &str = "admin.pem";
pub const ADMIN_KEY: &str = "admin-key.pem";
/// An identity directory's certificate and key (`certs issue`'s output,
/// `--identity DIR`): beside its `ca.pem`.
pub const OPERATOR_CERT: &str = "operator.pem";
pub const OPERATOR_KEY: &str = "operator-key.pem";

/// How long the CA lasts.
pub const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long the controller's and operators' certificates last.
pub const SERVICE_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long an agent's certificate lasts (renewed at 2/3 of it).
pub const AGENT_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{} already exists: certs init never overwrites (remove the directory to start a new CA)", .0.display())]
    Exists(PathBuf),
    #[error("{} is missing: {hint}", .path.display())]
    Missing { path: PathBuf, hint: &'static str },
    #[error("{}: {reason}", .path.display())]
    Io { path: PathBuf, reason: String },
    #[error("{0}")]
    Cert(String),
    #[error("'{0}' cannot be a certificate's name: use 1 to 64 letters, digits, '.', '_' or '-'")]
    Name(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PkiError + '_ {
    move |e| PkiError::Io { path: path.to_owned(), reason: e.to_string() }
}

fn cert_error(what: &str) -> impl FnOnce(rcgen::Error) -> PkiError + '_ {
    move |e| PkiError::Cert(format!("{what}: {e}"))
}

/// Whether a name may go in a certificate (agents' and operators').
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// `sha256:HEX` of a certificate's SubjectPublicKeyInfo (see `tls::spki_hash`).
pub fn spki_hash(der: &[u8]) -> Result<String, PkiError> {
    tls::spki_hash(der).map_err(PkiError::Cert)
}

/// The CA, loaded to issue certificates.
pub struct Ca {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// A certificate issued, with its key when it was made here.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: Option<String>,
    pub serial: String,
    pub not_before_unix: i64,
    pub not_after_unix: i64,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").field("serial", &self.serial).finish_non_exhaustive()
    }
}

fn read(path: &Path, hint: &'static str) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => PkiError::Missing { path: path.to_owned(), hint },
        _ => io(path)(e),
    })
}

const NO_PKI: &str = "run `benchfleet certs init` first, or give --pki-dir";

impl Ca {
    pub fn load(dir: &Path) -> Result<Ca, PkiError> {
        let cert_pem = read(&dir.join(CA_CERT), NO_PKI)?;
        let key = KeyPair::from_pem(&read(&dir.join(CA_KEY), NO_PKI)?).map_err(cert_error("the CA's key"))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, key).map_err(cert_error("the CA's certificate"))?;
        Ok(Ca { cert_pem, issuer })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// `sha256:HEX` of the CA's key, for `--ca-hash`.
    pub fn hash(&self) -> Result<String, PkiError> {
        tls::first_cert(self.cert_pem.as_bytes()).map_err(PkiError::Cert).and_then(|der| spki_hash(&der))
    }

    /// A certificate for `name` in `role`, with a key made here.
    pub fn issue(&self, name: &str, role: Role, lifetime: Duration, sans: &[String]) -> Result<Issued, PkiError> {
        let key = KeyPair::generate().map_err(cert_error("making a key"))?;
        let mut issued = self.sign(name, role, None, lifetime, sans, &key)?;
        issued.key_pem = Some(key.serialize_pem());
        Ok(issued)
    }

    /// A certificate for a CSR (PEM); the CSR's subject and extensions are
    /// ignored, only its key is used.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        name: &str,
        role: Role,
        agent_id: Option<u64>,
        lifetime: Duration,
    ) -> Result<Issued, PkiError> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| PkiError::Cert(format!("a certificate signing request that cannot be read: {e}")))?;
        self.sign(name, role, agent_id, lifetime, &[], &csr.public_key)
    }

    fn sign(
        &self,
        name: &str,
        role: Role,
        agent_id: Option<u64>,
        lifetime: Duration,
        sans: &[String],
        key: &impl PublicKeyData,
    ) -> Result<Issued, PkiError> {
        if role != Role::Controller && !valid_name(name) {
            return Err(PkiError::Name(name.to_owned()));
        }
        let mut params = CertificateParams::new(sans.to_vec()).map_err(cert_error("a subject alternative name"))?;
        params.distinguished_name = subject(name, role);
        if let Some(id) = agent_id {
            params.distinguished_name.push(DnType::CustomDnType(tls::UID_OID.to_vec()), id.to_string());
        }
        let serial = random_serial()?;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        // Issued now: a revocation covers the certificates issued before it
        // (`enrol`). Clients check the controller's certificate, made at
        // `certs init`, not their own.
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now;
        params.not_after = now + lifetime;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![match role {
            Role::Controller => ExtendedKeyUsagePurpose::ServerAuth,
            _ => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(key, &self.issuer).map_err(cert_error("signing"))?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: None,
            serial: hex(&serial),
            not_before_unix: params.not_before.unix_timestamp(),
            not_after_unix: params.not_after.unix_timestamp(),
        })
    }
}

fn subject(name: &str, role: Role) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "benchfleet");
    dn.push(DnType::OrganizationalUnitName, role.as_str());
    dn.push(DnType::CommonName, name);
    dn
}

/// 16 random bytes, positive as a DER integer.
fn random_serial() -> Result<[u8; 16], PkiError> {
    let mut serial = random::<16>()?;
    serial[0] &= 0x7f;
    serial[0] |= 0x01;
    Ok(serial)
}

/// Bytes from the system's secure random source.
pub fn random<const N: usize>() -> Result<[u8; N], PkiError> {
    use ring::rand::SecureRandom as _;
    let mut out = [0; N];
    ring::rand::SystemRandom::new().fill(&mut out).map_err(|_| PkiError::Cert("no secure random numbers".into()))?;
    Ok(out)
}

/// Writes a file that must not exist yet; `secret` ones get mode 0600.
pub fn write_new(path: &Path, contents: &[u8], secret: bool) -> Result<(), PkiError> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true).mode(if secret { 0o600 } else { 0o644 });
    let mut file = options.open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => PkiError::Exists(path.to_owned()),
        _ => io(path)(e),
    })?;
    file.write_all(contents).and_then(|()| file.sync_all()).map_err(io(path))
}

/// Makes a directory of mode 0700 (and its parents); an existing one is
/// used as it is.
pub fn private_dir(dir: &Path) -> Result<(), PkiError> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io(dir))
}

/// What `certs init` made.
#[derive(Debug)]
pub struct Initialized {
    pub dir: PathBuf,
    pub ca_hash: String,
}

/// The ingest credentials' key, beside the CA: 32 random bytes, hex.
pub const INGEST_KEY: &str = "ingest.key";

/// The CA's hash from the CA file in `dir`.
pub fn ca_hash(dir: &Path) -> Result<String, PkiError> {
    let pem = read(&dir.join(CA_CERT), NO_PKI)?;
    tls::first_cert(pem.as_bytes()).map_err(PkiError::Cert).and_then(|der| spki_hash(&der))
}

/// `benchfleet certs init`: a new CA in `dir` (which must not hold one),
/// the controller's certificate for localhost, 127.0.0.1, ::1, `host` and
/// `sans`, the first admin operator's, and the ingest credentials' key.
pub fn init(dir: &Path, host: &str, sans: &[String]) -> Result<Initialized, PkiError> {
    for file in [CA_CERT, CA_KEY, CONTROLLER_CERT, CONTROLLER_KEY, ADMIN_CERT, ADMIN_KEY, INGEST_KEY] {
        if dir.join(file).exists() {
            return Err(PkiError::Exists(dir.join(file)));
        }
    }
    private_dir(dir)?;
    let key = KeyPair::generate().map_err(cert_error("making the CA's key"))?;
    let mut params = CertificateParams::default();
    params.distinguished_name = subject("benchfleet CA", Role::Controller);
    params.distinguished_name.remove(DnType::OrganizationalUnitName);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.serial_number = Some(SerialNumber::from_slice(&random_serial()?));
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(1);
    params.not_after = now + CA_LIFETIME;
    let cert = params.self_signed(&key).map_err(cert_error("making the CA"))?;
    let ca_hash = spki_hash(cert.der())?;
    write_new(&dir.join(CA_KEY), key.serialize_pem().as_bytes(), true)?;
    write_new(&dir.join(CA_CERT), cert.pem().as_bytes(), false)?;
    let ca = Ca { cert_pem: cert.pem(), issuer: Issuer::new(params, key) };

    let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"].iter().map(|s| (*s).to_owned()).collect();
    for name in std::iter::once(host.to_owned()).chain(sans.iter().cloned()) {
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
    }
    let controller = ca.issue("benchfleet-controller", Role::Controller, SERVICE_LIFETIME, &names)?;
    write_new(&dir.join(CONTROLLER_KEY), controller.key_pem.as_deref().unwrap_or_default().as_bytes(), true)?;
    write_new(&dir.join(CONTROLLER_CERT), format!("{}{}", controller.cert_pem, ca.cert_pem).as_bytes(), false)?;
    let admin = ca.issue("admin", Role::Admin, SERVICE_LIFETIME, &[])?;
    write_new(&dir.join(ADMIN_KEY), admin.key_pem.as_deref().unwrap_or_default().as_bytes(), true)?;
    write_new(&dir.join(ADMIN_CERT), admin.cert_pem.as_bytes(), false)?;
    write_new(&dir.join(INGEST_KEY), hex(&random::<32>()?).as_bytes(), true)?;
    Ok(Initialized { dir: dir.to_owned(), ca_hash })
}

/// `benchfleet certs issue NAME --role R`: an operator's identity
/// directory (`ca.pem`, `operator.pem`, `operator-key.pem`) at `out`.
pub fn issue_operator(pki: &Path, name: &str, role: Role, out: &Path) -> Result<Issued, PkiError> {
    if !matches!(role, Role::Admin | Role::Read) {
        return Err(PkiError::Cert(format!("operators are admin or read, not {role}")));
    }
    let ca = Ca::load(pki)?;
    for file in [CA_CERT, OPERATOR_CERT, OPERATOR_KEY] {
        if out.join(file).exists() {
            return Err(PkiError::Exists(out.join(file)));
        }
    }
    let issued = ca.issue(name, role, SERVICE_LIFETIME, &[])?;
    private_dir(out)?;
    write_new(&out.join(OPERATOR_KEY), issued.key_pem.as_deref().unwrap_or_default().as_bytes(), true)?;
    write_new(&out.join(OPERATOR_CERT), issued.cert_pem.as_bytes(), false)?;
    write_new(&out.join(CA_CERT), ca.cert_pem.as_bytes(), false)?;
    Ok(issued)
}

/// The controller's TLS material: its certificate chain and key, and the CA
/// clients' certificates must chain to.
#[derive(Clone)]
pub struct ServerTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub client_ca_pem: Vec<u8>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    pub fn read(cert: &Path, key: &Path, client_ca: &Path) -> Result<ServerTls, PkiError> {
        const HINT: &str = "give --tls-cert, --tls-key and --client-ca, or run `benchfleet certs init`";
        let bytes = |p: &Path| read(p, HINT).map(String::into_bytes);
        Ok(ServerTls { cert_pem: bytes(cert)?, key_pem: bytes(key)?, client_ca_pem: bytes(client_ca)? })
    }

    pub fn config(&self) -> tonic::transport::ServerTlsConfig {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .client_ca_root(Certificate::from_pem(&self.client_ca_pem))
            // Enrolment and ingest come without a certificate; every other
            // call is refused without one (`auth`).
            .client_auth_optional(true)
            .timeout(Duration::from_secs(10))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).expect("exists").permissions().mode() & 0o777
    }

    fn der(pem: &str) -> Vec<u8> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject as _;
        CertificateDer::pem_slice_iter(pem.as_bytes()).next().expect("one").expect("pem").to_vec()
    }

    #[test]
    fn init_makes_a_private_ca_and_never_overwrites() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("pki");
        let made = init(&dir, "gpu-ctl", &["ctl.lab".into()]).expect("init");
        assert_eq!(mode(&dir), 0o700);
        for key in [CA_KEY, CONTROLLER_KEY, ADMIN_KEY, INGEST_KEY] {
            assert_eq!(mode(&dir.join(key)), 0o600, "{key}");
        }
        let ca = std::fs::read_to_string(dir.join(CA_CERT)).expect("ca");
        assert_eq!(spki_hash(&der(&ca)).expect("hash"), made.ca_hash);
        assert!(made.ca_hash.starts_with("sha256:") && made.ca_hash.len() == 7 + 64);
        let chain = std::fs::read_to_string(dir.join(CONTROLLER_CERT)).expect("chain");
        assert!(chain.ends_with(&ca), "the controller's file carries the CA");
        let admin = peer_of(&der(&std::fs::read_to_string(dir.join(ADMIN_CERT)).expect("admin"))).expect("peer");
        assert_eq!((admin.name.as_str(), admin.role), ("admin", Role::Admin));

        let before = std::fs::read(dir.join(CA_KEY)).expect("key");
        let e = init(&dir, "gpu-ctl", &[]).expect_err("a second init");
        assert!(e.to_string().contains("certs init never overwrites"), "{e}");
        assert_eq!(std::fs::read(dir.join(CA_KEY)).expect("key"), before);
    }

    #[test]
    fn the_controller_writes_the_subject_not_the_csr() {
        let tmp = tempfile::tempdir().expect("tmp");
        init(tmp.path(), "h", &[]).expect("init");
        let ca = Ca::load(tmp.path()).expect("ca");
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["evil".to_owned()]).expect("params");
        params.distinguished_name = subject("someone-else", Role::Admin);
        let csr = params.serialize_request(&key).expect("csr").pem().expect("pem");
        let issued = ca.sign_csr(&csr, "gpu-7", Role::Agent, Some(7), AGENT_LIFETIME).expect("signed");
        assert!(issued.key_pem.is_none());
        let peer = peer_of(&der(&issued.cert_pem)).expect("peer");
        assert_eq!(
            (peer.name.as_str(), peer.role, peer.serial.as_str()),
            ("gpu-7", Role::Agent, issued.serial.as_str())
        );
        assert_eq!(peer.agent_id, Some(7), "the id the controller wrote");
        let left = peer.not_after_unix - time::OffsetDateTime::now_utc().unix_timestamp();
        assert!((AGENT_LIFETIME.as_secs() as i64 - 5..=AGENT_LIFETIME.as_secs() as i64).contains(&left), "{left}");
        assert!(ca.sign_csr("not a csr", "gpu-7", Role::Agent, None, AGENT_LIFETIME).is_err());
        assert!(matches!(ca.issue("a/b", Role::Read, SERVICE_LIFETIME, &[]), Err(PkiError::Name(_))));
    }

    #[test]
    fn operators_get_an_identity_directory() {
        let tmp = tempfile::tempdir().expect("tmp");
        let pki = tmp.path().join("pki");
        init(&pki, "h", &[]).expect("init");
        let out = tmp.path().join("alice");
        issue_operator(&pki, "alice", Role::Read, &out).expect("issued");
        let peer = peer_of(&der(&std::fs::read_to_string(out.join(OPERATOR_CERT)).expect("cert"))).expect("peer");
        assert_eq!((peer.name.as_str(), peer.role), ("alice", Role::Read));
        assert_eq!(mode(&out.join(OPERATOR_KEY)), 0o600);
        assert!(matches!(issue_operator(&pki, "alice", Role::Read, &out), Err(PkiError::Exists(_))));
        assert!(issue_operator(&pki, "bob", Role::Agent, &tmp.path().join("bob")).is_err());
        let e =
            issue_operator(&tmp.path().join("none"), "bob", Role::Read, &tmp.path().join("bob")).expect_err("no CA");
        assert!(e.to_string().contains("run `benchfleet certs init` first"), "{e}");
    }
}
