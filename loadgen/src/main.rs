//! `benchfleet-loadgen`: the command-line face of the library. Its flags,
//! modelled on `vllm bench serve`, and what they make are the library's
//! `cli`; this runs them (one run or a sweep), writes the results, and
//! says how the run ended: its exit status, the error on stderr and, with
//! `--outcome-file`, both as JSON.

use std::io::{BufWriter, IsTerminal};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use benchfleet_core::load::{LoadExit, LoadOutcome};
use benchfleet_loadgen::block::render_self_check;
use benchfleet_loadgen::cli::{Args, ProfileName, load_config, sink_config};
use benchfleet_loadgen::output::{summary_json, write_csv, write_jsonl, write_summary_csv};
use benchfleet_loadgen::{LoadConfig, LoadResult, Progress, SinkConfig, render_block, run};
use clap::Parser;

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // The certificate verifier logs a failure it also returns: the run's
        // error says it once, with what to do.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,rustls_platform_verifier=off".into()),
        )
        .init();
    // A command line that does not parse exits 2 here, before any outcome
    // file is known.
    let args = Args::parse();
    let outcome_file = args.outcome_file.clone();
    let outcome = tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")
        .and_then(|rt| rt.block_on(start(args)))
        .unwrap_or_else(|e| LoadOutcome::new(LoadExit::Error, Some(format!("{e:#}"))));
    // Why a run is INVALID is in its self-check, on stdout.
    if let (LoadExit::Error | LoadExit::NoneSucceeded, Some(error)) = (outcome.exit, &outcome.error) {
        eprintln!("error: {error}");
    }
    let mut exit = outcome.exit;
    if let Some(path) = &outcome_file
        && let Err(e) = write_outcome(path, &outcome)
    {
        eprintln!("error: cannot write the outcome to {}: {e}", path.display());
        // Whoever asked for it cannot tell a completed run from a crash.
        if exit == LoadExit::Completed {
            exit = LoadExit::Error;
        }
    }
    ExitCode::from(exit.code())
}

/// Writes the outcome whole or not at all (a file beside it, renamed), so
/// that a reader never takes half of one for the whole.
fn write_outcome(path: &Path, outcome: &LoadOutcome) -> std::io::Result<()> {
    let json = serde_json::to_vec_pretty(outcome).map_err(std::io::Error::other)?;
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    std::fs::write(&partial, json)?;
    std::fs::rename(&partial, path)
}

/// Runs what the flags ask for; how it ended, or the error that ended it.
async fn start(args: Args) -> anyhow::Result<LoadOutcome> {
    let config = load_config(&args)?;
    let sink = sink_config(&args)?;
    // Ctrl-C ends the run early; what was sent is still recorded.
    let stop = config.stop.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.cancel();
        }
    });

    let mut invalid = None;
    let mut none_succeeded = None;
    if args.profile == Some(ProfileName::Sweep) {
        if sink.is_some() {
            bail!("--profile sweep makes several runs and cannot stream them to --report-to: run each rate as a job");
        }
        let mut summaries = Vec::new();
        let step = |name: String, config: LoadConfig, args: &Args| {
            let quiet = args.quiet;
            async move {
                println!("--- sweep: {name} ---");
                let result = run_one(config, None, quiet).await?;
                Ok::<_, anyhow::Error>(result)
            }
        };
        let mut sync = config.clone();
        (sync.request_rate, sync.max_concurrency) = (None, Some(1));
        let low = step("synchronous".into(), sync, &args).await?;
        let mut all = config.clone();
        (all.request_rate, all.max_concurrency) = (None, None);
        let high = step("throughput".into(), all, &args).await?;
        let (lo, hi) = (low.summary.request_throughput, high.summary.request_throughput);
        let mut results = vec![("synchronous".to_owned(), low), ("throughput".to_owned(), high)];
        for rate in benchfleet_loadgen::schedule::sweep_rates(lo, hi, args.sweep_steps) {
            let mut c = config.clone();
            (c.request_rate, c.max_concurrency) = (Some(rate), args.max_concurrency);
            let name = format!("{rate:.2} req/s");
            results.push((name.clone(), step(name, c, &args).await?));
        }
        for (i, (name, result)) in results.iter().enumerate() {
            invalid = invalid.or_else(|| result.summary.invalid.as_ref().map(|why| format!("{name}: {why}")));
            none_succeeded = none_succeeded.or_else(|| result.none_succeeded().map(|why| format!("{name}: {why}")));
            save(&args, result, Some(i))?;
            summaries.push(serde_json::json!({ "step": name, "summary": result.summary }));
        }
        if let Some(path) = &args.save_summary {
            let json = serde_json::to_vec_pretty(&summaries).context("cannot encode the summaries")?;
            std::fs::write(path, json).with_context(|| format!("cannot write the summaries to {}", path.display()))?;
        }
    } else {
        let result = run_one(config, sink, args.quiet).await?;
        save(&args, &result, None)?;
        if let Some(path) = &args.save_summary {
            let json = summary_json(&result.summary).context("cannot encode the summary")?;
            std::fs::write(path, json).with_context(|| format!("cannot write the summary to {}", path.display()))?;
        }
        invalid.clone_from(&result.summary.invalid);
        none_succeeded = result.none_succeeded();
    }
    Ok(match (none_succeeded, invalid) {
        (Some(why), _) => LoadOutcome::new(LoadExit::NoneSucceeded, Some(why)),
        (None, Some(why)) if args.fail_on_invalid => {
            LoadOutcome::new(LoadExit::Invalid, Some(format!("the run is INVALID: {why}")))
        }
        (None, _) => LoadOutcome::new(LoadExit::Completed, None),
    })
}

/// One run with its progress display; prints its blocks.
async fn run_one(mut config: LoadConfig, sink: Option<SinkConfig>, quiet: bool) -> anyhow::Result<LoadResult> {
    let progress = Arc::new(Progress::default());
    config.progress = Some(Arc::clone(&progress));
    let total = config.num_requests as u64;
    let reporter = (!quiet).then(|| tokio::spawn(report_progress(progress, total)));
    let result = run(config, sink).await;
    if let Some(reporter) = reporter {
        reporter.abort();
    }
    let result = result?;
    print!("{}", render_block(&result.summary, None));
    print!("{}", render_self_check(&result.summary));
    Ok(result)
}

/// Writes the records as JSONL and CSV where asked; `step` numbers the runs
/// of a sweep.
fn save(args: &Args, result: &LoadResult, step: Option<usize>) -> anyhow::Result<()> {
    let named = |path: &Path| match step {
        None => path.to_owned(),
        Some(i) => {
            let ext = path.extension().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
            path.with_extension(format!("{i}.{ext}"))
        }
    };
    if let Some(path) = args.save_records.as_deref().map(named) {
        std::fs::File::create(&path)
            .and_then(|f| write_jsonl(&mut BufWriter::new(f), &result.records))
            .with_context(|| format!("cannot write records to {}", path.display()))?;
    }
    if let Some(path) = args.save_csv.as_deref().map(named) {
        std::fs::File::create(&path)
            .and_then(|f| write_csv(&mut BufWriter::new(f), &result.records))
            .with_context(|| format!("cannot write the CSV to {}", path.display()))?;
    }
    if args.save_result {
        let meta = benchfleet_loadgen::vllm::ResultMeta {
            backend: args.backend_name().to_owned(),
            label: args.label.clone(),
            model_id: args.model.clone(),
            tokenizer_id: args
                .processor
                .as_ref()
                .or(args.tokenizer.as_ref())
                .map_or_else(|| args.model.clone(), |p| p.display().to_string()),
            num_prompts: args.num_prompts,
            request_rate: args.request_rate.is_finite().then_some(args.request_rate),
            max_concurrency: args.max_concurrency,
            percentiles: result.summary.latency_s.percentiles.iter().map(|q| q.p).collect(),
            metrics: args.percentile_metrics.clone(),
            date: benchfleet_loadgen::vllm::date_of(
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64),
            ),
        };
        let name = args.result_filename.clone().unwrap_or_else(|| benchfleet_loadgen::vllm::default_filename(&meta));
        let dir = args.result_dir.clone().unwrap_or_default();
        // As vLLM does: the directory is made when it is missing.
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create the result directory {}", dir.display()))?;
        }
        let path = named(&dir.join(name));
        let json = serde_json::to_vec_pretty(&benchfleet_loadgen::vllm::result_json(result, &meta))
            .context("cannot encode the result")?;
        std::fs::write(&path, json).with_context(|| format!("cannot write the result to {}", path.display()))?;
    }
    if let Some(path) = args.save_summary_csv.as_deref().map(named) {
        std::fs::File::create(&path)
            .and_then(|f| write_summary_csv(&mut BufWriter::new(f), &result.summary))
            .with_context(|| format!("cannot write the summary CSV to {}", path.display()))?;
    }
    Ok(())
}

/// Progress on stderr: a bar on a terminal, else a line every few seconds
/// (logs of headless runs stay readable).
async fn report_progress(progress: Arc<Progress>, total: u64) {
    let started = Instant::now();
    let status = || {
        let (done, secs) = (progress.done(), started.elapsed().as_secs_f64());
        let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
        let eta = if rate > 0.0 { format!("{:.0}s", total.saturating_sub(done) as f64 / rate) } else { "?".into() };
        format!("{rate:.1} req/s, {} in flight, {} failed, eta {eta}", progress.sent() - done, progress.failed())
    };
    if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} requests, {msg} [{elapsed_precise}]")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        loop {
            bar.set_position(progress.done());
            bar.set_message(status());
            if progress.done() >= total {
                bar.finish();
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.tick().await;
    loop {
        tick.tick().await;
        eprintln!("progress: {}/{total} requests done, {}", progress.done(), status());
        if progress.done() >= total {
            return;
        }
    }
}
