//! What a service manager or an orchestrator sees of the daemons: systemd's
//! readiness protocol (`READY=1` once serving, `STOPPING=1` on SIGTERM, to
//! the socket `NOTIFY_SOCKET` names) and the controller's `/healthz` and
//! `/readyz`, which a probe without a client certificate can reach.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::faults::{Proc, bin};

fn listener(path: &Path) -> UnixDatagram {
    let socket = UnixDatagram::bind(path).expect("bind");
    socket.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    socket
}

/// The next state a daemon sent (on a blocking thread: the wait is long).
async fn next_state(socket: &UnixDatagram) -> String {
    let socket = socket.try_clone().expect("clone");
    tokio::task::spawn_blocking(move || {
        let mut buf = [0; 256];
        let n = socket.recv(&mut buf).expect("a state within 60 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    })
    .await
    .expect("joined")
}

async fn get(addr: &str, path: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(format!("GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.expect("read");
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_tells_systemd_and_probes_when_it_serves_and_when_it_stops() {
    let tmp = tempfile::tempdir().expect("tmp");
    let notify = tmp.path().join("notify");
    let socket = listener(&notify);
    let metrics = format!("127.0.0.1:{}", free_port());
    let args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        &tmp.path().join("data").display().to_string(),
        "--metrics-listen",
        &metrics,
    ]
    .map(String::from)
    .to_vec();
    let mut controller = Proc::spawn_with(
        &bin("benchfleet-controller"),
        &args,
        &[("NOTIFY_SOCKET", notify.as_path())],
        tmp.path().join("controller.log"),
    );
    assert_eq!(next_state(&socket).await, "READY=1");
    let mut healthy = String::new();
    for _ in 0..100 {
        healthy = get(&metrics, "/healthz").await;
        if healthy.starts_with("HTTP/1.1 200") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(healthy.starts_with("HTTP/1.1 200") && healthy.ends_with("ok\n"), "{healthy}");
    let ready = get(&metrics, "/readyz").await;
    assert!(ready.starts_with("HTTP/1.1 200") && ready.ends_with("ready\n"), "{ready}");
    controller.signal(rustix::process::Signal::TERM);
    assert_eq!(next_state(&socket).await, "STOPPING=1");
    assert!(controller.exit(Duration::from_secs(15)).await.success(), "{}", controller.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_is_ready_once_its_gpus_are_checked_without_waiting_for_the_controller() {
    let tmp = tempfile::tempdir().expect("tmp");
    let notify = tmp.path().join("notify");
    let socket = listener(&notify);
    // No controller listens there: the agent is ready all the same.
    let url = format!("http://127.0.0.1:{}", free_port());
    let work = tmp.path().join("work").display().to_string();
    let args: Vec<String> =
        ["--controller", &url, "--sim-gpus", "H200x1", "--sim-engines", "--docker", "off", "--work-dir", &work]
            .map(String::from)
            .to_vec();
    let mut agent = Proc::spawn_with(
        &bin("benchfleet-agent"),
        &args,
        &[("NOTIFY_SOCKET", notify.as_path())],
        tmp.path().join("agent.log"),
    );
    assert_eq!(next_state(&socket).await, "READY=1");
    agent.signal(rustix::process::Signal::TERM);
    assert_eq!(next_state(&socket).await, "STOPPING=1");
    assert!(agent.exit(Duration::from_secs(15)).await.success(), "{}", agent.text());
}
