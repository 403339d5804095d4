//! Record batches across controller crashes: the real `benchfleet-controller`
//! is killed with SIGKILL again and again while a sender streams record
//! batches of one attempt into its ingest service and sends again every
//! batch not yet acknowledged, as loadgen does. A fake agent (the real
//! session protocol) holds the attempt and claims it again after each
//! restart. Afterwards the store must hold every batch once and count each
//! once: its records are exactly the batches sent, and the attempt's stats
//! agree with them.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use benchfleet_controller::Store as _;
use benchfleet_proto as pb;
use benchfleet_study::model::{AttemptKey, RunId};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::faults::Controller;

const ROUNDS: usize = 20;

const MATRIX: &str = "\
name: crash
model: m
hardware: { gpu: H200, gpus_per_job: 1 }
engines:
  vllm: { runtime: process }
profiles:
  p: { dataset: { random: { input_tokens: 8, output_tokens: 4 } }, requests: 1000000 }
";

/// splitmix64: the test's random delays and batch sizes, from a seed it
/// prints.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

async fn channel(url: &str) -> Option<Channel> {
    Channel::from_shared(url.to_owned()).expect("url").connect().await.ok()
}

/// A fake agent's session: heartbeats on a task until dropped.
struct Session {
    tx: mpsc::Sender<pb::AgentMessage>,
    messages: tonic::Streaming<pb::ControllerMessage>,
    welcome: pb::Welcome,
    heartbeats: tokio::task::JoinHandle<()>,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}

/// Says hello (claiming `running`) until a controller at `url` answers.
async fn session(url: &str, running: Vec<pb::GroupClaim>) -> Session {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "no controller answered a hello at {url}");
        let Some(ch) = channel(url).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let (tx, rx) = mpsc::channel(16);
        let hello = pb::Hello {
            name: "crash-host".into(),
            hostname: "crash-host".into(),
            instance: "i1".into(),
            runtimes: vec!["process".into()],
            gpus: vec![pb::Gpu {
                index: 0,
                uuid: "GPU-0".into(),
                name: "NVIDIA H200".into(),
                usable: true,
                ..Default::default()
            }],
            running: running.clone(),
            ..Default::default()
        };
        tx.send(pb::AgentMessage { msg: Some(pb::agent_message::Msg::Hello(hello)) }).await.expect("hello");
        let client = &mut pb::agent_service_client::AgentServiceClient::new(ch);
        let Ok(reply) = client.session(ReceiverStream::new(rx)).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let mut messages = reply.into_inner();
        let welcome = match messages.next().await {
            Some(Ok(pb::ControllerMessage { msg: Some(pb::controller_message::Msg::Welcome(w)) })) => w,
            other => panic!("expected a welcome, got {other:?}"),
        };
        let beats = tx.clone();
        let heartbeats = tokio::spawn(async move {
            for seq in 1.. {
                let beat = pb::AgentMessage { msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat { seq })) };
                if beats.send(beat).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        return Session { tx, messages, welcome, heartbeats };
    }
}

impl Session {
    async fn assignment(&mut self) -> pb::AssignGroup {
        loop {
            let next = tokio::time::timeout(Duration::from_secs(10), self.messages.next()).await;
            match next.expect("an assignment within 10 s").expect("the session is open").expect("no error").msg {
                Some(pb::controller_message::Msg::AssignGroup(g)) => return g,
                Some(pb::controller_message::Msg::HeartbeatAck(_)) => {}
                other => panic!("expected an assignment, got {other:?}"),
            }
        }
    }
}

/// Batch `n`'s size: 1 to 128 records.
fn size(seed: u64, n: u64) -> u64 {
    1 + mix(seed ^ (n << 20)) % 128
}

fn record(seq: u64) -> pb::RequestRecord {
    let start = seq as i64 * 1_000_000;
    pb::RequestRecord {
        seq,
        scheduled_ns: start,
        sent_ns: start + 1_000,
        first_token_ns: start + 50_000_000,
        completed_ns: start + 80_000_000,
        chunk_ns: vec![start + 50_000_000, start + 80_000_000],
        chunk_tokens: vec![1, 3],
        prompt_tokens: 8,
        output_tokens: 4,
        outcome: pb::Outcome::Ok as i32,
        http_status: 200,
        ..Default::default()
    }
}

/// What the sender made and what came back acknowledged.
#[derive(Default)]
struct Sent {
    /// The first record seq of each batch made, and one past the last.
    firsts: Vec<u64>,
    acked: BTreeSet<u64>,
}

impl Sent {
    fn batch(&self, attempt: &pb::AttemptRef, n: usize) -> pb::RecordBatch {
        let (first, end) = (self.firsts[n], self.firsts[n + 1]);
        pb::RecordBatch {
            attempt: Some(attempt.clone()),
            batch: n as u64,
            records: (first..end).map(record).collect(),
            summary: None,
            sent: end,
        }
    }
}

/// Streams batches of `attempt` to whichever controller listens at `url`,
/// new ones every few milliseconds until `done`, and on every broken stream
/// sends again those not acknowledged; returns once every batch made is
/// acknowledged.
async fn sender(
    url: String,
    attempt: pb::AttemptRef,
    seed: u64,
    sent: Arc<Mutex<Sent>>,
    acks: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
) -> u64 {
    sent.lock().expect("lock").firsts.push(0);
    let mut streams = 0;
    loop {
        {
            let s = sent.lock().expect("lock");
            if done.load(Ordering::SeqCst) && s.acked.len() + 1 == s.firsts.len() {
                return streams;
            }
        }
        let Some(ch) = channel(&url).await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        streams += 1;
        let (tx, rx) = mpsc::channel(8);
        let writer = tokio::spawn({
            let (sent, attempt, done) = (sent.clone(), attempt.clone(), done.clone());
            async move {
                let again: Vec<pb::RecordBatch> = {
                    let s = sent.lock().expect("lock");
                    (0..s.firsts.len() - 1)
                        .filter(|n| !s.acked.contains(&(*n as u64)))
                        .map(|n| s.batch(&attempt, n))
                        .collect()
                };
                for b in again {
                    if tx.send(b).await.is_err() {
                        return;
                    }
                }
                while !done.load(Ordering::SeqCst) {
                    let b = {
                        let mut s = sent.lock().expect("lock");
                        let n = s.firsts.len() - 1;
                        let end = s.firsts[n] + size(seed, n as u64);
                        s.firsts.push(end);
                        s.batch(&attempt, n)
                    };
                    if tx.send(b).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
                // The stream ends here: the controller acknowledges what it
                // has, then ends its side.
            }
        });
        let mut client = pb::ingest_service_client::IngestServiceClient::new(ch);
        if let Ok(reply) = client.records(ReceiverStream::new(rx)).await {
            let mut replies = reply.into_inner();
            loop {
                match replies.message().await {
                    Ok(Some(ack)) => {
                        sent.lock().expect("lock").acked.insert(ack.batch);
                        acks.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(None) => break,
                    Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                        panic!("the attempt's records were refused: {}", s.message())
                    }
                    Err(_) => break,
                }
            }
        }
        writer.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_resent_across_controller_kills_are_stored_and_counted_once() {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    eprintln!("seed {seed}");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = Controller::start(dir.path());
    let port = c.port();
    let url = c.url();
    let mut agent = session(&url, Vec::new()).await;
    let Some(ch) = channel(&url).await else { panic!("the controller at {url} does not answer") };
    let run = pb::operator_service_client::OperatorServiceClient::new(ch)
        .submit_run(pb::SubmitRunRequest {
            matrix_name: "crash.yaml".into(),
            matrix_yaml: MATRIX.into(),
            ..Default::default()
        })
        .await
        .expect("submitted")
        .into_inner()
        .run_id;
    let group = agent.assignment().await;
    let attempt = group.jobs[0].attempt.clone().expect("an attempt");
    let running = |attempt: &pb::AttemptRef| {
        pb::agent_message::Msg::JobUpdate(pb::JobUpdate {
            attempt: Some(attempt.clone()),
            state: pb::JobState::Running as i32,
            ..Default::default()
        })
    };
    agent.tx.send(pb::AgentMessage { msg: Some(running(&attempt)) }).await.expect("running");
    let claim = pb::GroupClaim { run_id: run.clone(), group: group.group, attempts: vec![attempt.clone()] };

    let sent = Arc::new(Mutex::new(Sent::default()));
    let acks = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sending = tokio::spawn(sender(url.clone(), attempt.clone(), seed, sent.clone(), acks.clone(), done.clone()));

    for round in 0..ROUNDS {
        // Batches are flowing into this controller: some acknowledged...
        let seen = acks.load(Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while acks.load(Ordering::SeqCst) < seen + 3 {
            assert!(tokio::time::Instant::now() < deadline, "round {round}: no batch acknowledged within 30 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // ...and some on their way when it dies.
        tokio::time::sleep(Duration::from_millis(mix(seed ^ round as u64) % 300)).await;
        c.kill9();
        drop(agent);
        c = Controller::start_on(dir.path(), port);
        agent = session(&url, vec![claim.clone()]).await;
        assert_eq!(
            agent.welcome.keep,
            [pb::GroupRef { run_id: run.clone(), group: group.group }],
            "round {round}: the restarted controller keeps the attempt going"
        );
    }
    done.store(true, Ordering::SeqCst);
    let streams = tokio::time::timeout(Duration::from_secs(60), sending)
        .await
        .expect("every batch is acknowledged within a minute of the last restart")
        .expect("the sender");
    drop(agent);

    let store = c.stop_and_open().await;
    let s = sent.lock().expect("lock");
    let batches = s.firsts.len() as u64 - 1;
    let total = *s.firsts.last().expect("made");
    eprintln!("{batches} batches of {total} records over {streams} streams and {ROUNDS} kills");
    assert_eq!(s.acked.len() as u64, batches, "every batch made was acknowledged");
    let key = AttemptKey { run: run.parse::<RunId>().expect("run id"), job: attempt.job, attempt: attempt.attempt };
    let mut seqs: Vec<u64> = store.records(&key).map(|r| r.expect("decodes").seq).collect();
    assert_eq!(seqs.len() as u64, total, "as many records stored as the batches acknowledged hold");
    seqs.sort_unstable();
    assert!(seqs.iter().copied().eq(0..total), "every record stored once");
    for n in 0..batches as usize {
        let held = s.firsts[n + 1] - s.firsts[n];
        assert_eq!(store.stored_batch(&key, n as u64).expect("read"), Some(held), "batch {n}");
    }
    let stats = store.stats(&key).expect("read").expect("stats of the attempt");
    assert_eq!((stats.records, stats.sent, stats.removed), (total, total, false), "each batch counted once");
}
