//! Security on loopback: mutual TLS, identities from certificates, operator
//! roles, and the plain-text rule. Each refusal is checked on both sides:
//! the caller's error, and that the controller did not act (nothing stored,
//! no session). The full run uses the real binaries: `benchfleet certs
//! init`, a TLS controller, two simulated agents and the CLI as an admin.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use benchfleet_cli::client::{self, Target};
use benchfleet_controller::pki::{self, Ca, Role};
use benchfleet_controller::{Controller, ControllerConfig, SledStore, Store, serve};
use benchfleet_core::tls::ClientTls;
use benchfleet_proto as pb;
use tokio_stream::StreamExt as _;

use crate::faults::{Proc, bin};

/// `benchfleet --data-dir DATA certs init`, as an operator runs it; returns
/// the CA hash it printed.
fn certs_init(data: &Path) -> String {
    let out = Command::new(bin("benchfleet"))
        .args(["--data-dir", &data.display().to_string(), "certs", "init", "--san", "ctl.test"])
        .output()
        .expect("benchfleet runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "certs init: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().collect();
    let dir = data.join("pki");
    assert_eq!(
        lines[0],
        format!(
            "created {}/ (ca.pem, ca-key.pem, controller.pem, controller-key.pem, admin.pem, admin-key.pem, \
             ingest.key)",
            dir.display()
        )
    );
    let hash = lines[1].strip_prefix("CA hash: ").expect("the CA hash line");
    assert!(hash.starts_with("sha256:") && hash.len() == 71 && hash[7..].bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(lines.len(), 2, "{stdout}");
    hash.to_owned()
}

/// An agent joined as an operator would make it: `benchfleet token
/// create` as the admin, then `benchfleet-agent join` (on a blocking
/// thread: the controller may be served by this test's runtime). Returns
/// the token it joined with.
async fn join_agent(data: &Path, url: &str, work: &Path, name: &str) -> String {
    let (data, url, work, name) = (data.to_owned(), url.to_owned(), work.to_owned(), name.to_owned());
    tokio::task::spawn_blocking(move || {
        let d = data.display().to_string();
        let ca_hash = pki::ca_hash(&data.join("pki")).expect("the CA's hash");
        let (code, token, stderr) = run_cli("benchfleet", &["--data-dir", &d, "--controller", &url, "token", "create"]);
        assert_eq!(code, Some(0), "{stderr}");
        let w = work.display().to_string();
        let (code, _, stderr) = run_cli(
            "benchfleet-agent",
            &[
                "join",
                "--controller",
                &url,
                "--token",
                token.trim(),
                "--ca-hash",
                &ca_hash,
                "--name",
                &name,
                "--work-dir",
                &w,
            ],
        );
        assert_eq!(code, Some(0), "{stderr}");
        token.trim().to_owned()
    })
    .await
    .expect("joined")
}

/// An agent's identity directory as `join` leaves it, issued by the CA
/// offline (no agent id in it: good only where no controller is asked).
fn agent_identity(pki: &Path, work: &Path, name: &str) {
    let issued = Ca::load(pki).expect("the CA").issue(name, Role::Agent, pki::AGENT_LIFETIME, &[]).expect("issued");
    let dir = work.join("identity");
    pki::private_dir(&dir).expect("dir");
    pki::write_new(&dir.join("agent.pem"), issued.cert_pem.as_bytes(), false).expect("cert");
    pki::write_new(&dir.join("agent-key.pem"), issued.key_pem.expect("a key").as_bytes(), true).expect("key");
    std::fs::copy(pki.join("ca.pem"), dir.join("ca.pem")).expect("ca");
}

/// A controller served in-process over TLS on 127.0.0.1, with the PKI of
/// `data/pki`.
struct TlsController {
    url: String,
    store: Arc<dyn Store>,
    controller: Arc<Controller>,
}

impl TlsController {
    /// A new PKI (`certs init`) in a temporary directory's `data/`, and a
    /// controller over it.
    async fn fresh() -> (tempfile::TempDir, PathBuf, TlsController) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tmp = tempfile::tempdir().expect("tmp");
        let data = tmp.path().join("data");
        certs_init(&data);
        let c = TlsController::start(&data).await;
        (tmp, data, c)
    }

    async fn start(data: &Path) -> TlsController {
        let store: Arc<dyn Store> = Arc::new(SledStore::open(&data.join("store")).expect("store"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("https://127.0.0.1:{}", listener.local_addr().expect("addr").port());
        let dir = data.join("pki");
        let mut config = ControllerConfig::new(url.clone());
        let tls =
            pki::ServerTls::read(&dir.join("controller.pem"), &dir.join("controller-key.pem"), &dir.join("ca.pem"))
                .expect("TLS files");
        config.secure(tls, &dir).expect("the PKI");
        let controller = Controller::start(store.clone(), config).expect("controller");
        tokio::spawn(serve(controller.clone(), listener, std::future::pending()));
        TlsController { url, store, controller }
    }

    fn target(&self, tls: ClientTls) -> Target {
        Target { url: self.url.clone(), tls }
    }
}

impl Drop for TlsController {
    fn drop(&mut self) {
        self.controller.shutdown.cancel();
    }
}

/// A `benchfleet-controller` process over TLS from `data/pki` on a free
/// loopback port, with short leases; its URL once it listens.
async fn controller_process(data: &Path, log: PathBuf, extra: &[&str]) -> (Proc, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
    let listen = format!("127.0.0.1:{port}");
    let mut args: Vec<String> = [
        "--listen",
        &listen,
        "--data-dir",
        &data.display().to_string(),
        "--metrics-listen",
        "off",
        "--heartbeat-interval-ms",
        "200",
        "--suspect-after-ms",
        "600",
        "--lease-ttl-ms",
        "2000",
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let proc = Proc::spawn_with(&bin("benchfleet-controller"), &args, &[], log);
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(&listen).await.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    (proc, format!("https://127.0.0.1:{port}"))
}

fn identity(dir: &Path, name: &str) -> ClientTls {
    ClientTls::from_dir(dir, name).expect("readable")
}

/// The CA alone: a client that verifies the controller but presents nothing.
fn ca_only(data: &Path) -> ClientTls {
    ClientTls { identity: None, ..identity(&data.join("pki"), "admin") }
}

/// A small ShareGPT file: the agents fetch it by hash over their session.
fn chats(dir: &Path) {
    let convs: Vec<String> = (0..80)
        .map(|i| {
            format!(
                r#"{{"conversations":[{{"from":"human","value":"question {i} about the weather in town"}},{{"from":"gpt","value":"answer {i}: it is sunny with a light wind from the west today"}}]}}"#
            )
        })
        .collect();
    std::fs::write(dir.join("chats.json"), format!("[{}]", convs.join(","))).expect("dataset");
}

fn matrix(dir: &Path) -> PathBuf {
    chats(dir);
    let path = dir.join("tls.yaml");
    std::fs::write(
        &path,
        "name: tls
model: Qwen/Qwen3.5-9B
hardware: { gpu: H200, gpus_per_job: 1 }
engines:
  vllm: { runtime: process, args: [--max-model-len=4096] }
variants:
  small: { args: [--max-num-seqs=64] }
profiles:
  load:
    dataset: { random: { input_tokens: 64, output_tokens: 16, seed: 1 } }
    rate: 40
    requests: 60
  chat:
    dataset: { sharegpt: chats.json }
    rate: 40
    requests: 40
",
    )
    .expect("matrix");
    path
}

async fn list_runs(target: &Target) -> Result<usize, tonic::Status> {
    let mut c = client::connect(target).await.map_err(|e| tonic::Status::unavailable(format!("{e:#}")))?;
    Ok(c.list_runs(pb::ListRunsRequest {}).await?.into_inner().runs.len())
}

async fn submit(target: &Target, dir: &Path) -> Result<pb::SubmitRunResponse, String> {
    let mut c = client::connect(target).await.map_err(|e| format!("{e:#}"))?;
    let sub = client::submission(&matrix(dir), None).expect("a valid matrix");
    client::submit(&mut c, sub).await.map_err(|e| format!("{e:#}"))
}

fn refused(r: Result<usize, tonic::Status>, code: tonic::Code, words: &str) {
    match r {
        Ok(n) => panic!("accepted ({n} runs listed); expected {code:?}: {words}"),
        Err(s) => {
            assert_eq!(s.code(), code, "{s:?}");
            assert!(s.message().contains(words), "{:?} does not say {words:?}", s.message());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_are_who_their_certificates_say_and_may_do_what_their_role_allows() {
    let (tmp, data, c) = TlsController::fresh().await;
    let pki = data.join("pki");

    // An admin lists and submits.
    let admin = c.target(identity(&pki, "admin"));
    assert_eq!(list_runs(&admin).await.expect("admin lists"), 0);

    // No certificate: refused, naming what is needed.
    refused(list_runs(&c.target(ca_only(&data))).await, tonic::Code::Unauthenticated, "needs a client certificate");

    // A read operator lists, and may not submit: nothing is stored.
    let alice = tmp.path().join("alice");
    pki::issue_operator(&pki, "alice", Role::Read, &alice).expect("issued");
    let read = c.target(identity(&alice, "operator"));
    assert_eq!(list_runs(&read).await.expect("read lists"), 0);
    let e = submit(&read, tmp.path()).await.expect_err("a read operator may not submit");
    assert!(e.contains("read-only operator 'alice' may not call"), "{e}");
    assert!(c.store.runs().expect("runs").is_empty(), "nothing was stored");

    // An agent's certificate opens no operator call.
    let work = tmp.path().join("gpu-1");
    join_agent(&data, &c.url, &work, "gpu-1").await;
    let agent = c.target(identity(&work.join("identity"), "agent"));
    let e = submit(&agent, tmp.path()).await.expect_err("an agent may not submit");
    assert!(e.contains("agent 'gpu-1' may not call"), "{e}");
    refused(list_runs(&agent).await, tonic::Code::PermissionDenied, "needs an operator's certificate");

    // A certificate of another CA: the handshake fails.
    let other = tmp.path().join("other");
    pki::init(&other.join("pki"), "h", &[]).expect("another CA");
    let foreign = ClientTls { ca: ca_only(&data).ca, ..identity(&other.join("pki"), "admin") };
    assert!(list_runs(&c.target(foreign)).await.is_err(), "another CA's certificate is refused");

    // An expired certificate of the right CA: the handshake fails too.
    let expired = tmp.path().join("expired");
    expired_operator(&pki, &expired);
    assert!(list_runs(&c.target(identity(&expired, "operator"))).await.is_err(), "an expired certificate is refused");

    // The admin submits; the note of a cancel names the certificate, not
    // what the client says.
    let run = submit(&admin, tmp.path()).await.expect("the admin submits").run_id;
    let mut op = client::connect(&admin).await.expect("connect");
    op.cancel_run(pb::CancelRunRequest { run_id: run.clone(), by: "mallory".into(), reason: "test".into() })
        .await
        .expect("cancelled");
    let stored = c.store.run(run.parse().expect("id")).expect("read").expect("stored");
    let note = format!("{stored:?}");
    assert!(note.contains("by: \"admin\"") && !note.contains("mallory"), "{note}");
}

/// An operator identity whose certificate expired an hour ago.
fn expired_operator(pki: &Path, out: &Path) {
    let ca_pem = std::fs::read_to_string(pki.join("ca.pem")).expect("ca");
    let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(pki.join("ca-key.pem")).expect("key")).expect("key");
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).expect("issuer");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::OrganizationalUnitName, "admin");
    params.distinguished_name.push(rcgen::DnType::CommonName, "late");
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(2);
    params.not_after = now - time::Duration::hours(1);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).expect("signed");
    std::fs::create_dir_all(out).expect("dir");
    std::fs::write(out.join("operator.pem"), cert.pem()).expect("cert");
    std::fs::write(out.join("operator-key.pem"), key.serialize_pem()).expect("key");
    std::fs::write(out.join("ca.pem"), ca_pem).expect("ca");
}

/// Opens an agent session with `hello`; the controller's answer.
async fn hello(target: &Target, name: &str) -> Result<pb::ControllerMessage, tonic::Status> {
    let (_session, first) = session(target, name).await?;
    Ok(first)
}

/// An agent's session as `name` (one H200, the process runtime): the
/// session and the controller's first answer.
async fn session(target: &Target, name: &str) -> Result<(Session, pb::ControllerMessage), tonic::Status> {
    let channel = benchfleet_core::tls::endpoint(&target.url, &target.tls)
        .expect("endpoint")
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut agent = pb::agent_service_client::AgentServiceClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let hello = pb::Hello {
        name: name.to_owned(),
        hostname: name.to_owned(),
        instance: name.to_owned(),
        gpus: vec![pb::Gpu {
            index: 0,
            uuid: format!("GPU-{name}"),
            name: "NVIDIA H200".into(),
            usable: true,
            ..Default::default()
        }],
        runtimes: vec!["process".into()],
        ..Default::default()
    };
    tx.send(pb::AgentMessage { msg: Some(pb::agent_message::Msg::Hello(hello)) }).await.expect("queued");
    let mut rx = agent.session(tokio_stream::wrappers::ReceiverStream::new(rx)).await?.into_inner();
    let first = rx.next().await.ok_or_else(|| tonic::Status::unknown("no answer"))??;
    Ok((Session { tx, rx }, first))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_is_the_agent_its_certificate_names() {
    let (tmp, data, c) = TlsController::fresh().await;
    let pki = data.join("pki");
    let work = tmp.path().join("gpu-a");
    join_agent(&data, &c.url, &work, "gpu-a").await;
    let agent = c.target(identity(&work.join("identity"), "agent"));

    // A hello naming another agent is refused, and no agent is registered.
    let e = hello(&agent, "gpu-b").await.expect_err("refused");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("this certificate is agent 'gpu-a's; a hello may not name 'gpu-b'"), "{e:?}");
    // Without a certificate, or with an operator's, no session opens.
    let e = hello(&c.target(ca_only(&data)), "gpu-a").await.expect_err("no certificate");
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = hello(&c.target(identity(&pki, "admin")), "gpu-a").await.expect_err("an operator");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let agents = c.store.agents().expect("agents");
    assert!(agents.len() == 1 && agents[0].connected_unix_ms == 0, "only the join's record: {agents:?}");
    // A certificate the CA made without an agent id (not by join) opens no
    // session.
    let offline = tmp.path().join("offline");
    agent_identity(&pki, &offline, "gpu-a");
    let e = hello(&c.target(identity(&offline.join("identity"), "agent")), "gpu-a").await.expect_err("no id");
    assert!(e.message().contains("carries no agent id: join it again"), "{e:?}");

    // Its own name is welcomed.
    let welcome = hello(&agent, "gpu-a").await.expect("welcomed");
    assert!(matches!(welcome.msg, Some(pb::controller_message::Msg::Welcome(_))), "{welcome:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_text_is_refused_where_it_would_cross_a_network() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");

    // The controller: a non-loopback address without TLS exits before it
    // binds or opens its store.
    let out = Command::new(bin("benchfleet-controller"))
        .args(["--listen", "0.0.0.0:0", "--data-dir", &data.display().to_string(), "--metrics-listen", "off"])
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("refusing to serve 0.0.0.0:0 in plain text: give --tls-cert, --tls-key and --client-ca"));
    assert!(!data.join("store").exists(), "nothing was opened");
    // TLS files named but missing: the same, naming the file.
    let out = Command::new(bin("benchfleet-controller"))
        .args(["--listen", "127.0.0.1:0", "--data-dir", &data.display().to_string(), "--tls-cert", "/nonexistent.pem"])
        .stdin(Stdio::null())
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.pem is missing"));

    // Clients: http:// to another host needs --insecure; nothing is sent.
    let e = client::connect("http://10.255.255.1:7070").await.expect_err("refused").to_string();
    assert!(e.contains("refusing to talk to 10.255.255.1 in plain text"), "{e}");
    let out = Command::new(bin("benchfleet"))
        .args(["--controller", "http://10.255.255.1:7070", "runs"])
        .env("BENCHFLEET_DATA_DIR", &data)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2), "bad input, not an unreachable controller");
    let out = Command::new(bin("benchfleet-loadgen"))
        .args(["--base-url", "http://127.0.0.1:9", "--model", "m", "--num-prompts", "1"])
        .args(["--report-to", "http://10.255.255.1:7070", "--run-id", "1", "--job", "1", "--attempt", "1"])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--report-to: refusing to talk to 10.255.255.1 in plain text")
    );

    // https:// to a plain-text listener fails; it never falls back.
    let store: Arc<dyn Store> = Arc::new(SledStore::open(&tmp.path().join("plain")).expect("store"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let plain = Controller::start(store.clone(), ControllerConfig::new(format!("http://127.0.0.1:{port}"))).expect("c");
    tokio::spawn(serve(plain.clone(), listener, std::future::pending()));
    certs_init(&data);
    let https = Target { url: format!("https://127.0.0.1:{port}"), tls: identity(&data.join("pki"), "admin") };
    assert!(list_runs(&https).await.is_err(), "https to a plain listener fails");
    assert_eq!(list_runs(&Target::plain(format!("http://127.0.0.1:{port}"))).await.expect("plain works"), 0);
    let e = submit(&https, tmp.path()).await.expect_err("nothing submitted");
    assert!(e.contains("cannot reach the controller"), "{e}");
    assert!(store.runs().expect("runs").is_empty());
    plain.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_a_certificate_or_under_another_name_does_not_start() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    certs_init(&data);
    let work = tmp.path().join("w");
    let run = |extra: &[&str]| {
        Command::new(bin("benchfleet-agent"))
            .args(["--controller", "https://127.0.0.1:9", "--sim-gpus", "H200x1", "--sim-engines", "--docker", "off"])
            .args(["--work-dir", &work.display().to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .expect("runs")
    };
    let out = run(&[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "no agent certificate in {}: run `benchfleet-agent join",
            work.join("identity").display()
        )),
        "{stderr}"
    );
    agent_identity(&data.join("pki"), &work, "gpu-a");
    let out = run(&["--name", "gpu-b"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--name gpu-b: this agent's certificate"), "{stderr}");
    assert!(stderr.contains("names it 'gpu-a'"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_over_mutual_tls_with_two_agents_succeeds_and_no_secret_is_logged() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    certs_init(&data);
    let pki = data.join("pki");
    let (controller, url) = controller_process(&data, tmp.path().join("controller.log"), &[]).await;
    let hf_token = "hf_FAKEtokenThatMustNeverBeLogged";
    let token_file = tmp.path().join("hf");
    std::fs::write(&token_file, hf_token).expect("token");
    let mut agents = Vec::new();
    let mut tokens = Vec::new();
    for name in ["gpu-a", "gpu-b"] {
        let work = tmp.path().join(name);
        tokens.push(join_agent(&data, &url, &work, name).await);
        let args: Vec<String> =
            ["--controller", &url, "--sim-gpus", "H200x1", "--sim-engines", "--docker", "off", "--work-dir"]
                .map(String::from)
                .into_iter()
                .chain([work.display().to_string()])
                .collect();
        agents.push(Proc::spawn_with(
            &bin("benchfleet-agent"),
            &args,
            &[("HF_TOKEN", Path::new(hf_token))],
            tmp.path().join(format!("{name}.log")),
        ));
    }
    // The CLI as the admin `certs init` made (found in DATA/pki).
    let out = tokio::task::spawn_blocking({
        let (data, url, matrix) = (data.clone(), url.clone(), matrix(tmp.path()));
        move || {
            Command::new(bin("benchfleet"))
                .args(["--data-dir", &data.display().to_string(), "--controller", &url, "run"])
                .arg(&matrix)
                .stdin(Stdio::null())
                .output()
                .expect("runs")
        }
    })
    .await
    .expect("joined");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}\ncontroller:\n{}", controller.text());
    assert!(stdout.contains("Serving Benchmark Result"), "{stdout}");
    // Both agents ran a group, over their certificates.
    let text = controller.text();
    for name in ["gpu-a", "gpu-b"] {
        assert!(text.contains(&format!("name={name}")), "{name} never held a session:\n{text}");
    }
    // No key, nor the token, in any log or output.
    let mut logs = vec![controller.text(), stdout.into_owned(), stderr.into_owned()];
    logs.extend(agents.iter().map(Proc::text));
    let keys: Vec<String> = ["ca-key.pem", "controller-key.pem", "admin-key.pem"]
        .iter()
        .map(|k| std::fs::read_to_string(pki.join(k)).expect("key"))
        .collect();
    for log in &logs {
        assert!(!log.contains(hf_token), "HF_TOKEN in a log");
        for token in &tokens {
            let secret = token.split_once('.').map_or(token.as_str(), |(_, s)| s);
            assert!(!log.contains(secret), "a join token's secret in a log");
        }
        assert!(!log.contains("PRIVATE KEY"), "a key in a log");
        for key in &keys {
            let body: String = key.lines().nth(1).unwrap_or_default().to_owned();
            assert!(!log.contains(&body), "a key's text in a log");
        }
    }
}

fn run_cli(program: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin(program)).args(args).stdin(Stdio::null()).output().expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_joins_with_a_token_and_a_revoked_one_is_cut_off() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let ca_hash = certs_init(&data);
    let d = data.display().to_string();
    let (controller, url) = controller_process(&data, tmp.path().join("controller.log"), &[]).await;

    // A token through the controller, as an admin: the token alone on
    // stdout, the expiry and the join command on stderr.
    let (code, stdout, stderr) =
        run_cli("benchfleet", &["--data-dir", &d, "--controller", &url, "token", "create", "--ttl", "1h"]);
    assert_eq!(code, Some(0), "{stderr}");
    let token = stdout.trim().to_owned();
    let (id, secret) = token.split_once('.').expect("ID.SECRET");
    assert!(id.len() == 6 && secret.len() == 16, "{token}");
    assert!(token.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.'), "{token}");
    assert_eq!(stdout, format!("{token}\n"));
    assert!(stderr.starts_with("expires 20") && stderr.contains("; 1 use by any agent\n"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "on the agent: benchfleet-agent join --controller {url} --token {token} --ca-hash {ca_hash}"
        )),
        "{stderr}"
    );

    // A wrong CA hash: refused before anything is sent.
    let work = tmp.path().join("gpu-j");
    let w = work.display().to_string();
    let wrong = format!("sha256:{}", "0".repeat(64));
    let (code, _, stderr) = run_cli(
        "benchfleet-agent",
        &["join", "--controller", &url, "--token", &token, "--ca-hash", &wrong, "--name", "gpu-j", "--work-dir", &w],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("has --ca-hash sha256:000"), "{stderr}");
    assert!(!work.join("identity/agent.pem").exists());

    // The join: the key is made here, the certificate stored 0600.
    let join = |token: &str, name: &str, work: &str| {
        run_cli(
            "benchfleet-agent",
            &[
                "join",
                "--controller",
                &url,
                "--token",
                token,
                "--ca-hash",
                &ca_hash,
                "--name",
                name,
                "--work-dir",
                work,
            ],
        )
    };
    let (code, stdout, stderr) = join(&token, "gpu-j", &w);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.starts_with(&format!(
            "joined as 'gpu-j': {} holds its certificate (until 20",
            work.join("identity").display()
        )),
        "{stdout}"
    );
    use std::os::unix::fs::PermissionsExt as _;
    for file in ["agent.pem", "agent-key.pem", "ca.pem"] {
        let mode = std::fs::metadata(work.join("identity").join(file)).expect("stored").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{file}");
    }
    let (code, stdout, _) = join(&token, "gpu-j", &w);
    assert_eq!(code, Some(0));
    assert!(stdout.starts_with("already joined as 'gpu-j'"), "{stdout}");
    // The token is spent; an unknown one is refused; the secret is never
    // echoed.
    let other = tmp.path().join("gpu-k").display().to_string();
    let (code, _, stderr) = join(&token, "gpu-k", &other);
    assert_eq!(code, Some(1));
    assert!(stderr.contains(&format!("join token {id} has been used")) && !stderr.contains(secret), "{stderr}");
    let (code, _, stderr) = join("aaaaaa.bbbbbbbbbbbbbbbb", "gpu-k", &other);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("join token aaaaaa is not known here"), "{stderr}");
    let (code, short, stderr) =
        run_cli("benchfleet", &["--data-dir", &d, "--controller", &url, "token", "create", "--ttl", "1s"]);
    assert_eq!(code, Some(0), "{stderr}");
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let (code, _, stderr) = join(short.trim(), "gpu-k", &other);
    assert_eq!(code, Some(1));
    assert!(stderr.contains(&format!("join token {} has expired", &short[..6])), "{stderr}");

    // The joined agent runs under its certificate.
    let args: Vec<String> =
        ["--controller", &url, "--sim-gpus", "H200x1", "--sim-engines", "--docker", "off", "--work-dir", &w]
            .map(String::from)
            .to_vec();
    let agent = Proc::spawn_with(&bin("benchfleet-agent"), &args, &[], tmp.path().join("agent.log"));
    let admin = Target { url: url.clone(), tls: identity(&data.join("pki"), "admin") };
    let state = |admin: Target| async move {
        let mut c = client::connect(&admin).await.ok()?;
        let agents = c.list_agents(pb::ListAgentsRequest {}).await.ok()?.into_inner().agents;
        agents.iter().find(|a| a.name == "gpu-j").map(|a| a.state.clone())
    };
    let mut ready = false;
    for _ in 0..150 {
        if state(admin.clone()).await.as_deref() == Some("ready") {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(ready, "the joined agent never became ready:\n{}\n{}", agent.text(), controller.text());

    // Revoked: its live session ends, and it cannot open another.
    let (code, stdout, stderr) =
        run_cli("benchfleet", &["--data-dir", &d, "--controller", &url, "revoke", "gpu-j", "--reason", "re-imaged"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("revoked every certificate of 'gpu-j' issued until now (1 live"), "{stdout}");
    let mut cut = false;
    for _ in 0..100 {
        if state(admin.clone()).await.is_some_and(|s| s != "ready") {
            cut = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(cut, "the revoked agent still holds a lease:\n{}", controller.text());
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let text = controller.text();
    assert!(text.contains("ending session: its certificate was revoked by admin"), "{text}");
    assert!(text.contains("is revoked"), "a new session is refused:\n{text}");
    assert!(!text.contains(secret), "the token's secret in the controller's log");

    // The name may join again (a re-imaged host): it is a new agent, with
    // an id of its own; the revoked one keeps its record and its note.
    join_agent(&data, &url, &tmp.path().join("gpu-j-again"), "gpu-j").await;
    let mut c = client::connect(&admin).await.expect("connect");
    let agents = c.list_agents(pb::ListAgentsRequest {}).await.expect("agents").into_inner().agents;
    let ids: Vec<&str> = agents.iter().filter(|a| a.name == "gpu-j").map(|a| a.agent_id.as_str()).collect();
    assert_eq!(ids.len(), 2, "{agents:?}");
    assert_ne!(ids[0], ids[1]);
    // The operator's listing says which was revoked, by whom and why, and
    // until when the other's certificate holds.
    let (code, listing, stderr) = run_cli("benchfleet", &["--data-dir", &d, "--controller", &url, "agents"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(listing.contains("  revoked by admin: re-imaged"), "{listing}");
    assert!(listing.contains("  certificate until 20"), "{listing}");
    drop(agent);
}

/// Sends one record batch of `attempt` under `token`; the controller's
/// answer.
async fn send_batch(
    target: &Target,
    attempt: pb::AttemptRef,
    token: Option<&str>,
) -> Result<pb::RecordAck, tonic::Status> {
    let channel = benchfleet_core::tls::endpoint(&target.url, &target.tls)
        .expect("endpoint")
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut ingest = pb::ingest_service_client::IngestServiceClient::new(channel);
    let batch = pb::RecordBatch { attempt: Some(attempt), batch: 0, sent: 1, ..Default::default() };
    let mut request = tonic::Request::new(tokio_stream::iter(vec![batch]));
    if let Some(token) = token {
        request.metadata_mut().insert("x-benchfleet-ingest-token", token.parse().expect("ascii"));
    }
    let mut acks = ingest.records(request).await?.into_inner();
    acks.next().await.unwrap_or_else(|| Err(tonic::Status::unknown("no ack")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_need_their_own_attempt_s_credential() {
    let (_tmp, data, c) = TlsController::fresh().await;
    // Ingest needs no certificate: loadgen holds only the CA and the token.
    let loadgen = c.target(ca_only(&data));
    let key = c.controller.config.ingest_key.clone().expect("a key under TLS");
    let attempt = |job: u64| pb::AttemptRef { run_id: "1".into(), job, attempt: 1, epoch: 1 };
    let mine = key.sign("1", 1, 1, 1);

    let e = send_batch(&loadgen, attempt(1), None).await.expect_err("no credential");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("need their attempt's ingest credential"), "{e:?}");
    let e = send_batch(&loadgen, attempt(2), Some(&mine)).await.expect_err("another attempt's credential");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert_eq!(e.message(), "the ingest credential is not this batch's attempt's");
    let e = send_batch(&loadgen, attempt(1), Some("00")).await.expect_err("a made-up credential");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    // Its own credential, for an attempt that is not running: stale, and
    // the refusal names no other attempt or epoch.
    let e = send_batch(&loadgen, attempt(1), Some(&mine)).await.expect_err("no such attempt runs");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(!e.message().contains("current"), "{e:?}");
    let key = benchfleet_study::model::AttemptKey { run: "1".parse().expect("id"), job: 2, attempt: 1 };
    assert_eq!(c.store.records(&key).count(), 0, "nothing was stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_fetches_only_the_files_its_own_groups_name() {
    let (tmp, data, c) = TlsController::fresh().await;
    let pki = data.join("pki");
    // The admin uploads a run's files (the run waits: no agent has GPUs).
    let run = submit(&c.target(identity(&pki, "admin")), tmp.path()).await.expect("submitted");
    assert!(!run.run_id.is_empty());
    let sha = {
        use sha2::Digest as _;
        let bytes = std::fs::read(tmp.path().join("chats.json")).expect("dataset");
        sha2::Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    assert!(c.store.has_file(&sha).expect("store"), "the dataset was uploaded");
    // An agent that runs none of its jobs may not fetch it.
    let work = tmp.path().join("gpu-a");
    join_agent(&data, &c.url, &work, "gpu-a").await;
    let agent = c.target(identity(&work.join("identity"), "agent"));
    let channel =
        benchfleet_core::tls::endpoint(&agent.url, &agent.tls).expect("endpoint").connect().await.expect("tls");
    let mut client = pb::agent_service_client::AgentServiceClient::new(channel);
    let e = match client.fetch_file(pb::FetchFileRequest { sha256: sha.clone() }).await {
        Err(e) => e,
        Ok(stream) => stream.into_inner().next().await.expect("an answer").expect_err("refused"),
    };
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("agent 'gpu-a' runs no job that names the file"), "{e:?}");
}

/// The state of agent `name` as the admin lists it.
async fn agent_state(admin: &Target, name: &str) -> Option<String> {
    let mut c = client::connect(admin).await.ok()?;
    let agents = c.list_agents(pb::ListAgentsRequest {}).await.ok()?.into_inner().agents;
    agents.iter().find(|a| a.name == name).map(|a| a.state.clone())
}

async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{what}: not within 20 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_renews_its_certificate_and_outlives_the_first() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    certs_init(&data);
    // Certificates of 12 s: renewed at 8 s, so that a restarted agent has
    // seconds to spare with the renewed one on a busy machine.
    let (controller, url) =
        controller_process(&data, tmp.path().join("controller.log"), &["--agent-identity-lifetime-s", "12"]).await;
    let work = tmp.path().join("gpu-r");
    join_agent(&data, &url, &work, "gpu-r").await;
    let w = work.display().to_string();
    let serial = |work: &Path| identity(&work.join("identity"), "agent").peer().expect("a cert").expect("readable");
    let first = serial(&work);
    let args: Vec<String> =
        ["--controller", &url, "--sim-gpus", "H200x1", "--sim-engines", "--docker", "off", "--work-dir", &w]
            .map(String::from)
            .to_vec();
    let agent = Proc::spawn_with(&bin("benchfleet-agent"), &args, &[], tmp.path().join("agent-1.log"));
    let admin = Target { url: url.clone(), tls: identity(&data.join("pki"), "admin") };
    until("ready", async || agent_state(&admin, "gpu-r").await.as_deref() == Some("ready")).await;
    until("renewed", async || serial(&work).serial != first.serial).await;
    let renewed = serial(&work);
    assert!(renewed.not_after_unix > first.not_after_unix && renewed.name == "gpu-r");
    assert!(controller.text().contains("agent certificate renewed"), "{}", controller.text());
    // Past the first certificate's life, a restarted agent comes back with
    // the renewed one.
    drop(agent);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() as i64;
    tokio::time::sleep(std::time::Duration::from_secs(u64::try_from(first.not_after_unix + 1 - now).unwrap_or(0)))
        .await;
    let agent = Proc::spawn_with(&bin("benchfleet-agent"), &args, &[], tmp.path().join("agent-2.log"));
    until("ready again", async || agent_state(&admin, "gpu-r").await.as_deref() == Some("ready")).await;
    drop(agent);
}

/// An agent's open session: what it sends, what it is told.
struct Session {
    tx: tokio::sync::mpsc::Sender<pb::AgentMessage>,
    rx: tonic::Streaming<pb::ControllerMessage>,
}

async fn open_session(target: &Target, name: &str) -> Session {
    let (session, welcome) = session(target, name).await.expect("a session");
    assert!(matches!(welcome.msg, Some(pb::controller_message::Msg::Welcome(_))), "{welcome:?}");
    session
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cannot_report_for_another_agent_s_job() {
    let (tmp, data, c) = TlsController::fresh().await;
    let mut sessions = Vec::new();
    for name in ["gpu-a", "gpu-b"] {
        let work = tmp.path().join(name);
        join_agent(&data, &c.url, &work, name).await;
        sessions.push(open_session(&c.target(identity(&work.join("identity"), "agent")), name).await);
    }
    let admin = c.target(identity(&data.join("pki"), "admin"));
    let run = submit(&admin, tmp.path()).await.expect("submitted").run_id;
    // One of them is given a group; the other reports that group's first
    // job as failed.
    let (owner, assigned) = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let [a, b] = &mut sessions[..] else { unreachable!() };
        loop {
            tokio::select! {
                Some(Ok(m)) = a.rx.next() => if let Some(pb::controller_message::Msg::AssignGroup(g)) = m.msg { break (0, g) },
                Some(Ok(m)) = b.rx.next() => if let Some(pb::controller_message::Msg::AssignGroup(g)) = m.msg { break (1, g) },
            }
        }
    })
    .await
    .expect("a group is assigned");
    let attempt = assigned.jobs[0].attempt.clone().expect("an attempt");
    let job = attempt.job;
    let other = &sessions[1 - owner];
    let forged = pb::JobUpdate {
        attempt: Some(attempt),
        state: pb::JobState::Failed as i32,
        error: "forged".into(),
        failure: pb::FailureKind::Config as i32,
        ..Default::default()
    };
    other.tx.send(pb::AgentMessage { msg: Some(pb::agent_message::Msg::JobUpdate(forged)) }).await.expect("sent");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let mut op = client::connect(&admin).await.expect("connect");
    let jobs = op.list_jobs(pb::ListJobsRequest { run_id: run.clone() }).await.expect("jobs").into_inner().jobs;
    let j = jobs.iter().find(|j| j.job == job).expect("the job");
    assert_ne!(j.state, "failed", "another agent's report changed the job: {j:?}");
    assert!(!format!("{j:?}").contains("forged"), "{j:?}");
    // The same report from the agent that runs it is taken.
    let own = pb::JobUpdate {
        attempt: assigned.jobs[0].attempt.clone(),
        state: pb::JobState::Failed as i32,
        error: "its own".into(),
        failure: pb::FailureKind::Config as i32,
        ..Default::default()
    };
    sessions[owner]
        .tx
        .send(pb::AgentMessage { msg: Some(pb::agent_message::Msg::JobUpdate(own)) })
        .await
        .expect("sent");
    let mut failed = false;
    for _ in 0..50 {
        let jobs = op.list_jobs(pb::ListJobsRequest { run_id: run.clone() }).await.expect("jobs").into_inner().jobs;
        if jobs.iter().any(|j| j.job == job && j.state == "failed") {
            failed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(failed, "the owner's report was not taken either: the test shows nothing");
    // Had the forged report been taken, the job would have failed with its
    // words, and the owner's would have changed nothing.
    let jobs = op.list_jobs(pb::ListJobsRequest { run_id: run }).await.expect("jobs").into_inner().jobs;
    let j = jobs.iter().find(|j| j.job == job).expect("the job");
    assert!(j.error.contains("its own") && !j.error.contains("forged"), "{j:?}");
}

/// A simulated agent process on a plain loopback controller, with `extra`
/// flags (its engine policy is the default unless they say otherwise).
fn policy_agent(dir: &Path, name: &str, url: &str, extra: &[&str]) -> Proc {
    let work = dir.join(name).display().to_string();
    let mut args: Vec<String> =
        ["--controller", url, "--name", name, "--sim-gpus", "H200x1", "--work-dir", &work].map(String::from).to_vec();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    Proc::spawn_with(&bin("benchfleet-agent"), &args, &[], dir.join(format!("{name}.log")))
}

fn one_engine(dir: &Path, engine: &str) -> PathBuf {
    let path = dir.join("policy.yaml");
    std::fs::write(
        &path,
        format!(
            "name: policy
model: Qwen/Qwen3.5-9B
hardware: {{ gpu: H200, gpus_per_job: 1 }}
engines:
  vllm: {engine}
profiles:
  load:
    dataset: {{ random: {{ input_tokens: 64, output_tokens: 16, seed: 1 }} }}
    rate: 10
    requests: 10
"
        ),
    )
    .expect("matrix");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_runs_only_the_engines_its_policy_allows() {
    let tmp = tempfile::tempdir().expect("tmp");
    let c = crate::faults::Controller::start(tmp.path());
    let url = c.url();
    // Without --sim-engines or `process = true`, local commands are not
    // offered: a process engine is never placed, and the run says why.
    let _plain = policy_agent(tmp.path(), "gpu-p", &url, &["--docker", "off"]);
    crate::faults::ready(&url, &["gpu-p"]).await;
    let run =
        crate::faults::submit(&url, &one_engine(tmp.path(), "{ runtime: process, args: [--max-model-len=4096] }"))
            .await;
    assert_eq!(run.warnings, ["no agent runs engines with the process runtime"]);
    let mut op = client::connect(url.as_str()).await.expect("connect");
    op.cancel_run(pb::CancelRunRequest { run_id: run.run_id, reason: String::new(), by: String::new() })
        .await
        .expect("cancelled");

    // An image off the agent's list fails as the configuration's fault on
    // its first attempt, before any pull, naming the key that allows it.
    let _docker = policy_agent(tmp.path(), "gpu-d", &url, &["--sim-engines", "--docker", "on"]);
    crate::faults::ready(&url, &["gpu-d"]).await;
    let run =
        crate::faults::submit(&url, &one_engine(tmp.path(), "{ runtime: docker, image: \"evil/miner:latest\" }")).await;
    let last = crate::faults::finished(&url, &run.run_id).await;
    assert_eq!(last.state, "finished with failures");
    let jobs = op.list_jobs(pb::ListJobsRequest { run_id: run.run_id }).await.expect("jobs").into_inner().jobs;
    let job = &jobs[0];
    assert_eq!((job.state.as_str(), job.attempts.len()), ("failed", 1), "{job:?}");
    assert!(
        job.error.contains("image 'evil/miner:latest' is not allowed on this agent: add it to [engines] images"),
        "{job:?}"
    );
}
