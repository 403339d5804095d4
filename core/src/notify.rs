//! systemd's readiness protocol (`sd_notify`): a daemon sends `READY=1`
//! once it serves and `STOPPING=1` when it begins to stop, as datagrams to
//! the socket `NOTIFY_SOCKET` names (a path, or `@name` in the abstract
//! namespace). Without `NOTIFY_SOCKET` nothing is sent. A failure to send is
//! the caller's to log, never a reason to stop.

use std::ffi::OsStr;
use std::os::unix::net::UnixDatagram;

/// Sends `state` (e.g. `READY=1`) to `NOTIFY_SOCKET`; `Ok(false)` when the
/// variable is not set (no service manager listens).
pub fn notify(state: &str) -> std::io::Result<bool> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(target) => notify_to(&target, state).map(|()| true),
        None => Ok(false),
    }
}

/// Sends `state` to the socket `target` names.
pub fn notify_to(target: &OsStr, state: &str) -> std::io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(target);
    match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt as _;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            socket.send_to(state.as_bytes(), target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(listener: &UnixDatagram) -> String {
        let mut buf = [0; 64];
        let n = listener.recv(&mut buf).expect("received");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn states_reach_a_path_and_an_abstract_socket() {
        let tmp = tempfile::tempdir().expect("tmp");
        let path = tmp.path().join("notify");
        let listener = UnixDatagram::bind(&path).expect("bind");
        notify_to(path.as_os_str(), "READY=1").expect("sent");
        assert_eq!(received(&listener), "READY=1");

        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("benchfleet-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("name");
        let listener = UnixDatagram::bind_addr(&addr).expect("bind");
        notify_to(OsStr::new(&format!("@{name}")), "STOPPING=1").expect("sent");
        assert_eq!(received(&listener), "STOPPING=1");
        assert!(notify_to(tmp.path().join("none").as_os_str(), "READY=1").is_err());
    }
}
