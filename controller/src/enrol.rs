//! Enrolment: join tokens, the agents' certificates the controller issued,
//! and revocations. A pure state with time as input, kept as one JSON
//! document in the store (a fleet's tokens and agents are few); the
//! controller holds it behind a lock and writes it back after each change.
//!
//! A token is `ID.SECRET` (`[a-z0-9]{6}.[a-z0-9]{16}`, kubeadm's shape);
//! only SHA-256(SECRET) is kept. A join consumes one use. A name an agent
//! holds an unexpired, unrevoked certificate for is not given again. A
//! revocation of NAME covers every certificate of that name issued before
//! it (by `notBefore`), agents' and operators' alike.

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::pki;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Enrolment {
    pub tokens: Vec<Token>,
    pub agents: Vec<Enrolled>,
    pub revoked: Vec<Revocation>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Token {
    pub id: String,
    /// SHA-256 of the secret, hex.
    pub secret_sha256: String,
    pub expires_unix: i64,
    /// Only an agent of this name may join with it.
    pub agent: Option<String>,
    pub uses_left: u32,
}

/// An agent's certificate, as issued.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Enrolled {
    pub name: String,
    pub serial: String,
    pub issued_unix: i64,
    pub not_after_unix: i64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Revocation {
    pub name: String,
    /// Certificates of `name` whose notBefore is earlier are revoked.
    pub at_unix: i64,
    pub by: String,
    pub reason: String,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum JoinError {
    #[error("a join token is ID.SECRET ([a-z0-9]{{6}}.[a-z0-9]{{16}})")]
    Malformed,
    #[error("join token {0} is not known here")]
    Unknown(String),
    #[error("join token {0} has expired")]
    Expired(String),
    #[error("join token {0} has been used")]
    Used(String),
    #[error("join token {id} is for agent '{agent}', not '{name}'")]
    OtherAgent { id: String, agent: String, name: String },
    #[error("'{0}' cannot be an agent's name: use 1 to 64 letters, digits, '.', '_' or '-'")]
    Name(String),
    #[error(
        "agent '{0}' already holds a certificate that is neither expired nor revoked: `benchfleet revoke {0}` first, \
         or join under another --name"
    )]
    Taken(String),
}

/// Now, in the seconds enrolment counts in.
pub fn now_s() -> i64 {
    crate::plan::unix_ms() / 1000
}

/// Seconds since the epoch as the milliseconds the wire carries.
pub fn wire_ms(unix_s: i64) -> u64 {
    u64::try_from(unix_s).unwrap_or_default().saturating_mul(1000)
}

const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

fn random_word(n: usize) -> Result<String, pki::PkiError> {
    // 256 % 36 = 4: bytes past 252 are drawn again, so every letter is as
    // likely as another.
    let mut out = String::with_capacity(n);
    while out.len() < n {
        for b in pki::random::<32>()? {
            if b < 252 && out.len() < n {
                out.push(ALPHABET[usize::from(b) % ALPHABET.len()] as char);
            }
        }
    }
    Ok(out)
}

fn secret_hash(secret: &str) -> String {
    pki::hex(&sha2::Sha256::digest(secret.as_bytes()))
}

fn split(token: &str) -> Result<(&str, &str), JoinError> {
    let (id, secret) = token.split_once('.').ok_or(JoinError::Malformed)?;
    let word = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| ALPHABET.contains(&b));
    if word(id, 6) && word(secret, 16) { Ok((id, secret)) } else { Err(JoinError::Malformed) }
}

impl Enrolment {
    pub fn from_json(bytes: &[u8]) -> Result<Enrolment, String> {
        serde_json::from_slice(bytes).map_err(|e| format!("the enrolment state: {e}"))
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A new token; returns `ID.SECRET`, the only time the secret exists.
    pub fn create_token(
        &mut self,
        now: i64,
        ttl_s: u64,
        agent: Option<String>,
        uses: u32,
    ) -> Result<(String, i64), pki::PkiError> {
        self.forget(now);
        let id = loop {
            let id = random_word(6)?;
            if !self.tokens.iter().any(|t| t.id == id) {
                break id;
            }
        };
        let secret = random_word(16)?;
        let expires_unix = now.saturating_add(i64::try_from(ttl_s).unwrap_or(i64::MAX));
        self.tokens.push(Token {
            id: id.clone(),
            secret_sha256: secret_hash(&secret),
            expires_unix,
            agent,
            uses_left: uses.max(1),
        });
        Ok((format!("{id}.{secret}"), expires_unix))
    }

    /// Checks a join and consumes one use of its token; the caller issues
    /// the certificate and records it with `enrolled`.
    pub fn join(&mut self, now: i64, token: &str, name: &str) -> Result<(), JoinError> {
        let (id, secret) = split(token)?;
        let i = self.tokens.iter().position(|t| t.id == id).ok_or_else(|| JoinError::Unknown(id.to_owned()))?;
        let t = &self.tokens[i];
        // Compared as hashes: how long the comparison takes says nothing of
        // the secret.
        if t.secret_sha256 != secret_hash(secret) {
            return Err(JoinError::Unknown(id.to_owned()));
        }
        if t.expires_unix <= now {
            return Err(JoinError::Expired(id.to_owned()));
        }
        if t.uses_left == 0 {
            return Err(JoinError::Used(id.to_owned()));
        }
        if let Some(agent) = t.agent.as_ref().filter(|a| *a != name) {
            return Err(JoinError::OtherAgent { id: id.to_owned(), agent: agent.clone(), name: name.to_owned() });
        }
        if !pki::valid_name(name) {
            return Err(JoinError::Name(name.to_owned()));
        }
        let live = |a: &&Enrolled| a.name == name && a.not_after_unix > now && !self.revoked(name, a.issued_unix);
        if self.agents.iter().any(|a| live(&a)) {
            return Err(JoinError::Taken(name.to_owned()));
        }
        self.tokens[i].uses_left -= 1;
        Ok(())
    }

    /// An agent's certificate was issued (at join or renewal).
    pub fn enrolled(&mut self, now: i64, e: Enrolled) {
        self.forget(now);
        self.agents.retain(|a| !(a.name == e.name && a.serial == e.serial));
        self.agents.push(e);
    }

    /// Revokes every certificate of `name` issued until `now`; returns how
    /// many agents' certificates of that name were live, and the time the
    /// revocation holds until (`Revocation::at_unix`).
    pub fn revoke(&mut self, now: i64, name: &str, by: String, reason: String) -> (u32, i64) {
        let live = self.agents.iter().filter(|a| a.name == name && a.not_after_unix > now).count();
        self.revoked.retain(|r| r.name != name);
        // A certificate issued in this very second is revoked too.
        let at_unix = now + 1;
        self.revoked.push(Revocation { name: name.to_owned(), at_unix, by, reason });
        (u32::try_from(live).unwrap_or(u32::MAX), at_unix)
    }

    /// Whether a certificate of `name` whose notBefore is `not_before` is
    /// revoked.
    pub fn revoked(&self, name: &str, not_before: i64) -> bool {
        self.revoked.iter().any(|r| r.name == name && not_before < r.at_unix)
    }

    /// Drops what can no longer matter: expired tokens (a spent one is kept
    /// until then, so that a second join is told it was used), expired
    /// certificates.
    fn forget(&mut self, now: i64) {
        self.tokens.retain(|t| t.expires_unix > now);
        self.agents.retain(|a| a.not_after_unix > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enrolled(name: &str, at: i64) -> Enrolled {
        Enrolled { name: name.into(), serial: format!("s-{name}-{at}"), issued_unix: at, not_after_unix: at + 100 }
    }

    #[test]
    fn a_token_is_kubeadm_shaped_and_only_its_hash_is_kept() {
        let mut e = Enrolment::default();
        let (token, expires) = e.create_token(1000, 3600, None, 1).expect("token");
        assert_eq!(expires, 4600);
        let (id, secret) = split(&token).expect("the token's shape");
        let json = String::from_utf8(e.to_json()).expect("utf-8");
        assert!(json.contains(id) && !json.contains(secret), "{json}");
        assert_eq!(Enrolment::from_json(json.as_bytes()).expect("reads back"), e);
    }

    #[test]
    fn joins_are_refused_for_every_reason_a_token_or_name_has() {
        let mut e = Enrolment::default();
        let (one, _) = e.create_token(0, 100, None, 1).expect("token");
        let (two, _) = e.create_token(0, 100, Some("gpu-1".into()), 2).expect("token");
        let id = |t: &str| t[..6].to_owned();
        assert_eq!(e.join(10, "nonsense", "a"), Err(JoinError::Malformed));
        assert_eq!(e.join(10, "abcdef.0123456789abcdef", "a"), Err(JoinError::Unknown("abcdef".into())));
        let wrong = format!("{}.{}", id(&one), "x".repeat(16));
        assert_eq!(e.join(10, &wrong, "a"), Err(JoinError::Unknown(id(&one))));
        assert_eq!(e.join(100, &one, "a"), Err(JoinError::Expired(id(&one))));
        assert_eq!(e.join(10, &one, "a/b"), Err(JoinError::Name("a/b".into())));
        assert_eq!(e.join(10, &one, "gpu-0"), Ok(()));
        assert_eq!(e.join(10, &one, "gpu-9"), Err(JoinError::Used(id(&one))));
        let other = JoinError::OtherAgent { id: id(&two), agent: "gpu-1".into(), name: "gpu-2".into() };
        assert_eq!(e.join(10, &two, "gpu-2"), Err(other));
        assert_eq!(e.join(10, &two, "gpu-1"), Ok(()));
        e.enrolled(10, enrolled("gpu-1", 10));
        assert_eq!(e.join(11, &two, "gpu-1"), Err(JoinError::Taken("gpu-1".into())), "a live name is not given again");
        // Revoked, the name may join again; its old certificate stays revoked.
        assert_eq!(e.revoke(12, "gpu-1", "admin".into(), "re-imaged".into()), (1, 13));
        assert!(e.revoked("gpu-1", 10) && e.revoked("gpu-1", 12) && !e.revoked("gpu-1", 13));
        assert_eq!(e.join(13, &two, "gpu-1"), Ok(()));
        assert_eq!(e.join(13, &two, "gpu-1"), Err(JoinError::Used(id(&two))));
    }

    #[test]
    fn expired_tokens_and_certificates_are_forgotten() {
        let mut e = Enrolment::default();
        let (t, _) = e.create_token(0, 10, None, 1).expect("token");
        e.join(1, &t, "a").expect("joined");
        e.enrolled(1, enrolled("a", 1));
        e.create_token(200, 10, None, 1).expect("another");
        assert_eq!((e.tokens.len(), e.agents.len()), (1, 0));
    }
}
