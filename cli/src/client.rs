//! The operator's side of the gRPC API: connect, upload a matrix's files and
//! submit it, follow a run (re-attaching after a controller restart), and
//! the listings and commands.

use std::io::Read as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use benchfleet_core::sharegpt::{self, ShareGpt};
use benchfleet_core::tls::{self, ClientTls};
use benchfleet_proto as pb;
use benchfleet_study::matrix;
use benchfleet_study::model::{Dataset, TraceFormat};
use sha2::Digest as _;
use tokio_stream::StreamExt;

pub type OperatorClient = pb::operator_service_client::OperatorServiceClient<tonic::transport::Channel>;

/// Largest message sent: matrices are at most 1 MiB, files go in 1 MiB chunks.
const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// Largest answer taken: a report's JSON grows with its jobs (a 100-host
/// fleet check's is about 5 MB), as the controller's `MAX_REPLY_BYTES`.
const MAX_REPLY_BYTES: usize = 256 << 20;
const CHUNK: usize = 1 << 20;

/// The controller could not be reached (exit code 3).
#[derive(Debug, thiserror::Error)]
#[error("cannot reach the controller at {url}: {reason}")]
pub struct Unreachable {
    pub url: String,
    pub reason: String,
}

/// A controller: its URL, and what this operator holds to reach it.
#[derive(Clone, Debug)]
pub struct Target {
    pub url: String,
    pub tls: ClientTls,
}

impl Target {
    /// A controller reached as the client rule allows without an identity
    /// (loopback, plain text): local mode and tests.
    pub fn plain(url: impl Into<String>) -> Target {
        Target { url: url.into(), tls: ClientTls::default() }
    }
}

impl From<&str> for Target {
    fn from(url: &str) -> Target {
        Target::plain(url)
    }
}

impl From<&String> for Target {
    fn from(url: &String) -> Target {
        Target::plain(url.as_str())
    }
}

impl From<&Target> for Target {
    fn from(t: &Target) -> Target {
        t.clone()
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url)
    }
}

/// Connects under the client rule (`benchfleet_core::tls`): https verified
/// against the operator's CA, with the operator's certificate; plain text
/// only to loopback or with --insecure.
pub async fn connect(target: impl Into<Target>) -> anyhow::Result<OperatorClient> {
    let target = target.into();
    let url = &target.url;
    let endpoint = tls::endpoint(url, &target.tls)?;
    let channel = endpoint.connect().await.map_err(|e| Unreachable { url: url.to_owned(), reason: error_chain(&e) })?;
    Ok(OperatorClient::new(channel)
        .max_decoding_message_size(MAX_REPLY_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// A call that failed, with the gRPC code that says what kind of failure it
/// is: the controller's answer, or the same kind of failure met in the local
/// store. The code gives the exit code (`cli::exit_code`).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct StatusError {
    pub code: tonic::Code,
    pub message: String,
}

impl StatusError {
    pub fn new(code: tonic::Code, message: impl Into<String>) -> StatusError {
        StatusError { code, message: message.into() }
    }
}

/// A gRPC error as the operator reads it.
pub fn status(s: tonic::Status) -> anyhow::Error {
    let message = match s.code() {
        tonic::Code::Unavailable => format!("the controller is unavailable: {}", s.message()),
        _ => s.message().to_owned(),
    };
    StatusError::new(s.code(), message).into()
}

/// A file the matrix names, read from disk.
pub struct MatrixFile {
    pub path: String,
    pub on_disk: std::path::PathBuf,
    pub sha256: String,
    pub size: u64,
}

/// A matrix read from disk and checked, with the files it names (hashed,
/// not loaded).
pub struct Submission {
    pub request: pb::SubmitRunRequest,
    pub files: Vec<MatrixFile>,
    /// The matrix as this side reads it.
    pub matrix: matrix::Matrix,
    /// What reading its dataset files found worth saying: entries skipped,
    /// prompts sent more than once.
    pub dataset_notes: Vec<String>,
}

fn hash_file(path: &Path) -> std::io::Result<(String, u64)> {
    let mut f = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0; CHUNK];
    let mut size = 0;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((hasher.finalize().iter().map(|b| format!("{b:02x}")).collect(), size))
}

/// Reads a matrix file and hashes the files it names (relative to it). A
/// matrix with an error is reported here, before any connection.
pub fn submission(path: &Path, runtime_override: Option<&str>) -> anyhow::Result<Submission> {
    let name = path.display().to_string();
    let read = |e: std::io::Error| anyhow::anyhow!("cannot read the matrix file {name}: {e}");
    // A file far too large is refused before it is read.
    let size = std::fs::metadata(path).map_err(read)?.len();
    if size > matrix::MAX_BYTES as u64 {
        matrix::decode(&name, &vec![0; matrix::MAX_BYTES + 1]).map(drop).map_err(|_| {
            anyhow::anyhow!("{name}: is {size} bytes; a matrix file may be at most {} bytes (1 MiB)", matrix::MAX_BYTES)
        })?;
    }
    let bytes = std::fs::read(path).map_err(read)?;
    let yaml = matrix::decode(&name, &bytes)?.to_owned();
    let base = path.parent().unwrap_or(Path::new("."));
    let mut files = Vec::new();
    for f in matrix::referenced_files(&name, &yaml)? {
        let on_disk = base.join(&f.path);
        // A file that cannot be read is left out; validation names it.
        if let Ok((sha256, size)) = hash_file(&on_disk) {
            files.push(MatrixFile { path: f.path, on_disk, sha256, size });
        }
    }
    let parsed = matrix::parse(&name, &yaml, &|p| files.iter().find(|f| f.path == p).map(|f| f.sha256.clone()))?;
    // Each dataset file is read as loadgen will read it, before anything is
    // submitted: a broken one is the matrix's error, naming the file.
    let mut dataset_notes = Vec::new();
    let mut read: Vec<(String, bool, ShareGpt)> = Vec::new();
    let mut traces: Vec<(String, (benchfleet_core::trace::Trace, TraceFormat))> = Vec::new();
    for profile in &parsed.profiles {
        if let Dataset::Trace { file, format, .. } = &profile.dataset {
            let field = format!("profiles.{}.dataset.trace.path", profile.name);
            if !traces.iter().any(|(path, t)| path == file && t.1 == *format) {
                let trace = benchfleet_core::trace::read(&base.join(file), file, *format)
                    .map_err(|e| matrix::field_error(&name, &yaml, &field, format!("{:#}", anyhow::Error::new(e))))?;
                traces.push((file.clone(), (trace, *format)));
            }
            let trace = &traces.iter().find(|(path, t)| path == file && t.1 == *format).expect("read above").1.0;
            let fault = trace.holds(profile.requests).err();
            if let Some(message) = fault {
                return Err(matrix::field_error(&name, &yaml, &field, message).into());
            }
            continue;
        }
        let Dataset::ShareGpt { file, sessions, .. } = &profile.dataset else { continue };
        let field = format!("profiles.{}.dataset.sharegpt", profile.name);
        // Sessions need each conversation's later exchanges; a file is
        // read with them only for a profile that sends them.
        let turns = sessions.is_some();
        if !read.iter().any(|(path, kept, _)| path == file && *kept == turns) {
            let on_disk = base.join(file);
            let data = sharegpt::read_with(&on_disk, file, turns)
                .map_err(|e| matrix::field_error(&name, &yaml, &field, format!("{:#}", anyhow::Error::new(e))))?;
            let note = format!("{file}: {}", data.describe());
            if data.skipped.total() > 0 && !dataset_notes.contains(&note) {
                dataset_notes.push(note);
            }
            read.push((file.clone(), turns, data));
        }
        let data = &read.iter().find(|(path, kept, _)| path == file && *kept == turns).expect("read above").2;
        let reuse =
            if turns { data.reuse_turns(profile.requests as usize) } else { data.reuse(profile.requests as usize) };
        if let Some(reuse) = reuse {
            dataset_notes.push(format!("{field}: {reuse}"));
        }
    }
    let request = pb::SubmitRunRequest {
        matrix_name: name,
        matrix_yaml: yaml,
        runtime_override: runtime_override.unwrap_or_default().to_owned(),
        fleet_per: String::new(),
        fleet_hosts: String::new(),
        files: files.iter().map(|f| (f.path.clone(), f.sha256.clone())).collect(),
    };
    Ok(Submission { request, files, matrix: parsed, dataset_notes })
}

/// Uploads what the controller lacks, then submits.
pub async fn submit(client: &mut OperatorClient, sub: Submission) -> anyhow::Result<pb::SubmitRunResponse> {
    let wanted: Vec<String> = sub.files.iter().map(|f| f.sha256.clone()).collect();
    let missing =
        client.missing_files(pb::MissingFilesRequest { sha256: wanted }).await.map_err(status)?.into_inner().sha256;
    for f in sub.files.iter().filter(|f| missing.contains(&f.sha256)) {
        upload(client, f).await.with_context(|| format!("cannot upload {}", f.on_disk.display()))?;
    }
    Ok(client.submit_run(sub.request).await.map_err(status)?.into_inner())
}

/// What submitting would do on the controller's fleet now; nothing is
/// uploaded or stored.
pub async fn plan(client: &mut OperatorClient, sub: Submission) -> anyhow::Result<pb::PlanRunResponse> {
    Ok(client.plan_run(sub.request).await.map_err(status)?.into_inner())
}

/// The plan as an operator reads it: each group, where it would run (or
/// that it would wait), and its jobs.
pub fn plan_text(plan: &pb::PlanRunResponse) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let jobs: usize = plan.groups.iter().map(|g| g.jobs.len()).sum();
    let placed = plan.groups.iter().filter(|g| !g.agent.is_empty()).count();
    let _ = writeln!(
        out,
        "{} strategy: {} groups, {jobs} jobs{}; {placed} of the groups would start now",
        plan.strategy,
        plan.groups.len(),
        if plan.strategy == "greedy" { " in its first stage (the next are planned from its results)" } else { "" },
    );
    for g in &plan.groups {
        let at = if g.agent.is_empty() {
            "waits".to_owned()
        } else {
            let gpus: Vec<String> = g.gpus.iter().map(u32::to_string).collect();
            format!("on {} (GPU {})", g.agent, gpus.join(", "))
        };
        let _ = writeln!(out, "group {} {}: {at}", g.group, g.config);
        for j in &g.jobs {
            let _ = writeln!(out, "  job {} {} repeat {}", j.job, j.profile, j.repeat);
        }
    }
    for w in &plan.waiting {
        let _ = writeln!(out, "waiting: {w}");
    }
    out
}

/// Streams a file in chunks: memory stays at a few chunks whatever its size.
async fn upload(client: &mut OperatorClient, f: &MatrixFile) -> anyhow::Result<()> {
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::FileChunk>(4);
    let (path, name, sha256, size) = (f.on_disk.clone(), f.path.clone(), f.sha256.clone(), f.size);
    let reader = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut file = std::fs::File::open(&path)?;
        let mut first = true;
        loop {
            let mut data = vec![0; CHUNK];
            let n = file.read(&mut data)?;
            if n == 0 && !first {
                return Ok(());
            }
            data.truncate(n);
            let chunk = pb::FileChunk {
                sha256: if first { sha256.clone() } else { String::new() },
                size: if first { size } else { 0 },
                name: if first { name.clone() } else { String::new() },
                data,
            };
            first = false;
            if tx.blocking_send(chunk).is_err() || n == 0 {
                return Ok(());
            }
        }
    });
    let sent = client.upload_file(tokio_stream::wrappers::ReceiverStream::new(rx)).await;
    reader.await??;
    sent.map_err(status)?;
    Ok(())
}

/// Uploads an export (`path`, or standard input for "-") to the
/// controller's import, in chunks. A line the controller refuses is named
/// with the file's name.
pub async fn import(client: &mut OperatorClient, path: &str) -> anyhow::Result<pb::ImportRunResponse> {
    let name = shown(path);
    let mut input: Box<dyn std::io::Read + Send> = if path == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path).with_context(|| format!("cannot read {name}"))?)
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::ExportChunk>(4);
    let reader = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        loop {
            let mut data = vec![0; CHUNK];
            let n = input.read(&mut data)?;
            if n == 0 {
                return Ok(());
            }
            data.truncate(n);
            if tx.blocking_send(pb::ExportChunk { data }).is_err() {
                return Ok(());
            }
        }
    });
    let sent = client.import_run(tokio_stream::wrappers::ReceiverStream::new(rx)).await;
    // A file that could not be read is the error, not what the controller
    // made of its first part. A refusal need not wait for the reader (which
    // may be waiting on a terminal).
    if sent.is_ok() || reader.is_finished() {
        reader.await?.with_context(|| format!("cannot read {name}"))?;
    }
    match sent {
        Ok(r) => Ok(r.into_inner()),
        Err(s) if s.code() == tonic::Code::InvalidArgument => {
            Err(StatusError::new(s.code(), format!("{name}: {}", s.message())).into())
        }
        Err(s) => Err(status(s)),
    }
}

/// A file as an operator named it: "-" is standard input.
pub fn shown(path: &str) -> String {
    if path == "-" { "standard input".to_owned() } else { path.to_owned() }
}

/// Follows a run until it ends, calling `on_progress` on every change. A
/// controller that goes away (a restart) is waited for, up to `reconnect_for`,
/// and the run re-attached.
pub async fn watch(
    target: impl Into<Target>,
    run_id: &str,
    reconnect_for: Duration,
    mut on_progress: impl FnMut(&pb::RunProgress),
) -> anyhow::Result<pb::RunProgress> {
    let target = target.into();
    let url = &target.url;
    let mut lost_since: Option<tokio::time::Instant> = None;
    loop {
        let attempt = async {
            let mut client = connect(&target).await?;
            let mut stream = client
                .watch_run(pb::WatchRunRequest { run_id: run_id.to_owned() })
                .await
                .map_err(|s| {
                    if s.code() == tonic::Code::Unavailable {
                        anyhow::Error::from(Unreachable { url: url.to_owned(), reason: s.message().to_owned() })
                    } else {
                        status(s)
                    }
                })?
                .into_inner();
            lost_since = None;
            while let Some(progress) = stream.next().await {
                let progress = progress.map_err(|s| {
                    anyhow::Error::from(Unreachable { url: url.to_owned(), reason: s.message().to_owned() })
                })?;
                on_progress(&progress);
                if progress.finished {
                    return Ok(progress);
                }
            }
            Err(anyhow::Error::from(Unreachable {
                url: url.to_owned(),
                reason: "the progress stream ended".to_owned(),
            }))
        }
        .await;
        match attempt {
            Ok(p) => return Ok(p),
            Err(e) if e.downcast_ref::<Unreachable>().is_some() => {
                let since = *lost_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() > reconnect_for {
                    return Err(e);
                }
                tracing::info!("lost the controller ({e:#}); re-attaching");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}
