//! A fake controller IngestService that keeps what it receives and can
//! misbehave: break the first stream after one batch, refuse new streams for
//! a while, or never acknowledge.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use benchfleet_proto as pb;
use pb::ingest_service_server::{IngestService, IngestServiceServer};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

#[derive(Clone, Copy, Debug, Default)]
pub struct Behaviour {
    /// End the first stream with an error right after acknowledging its first
    /// batch.
    pub break_first_stream: bool,
    /// Store but never acknowledge.
    pub never_ack: bool,
    /// Refuse every stream opened this long after the first one broke.
    pub refuse_for: Duration,
    /// Answer the second batch of every stream as a controller answers an
    /// abandoned attempt's (for good).
    pub abandon_after_one: bool,
}

/// What the fake controller stored.
#[derive(Debug, Default)]
pub struct Received {
    /// How many times each record seq was stored.
    pub stored: BTreeMap<u64, u32>,
    /// The records themselves, by seq (the last copy of each).
    pub records: BTreeMap<u64, pb::RequestRecord>,
    pub summary: Option<pb::Summary>,
    pub streams: u32,
    pub attempts: Vec<pb::AttemptRef>,
    /// Streams refused.
    pub refused: u32,
    /// When the first stream was broken on purpose.
    broke_at: Option<Instant>,
}

#[derive(Clone)]
struct Fake {
    behaviour: Behaviour,
    received: Arc<Mutex<Received>>,
}

/// Starts the fake on a free port; returns its URL and what it receives.
pub async fn start(behaviour: Behaviour) -> (String, Arc<Mutex<Received>>) {
    let received = Arc::new(Mutex::new(Received::default()));
    let fake = Fake { behaviour, received: Arc::clone(&received) };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(IngestServiceServer::new(fake))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .expect("fake ingest");
    });
    (format!("http://{addr}"), received)
}

type AckStream = Pin<Box<dyn Stream<Item = Result<pb::RecordAck, Status>> + Send>>;

#[tonic::async_trait]
impl IngestService for Fake {
    type RecordsStream = AckStream;

    async fn records(&self, request: Request<Streaming<pb::RecordBatch>>) -> Result<Response<AckStream>, Status> {
        let mut inbound = request.into_inner();
        let stream_no = {
            let mut received = self.received.lock().expect("lock");
            if received.broke_at.is_some_and(|t| t.elapsed() < self.behaviour.refuse_for) {
                received.refused += 1;
                return Err(Status::unavailable("refused on purpose"));
            }
            received.streams += 1;
            received.streams
        };
        let (tx, rx) = mpsc::channel(64);
        let fake = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(batch)) = inbound.message().await {
                let summary_stored = {
                    let mut received = fake.received.lock().expect("lock");
                    for record in &batch.records {
                        *received.stored.entry(record.seq).or_default() += 1;
                        received.records.insert(record.seq, record.clone());
                    }
                    received.attempts.extend(batch.attempt.clone());
                    if batch.summary.is_some() {
                        received.summary = batch.summary.clone();
                    }
                    batch.summary.is_some()
                };
                if fake.behaviour.never_ack {
                    continue;
                }
                if fake.behaviour.abandon_after_one && batch.batch >= 1 {
                    tx.send(Err(Status::failed_precondition("attempt 2 of job run-1/7 was abandoned"))).await.ok();
                    return;
                }
                tx.send(Ok(pb::RecordAck { batch: batch.batch, summary_stored })).await.ok();
                if fake.behaviour.break_first_stream && stream_no == 1 {
                    fake.received.lock().expect("lock").broke_at = Some(Instant::now());
                    tx.send(Err(Status::unavailable("broken on purpose"))).await.ok();
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
