//! The agent's identity: its certificate, key and the fleet's CA in
//! `WORK_DIR/identity/`, and the name the certificate gives it. Under
//! `https://` the agent is who its certificate says, and nothing else; over
//! plain text (loopback, `--insecure`) it is its `--name`.

use std::path::{Path, PathBuf};

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
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "agent".to_owned())
}

/// Whether `url` may be reached at all under the client rule (a typo'd
/// scheme or a plain-text remote is refused before anything starts).
pub fn check_url(url: &str, tls: &ClientTls) -> anyhow::Result<()> {
    tls::endpoint(url, tls).map(drop).map_err(anyhow::Error::from)
}
