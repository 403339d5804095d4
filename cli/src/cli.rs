//! The `benchfleet` operator command line.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context as _;
use benchfleet_proto as pb;
use clap::{Parser, Subcommand};

use crate::client;
use crate::local::{LocalFleet, simulated_agent};
use benchfleet_controller::model::RunId;
use benchfleet_controller::store::{SledStore, Store};

#[derive(Parser, Debug)]
#[command(name = "benchfleet", version, about = "Benchmark LLM inference engines across a fleet of GPU hosts")]
pub struct Cli {
    /// Where the local store lives (runs, jobs, request records).
    #[arg(long, global = true, env = "BENCHFLEET_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// A running controller's gRPC URL; without it, commands read the local store.
    #[arg(long, global = true, env = "BENCHFLEET_CONTROLLER")]
    pub controller: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run a matrix: on this machine with simulated engines (--local), or on
    /// the fleet of the controller given with --controller.
    Run {
        matrix: PathBuf,
        /// Start a controller, an agent and simulated engines here.
        #[arg(long)]
        local: bool,
    },
    /// List runs.
    Runs,
    /// Print a run's report.
    Report { run_id: String },
    /// List the agents a controller knows, and their GPUs.
    Agents,
}

/// Runs the command; the exit code is 0 only when everything asked for
/// succeeded (every job of a run).
pub async fn main(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Run { ref matrix, local: true } => {
            run_local(matrix, &benchfleet_controller::store::data_dir(cli.data_dir.as_deref())).await
        }
        Command::Run { ref matrix, local: false } => {
            let url = cli.controller.as_deref().context("give --controller URL, or --local to run here")?;
            let mut c = client::connect(url).await?;
            run_and_report(&mut c, matrix, None).await
        }
        Command::Runs => {
            let runs = match &cli.controller {
                Some(url) => client::connect(url).await?.list_runs(pb::ListRunsRequest {}).await?.into_inner().runs,
                None => {
                    let store = open_store(&benchfleet_controller::store::data_dir(cli.data_dir.as_deref()))?;
                    store
                        .runs()?
                        .iter()
                        .map(|r| Ok(benchfleet_controller::convert::run_info(r, &store.jobs(r.id)?)))
                        .collect::<anyhow::Result<_>>()?
                }
            };
            print_runs(&runs);
            Ok(0)
        }
        Command::Report { ref run_id } => {
            let text = match &cli.controller {
                Some(url) => {
                    client::connect(url)
                        .await?
                        .get_report(pb::GetReportRequest { run_id: run_id.clone() })
                        .await
                        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
                        .into_inner()
                        .text
                }
                None => {
                    let id: RunId = run_id.parse().map_err(anyhow::Error::msg)?;
                    let store = open_store(&benchfleet_controller::store::data_dir(cli.data_dir.as_deref()))?;
                    benchfleet_controller::report::render(&store, id)?
                }
            };
            print!("{text}");
            Ok(0)
        }
        Command::Agents => {
            let url = cli.controller.as_deref().context("give --controller URL")?;
            let agents = client::connect(url).await?.list_agents(pb::ListAgentsRequest {}).await?.into_inner().agents;
            for a in agents {
                println!("{} ({}) {}", a.name, a.hostname, if a.connected { "connected" } else { "disconnected" });
                for g in a.gpus {
                    let verdict =
                        if g.usable { "usable".to_owned() } else { format!("not used: {}", g.reasons.join("; ")) };
                    println!("  GPU {} {} {}: {verdict}", g.index, g.name, g.uuid);
                }
            }
            Ok(0)
        }
    }
}

fn open_store(dir: &Path) -> anyhow::Result<SledStore> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create the data directory {}", dir.display()))?;
    Ok(SledStore::open(&dir.join("store"))?)
}

async fn run_local(matrix: &Path, dir: &Path) -> anyhow::Result<i32> {
    // Fail on a bad matrix before starting anything.
    let submission = client::submission(matrix, Some("process"))?;
    let gpu = benchfleet_controller::matrix::parse(&submission.matrix_name, &submission.matrix_yaml, &|_| {
        Some(String::new())
    })?
    .gpu
    .unwrap_or_else(|| "H200".to_owned());
    let store: Arc<dyn Store> = Arc::new(open_store(dir)?);
    eprintln!("data directory: {}", dir.display());
    let work_dir = dir.join("agent");
    let fleet = LocalFleet::start(store, |url| simulated_agent(url, &gpu, work_dir)).await?;
    let result = async {
        let mut c = client::connect(&fleet.url).await?;
        submit_and_report(&mut c, submission).await
    }
    .await;
    fleet.stop().await;
    let code = result?;
    eprintln!("data directory: {}", dir.display());
    Ok(code)
}

async fn run_and_report(c: &mut client::OperatorClient, matrix: &Path, runtime: Option<&str>) -> anyhow::Result<i32> {
    let submission = client::submission(matrix, runtime)?;
    submit_and_report(c, submission).await
}

async fn submit_and_report(c: &mut client::OperatorClient, submission: pb::SubmitRunRequest) -> anyhow::Result<i32> {
    let submitted = c.submit_run(submission).await.map_err(|s| anyhow::anyhow!("{}", s.message()))?.into_inner();
    eprintln!("run {} submitted: {} jobs", submitted.run_id, submitted.jobs);
    let bar = progress_bar(submitted.jobs);
    let mut last_done = u64::MAX;
    let run = client::watch(c, &submitted.run_id, |run| {
        if let Some(bar) = &bar {
            bar.set_position(run.jobs_done);
            bar.set_message(format!("{} failed", run.jobs_failed));
        } else if run.jobs_done != last_done {
            last_done = run.jobs_done;
            eprintln!("jobs {}/{} done, {} failed", run.jobs_done, run.jobs_total, run.jobs_failed);
        }
    })
    .await?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let report = c
        .get_report(pb::GetReportRequest { run_id: submitted.run_id.clone() })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner()
        .text;
    print!("{report}");
    println!("run id: {}", submitted.run_id);
    Ok(if run.jobs_failed == 0 && run.jobs_done == run.jobs_total { 0 } else { 1 })
}

/// A bar on a terminal; `None` elsewhere, where plain lines are printed.
fn progress_bar(total: u64) -> Option<indicatif::ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(total);
    let style = indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} jobs, {msg}")
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
    bar.set_style(style);
    Some(bar)
}

fn print_runs(runs: &[pb::RunInfo]) {
    println!("{:<8} {:<32} {:<24} {:>10}", "RUN", "NAME", "STATE", "JOBS");
    for r in runs {
        println!("{:<8} {:<32} {:<24} {:>4}/{:<5}", r.run_id, r.name, r.state, r.jobs_done, r.jobs_total);
    }
}
