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

/// The whole answer, or nothing when no one listens yet.
pub(crate) async fn get(addr: &str, path: &str) -> String {
    let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await else { return String::new() };
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
    // As a unit starts it: everything from the config file.
    let config = tmp.path().join("controller.toml");
    let data = tmp.path().join("data");
    std::fs::write(
        &config,
        format!("listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\nmetrics_listen = \"{metrics}\"\n", data.display()),
    )
    .expect("write");
    let args: Vec<String> = vec!["--config".into(), config.display().to_string()];
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
    assert!(data.join("store").is_dir(), "the store is where the file says");
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

/// Scrapes `path` until it answers `status` (the agent reconnects on its own
/// schedule, backing off up to 5 s), or panics with the last answer after a
/// minute: a deadline for a busy machine, not a bound on the agent.
async fn until(addr: &str, path: &str, status: &str) -> String {
    let mut last = String::new();
    for _ in 0..1200 {
        last = get(addr, path).await;
        if last.starts_with(&format!("HTTP/1.1 {status}")) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{path} never answered {status}; last:\n{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_serves_its_gpus_and_session_and_is_ready_only_with_a_controller() {
    let tmp = tempfile::tempdir().expect("tmp");
    let port = free_port();
    let metrics = format!("127.0.0.1:{}", free_port());
    let work = tmp.path().join("work").display().to_string();
    let args: Vec<String> = [
        "--controller",
        &format!("http://127.0.0.1:{port}"),
        "--sim-gpus",
        "H100x2",
        "--sim-engines",
        "--docker",
        "off",
        "--work-dir",
        &work,
        "--metrics-listen",
        &metrics,
    ]
    .map(String::from)
    .to_vec();
    let mut agent = Proc::spawn_with(&bin("benchfleet-agent"), &args, &[], tmp.path().join("agent.log"));
    // No controller yet: alive, not ready, and it says why.
    until(&metrics, "/healthz", "200").await;
    let not_ready = get(&metrics, "/readyz").await;
    assert!(
        not_ready.starts_with("HTTP/1.1 503") && not_ready.contains("no session with the controller"),
        "{not_ready}"
    );
    let scraped = get(&metrics, "/metrics").await;
    assert!(scraped.contains("benchfleet_agent_session_connected 0"), "{scraped}");

    let data = tmp.path().join("data").display().to_string();
    let listen = format!("127.0.0.1:{port}");
    let controller_metrics = format!("127.0.0.1:{}", free_port());
    let cargs: Vec<String> =
        ["--listen", &listen, "--data-dir", &data, "--metrics-listen", &controller_metrics].map(String::from).to_vec();
    let _controller = Proc::spawn_with(&bin("benchfleet-controller"), &cargs, &[], tmp.path().join("controller.log"));
    until(&metrics, "/readyz", "200").await;
    let scraped = get(&metrics, "/metrics").await;
    for line in [
        "benchfleet_agent_session_connected 1",
        "benchfleet_agent_groups_running 0",
        "benchfleet_agent_leaving 0",
        "benchfleet_agent_gpu_probe_ok 1",
        "benchfleet_agent_gpu_usable{gpu=\"1\",",
        "benchfleet_agent_gpu_sm_clock_hertz{gpu=\"0\",",
        "benchfleet_agent_gpu_temperature_celsius{gpu=\"0\",",
        "benchfleet_agent_gpu_power_watts{gpu=\"0\",",
    ] {
        assert!(scraped.contains(line), "{line} missing:\n{scraped}");
    }
    // Every metric the Grafana dashboard queries is served by one of them.
    let mut served = exposed(&scraped);
    served.extend(exposed(&until(&controller_metrics, "/metrics", "200").await));
    let dashboard = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/benchfleet.json");
    let queried = crate::observe::dashboard_metrics(&dashboard);
    assert!(queried.len() >= 10, "{queried:?}");
    let missing: Vec<&String> = queried.iter().filter(|m| !served.contains(*m)).collect();
    assert!(missing.is_empty(), "the dashboard queries metrics no daemon serves: {missing:?}\n{served:?}");
    agent.signal(rustix::process::Signal::TERM);
    assert!(agent.exit(Duration::from_secs(15)).await.success(), "{}", agent.text());
}

/// The names an exposition serves: every sample's, and every family's from
/// its `# TYPE` line (a histogram is queried by its family's name).
fn exposed(text: &str) -> std::collections::BTreeSet<String> {
    let body = text.split_once("\r\n\r\n").map_or(text, |(_, body)| body);
    body.lines()
        .filter_map(|line| match line.strip_prefix("# TYPE ") {
            Some(family) => family.split_whitespace().next(),
            None if line.starts_with('#') => None,
            None => line.split(['{', ' ']).next(),
        })
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}
