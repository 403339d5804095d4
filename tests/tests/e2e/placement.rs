//! A multi-GPU host runs several engine groups at once, each engine on its
//! own GPU and port, and every job still gets all its records.

use benchfleet_controller::model::{AttemptKey, JobState, RunId};

const MATRIX: &str = "\
name: side-by-side
model: Qwen/Qwen3.5-9B
hardware: { gpu: H200, gpus_per_job: 1 }
engines:
  vllm: { args: [--max-model-len=4096] }
variants:
  throughput-mode: { args: [--performance-mode=throughput] }
profiles:
  short:
    dataset: { random: { input_tokens: 64, output_tokens: 256, seed: 3 } }
    rate: 20
    requests: 20
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_groups_run_at_once_on_their_own_gpus() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (fleet, store) = crate::fleet::start_with_gpus(dir.path(), 2).await?;
    let matrix = dir.path().join("side-by-side.yaml");
    std::fs::write(&matrix, MATRIX)?;
    let (run_id, run) = crate::fleet::run_matrix(&fleet.url, &matrix, Some("process")).await?;
    fleet.stop().await;
    assert_eq!((run.jobs_done, run.jobs_failed), (2, 0));

    let run_id: RunId = run_id.parse().map_err(anyhow::Error::msg)?;
    let jobs = store.jobs(run_id)?;
    // The controller gives each group the first free GPU: had the groups
    // run one after the other, both would have had GPU 0.
    let mut gpus: Vec<String> = jobs
        .iter()
        .map(|j| {
            assert_eq!(j.state, JobState::Succeeded, "{j:?}");
            let uuid = j.gpu_fingerprint.first().and_then(|f| f.split("uuid=").nth(1)).unwrap_or_default();
            uuid.split_whitespace().next().unwrap_or_default().to_owned()
        })
        .collect();
    gpus.sort();
    assert_eq!(gpus, ["GPU-sim-test-0", "GPU-sim-test-1"]);
    for job in &jobs {
        let records =
            crate::fleet::records(store.as_ref(), &AttemptKey { run: run_id, job: job.id, attempt: job.attempt })?;
        assert_eq!(records.len(), 20);
    }
    Ok(())
}
