//! The operator's side of the gRPC API: submit a matrix with the files it
//! names, watch a run, fetch reports and listings.

use std::path::Path;

use anyhow::Context as _;
use benchfleet_proto as pb;
use tokio_stream::StreamExt;

use benchfleet_controller::matrix;
use benchfleet_controller::server::MAX_MESSAGE_BYTES;

pub type OperatorClient = pb::operator_service_client::OperatorServiceClient<tonic::transport::Channel>;

pub async fn connect(url: &str) -> anyhow::Result<OperatorClient> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .with_context(|| format!("'{url}' is not a controller URL"))?
        .connect()
        .await
        .with_context(|| format!("cannot reach the controller at {url}"))?;
    Ok(OperatorClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// Reads a matrix file and the dataset files it names (relative to it), and
/// builds the submission. A matrix with an error is reported here, before
/// anything is sent.
pub fn submission(path: &Path, runtime_override: Option<&str>) -> anyhow::Result<pb::SubmitRunRequest> {
    let yaml =
        std::fs::read_to_string(path).with_context(|| format!("cannot read the matrix file {}", path.display()))?;
    let name = path.display().to_string();
    let base = path.parent().unwrap_or(Path::new("."));
    let mut files = std::collections::HashMap::new();
    for f in matrix::referenced_files(&name, &yaml)? {
        // A file that cannot be read is left out; validation names it.
        if let Ok(content) = std::fs::read(base.join(&f.path)) {
            files.insert(f.path, content);
        }
    }
    // Validate here too, so that errors appear before any connection.
    matrix::parse(&name, &yaml, &|p| files.contains_key(p).then(String::new))?;
    Ok(pb::SubmitRunRequest {
        matrix_name: name,
        matrix_yaml: yaml,
        files,
        runtime_override: runtime_override.unwrap_or_default().to_owned(),
    })
}

/// Follows a run until it finishes, calling `on_progress` on every change.
pub async fn watch(
    client: &mut OperatorClient,
    run_id: &str,
    mut on_progress: impl FnMut(&pb::RunInfo),
) -> anyhow::Result<pb::RunInfo> {
    let mut stream = client
        .watch_run(pb::WatchRunRequest { run_id: run_id.to_owned() })
        .await
        .context("cannot watch the run")?
        .into_inner();
    let mut last = None;
    while let Some(progress) = stream.next().await {
        let progress = progress.context("lost the run's progress stream")?;
        if let Some(run) = &progress.run {
            on_progress(run);
        }
        last = progress.run;
        if progress.finished {
            break;
        }
    }
    last.context("the controller ended the progress stream early")
}
