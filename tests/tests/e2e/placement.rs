//! A multi-GPU host runs several engine groups at once, each engine on its
//! own GPU and port, and every job still gets all its records.

use benchfleet_study::model::{AttemptKey, JobState, RunId};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_shows_where_each_group_would_go_and_stores_nothing() -> anyhow::Result<()> {
    use benchfleet_cli::client;
    let dir = tempfile::tempdir()?;
    let (fleet, store) = crate::fleet::start_with_gpus(dir.path(), 2).await?;
    let matrix = dir.path().join("side-by-side.yaml");
    std::fs::write(&matrix, MATRIX)?;
    let mut operator = client::connect(&fleet.url).await?;
    // The agent has registered and reported its GPUs.
    for _ in 0..300 {
        let agents = operator.list_agents(benchfleet_proto::ListAgentsRequest {}).await?.into_inner().agents;
        if agents.iter().any(|a| a.state == "ready" && a.gpus.len() == 2) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let plan = client::plan(&mut operator, client::submission(&matrix, Some("process"))?).await?;
    let text = client::plan_text(&plan);
    assert_eq!(
        text,
        "grid strategy: 2 groups, 2 jobs; 2 of the groups would start now\n\
         group 0 vllm: on in-process (GPU 0)\n  job 0 short repeat 1\n\
         group 1 vllm+throughput-mode: on in-process (GPU 1)\n  job 1 short repeat 1\n"
    );
    // Hardware no agent has: every group would wait, and says why.
    std::fs::write(&matrix, MATRIX.replace("gpu: H200", "gpu: H100"))?;
    let plan = client::plan(&mut operator, client::submission(&matrix, Some("process"))?).await?;
    assert!(plan.groups.iter().all(|g| g.agent.is_empty()), "{plan:?}");
    assert_eq!(plan.waiting, ["no agent has an H100"]);
    assert!(client::plan_text(&plan).ends_with("waiting: no agent has an H100\n"));
    // Nothing was stored, and the fleet is as free as it was.
    assert!(store.runs()?.is_empty());
    std::fs::write(&matrix, MATRIX)?;
    let (_, run) = crate::fleet::run_matrix(&fleet.url, &matrix, Some("process")).await?;
    fleet.stop().await;
    assert_eq!((run.jobs_done, run.jobs_failed), (2, 0));
    Ok(())
}

/// The agent lists an engine's GPUs, simulated ones too, in
/// `CUDA_VISIBLE_DEVICES`, and the simulator counts them as an engine
/// counts its devices: tensor parallelism over more than it was given fails
/// at startup, with vLLM's validation error, as a flag the engine refuses (and
/// so does what SGLang's checks of its arguments raise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_engine_gets_the_jobs_gpus_and_no_more() -> anyhow::Result<()> {
    use benchfleet_agent::engine::{EngineError, EngineRuntime, ProcessRuntime, wait_until_serving};
    use benchfleet_agent::job::EngineLaunch;
    // The agent installs it as it starts; this test drives its runtime alone.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = ProcessRuntime {
        launcher: vec![crate::faults::bin("benchfleet-sim").display().to_string()],
        env: vec![("BENCHFLEET_SIM_GPU".into(), "H200".into())],
        stop_grace: std::time::Duration::from_secs(5),
        ..ProcessRuntime::default()
    };
    let launch = |gpus: usize| EngineLaunch {
        kind: "vllm".into(),
        model: "Qwen/Qwen3.5-9B".into(),
        args: vec!["--tensor-parallel-size=2".into()],
        runtime: "process".into(),
        gpu_uuids: (0..gpus).map(|i| format!("GPU-sim-host-{i}")).collect(),
        ..EngineLaunch::default()
    };
    let wait = std::time::Duration::from_secs(30);
    let mut one = runtime.start(&launch(1)).await?;
    let refused = wait_until_serving(one.as_mut(), "Qwen/Qwen3.5-9B", wait).await.expect_err("one GPU for TP 2");
    assert!(
        matches!(&refused, EngineError::BadFlag { message }
            if message.contains("World size (2) is larger than the number of available GPUs (1)")),
        "{refused}"
    );
    one.stop().await;
    // SGLang's checks of its arguments raise from its ServerArgs: flags refused too.
    let sglang = EngineLaunch {
        kind: "sglang".into(),
        args: ["--tp", "2", "--dp-size", "2", "--enable-dp-attention", "--speculative-algorithm", "NGRAM"]
            .map(String::from)
            .to_vec(),
        ..launch(2)
    };
    let mut ngram = runtime.start(&sglang).await?;
    let refused =
        wait_until_serving(ngram.as_mut(), "Qwen/Qwen3.5-9B", wait).await.expect_err("NGRAM beside DP attention");
    assert!(
        matches!(&refused, EngineError::BadFlag { message }
            if message == "ValueError: Currently ngram speculative decoding does not support dp attention."),
        "{refused}"
    );
    ngram.stop().await;
    let mut two = runtime.start(&launch(2)).await?;
    let serving = wait_until_serving(two.as_mut(), "Qwen/Qwen3.5-9B", wait).await;
    two.stop().await;
    serving?;
    Ok(())
}
