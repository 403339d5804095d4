//! `benchfleet fleet`: a fleet check submitted, followed and judged (its
//! exit status the worst verdict, outliers drained on request), and the
//! history of the checks stored.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use benchfleet_proto as pb;
use benchfleet_study::hostlist::HostList;
use benchfleet_study::matrix::Strategy;
use benchfleet_study::report::{self, Format, doc::ReportDoc};
use clap::Subcommand;

use super::{
    Cli, EXIT_FAILED_JOBS, Target, announce, data_dir, document, follow, need_controller, note_datasets, open_store,
    remote, whoami,
};
use crate::client;

#[derive(Subcommand, Debug)]
pub enum FleetCommand {
    /// Run a matrix's one configuration on every eligible host (or GPU) at once and say which hosts are not
    /// like their peers. Exit 0 when every target it ran on is ok (hosts left out, such as drained ones, are
    /// listed and do not change it), 1 when any is warn, outlier or unstable or cannot be judged (too few
    /// peers, failed jobs), 2 on bad input.
    Check {
        matrix: PathBuf,
        /// A job per host, or per GPU (each disjoint set of the matrix's gpus_per_job); default: the
        /// matrix's fleet.per, else host.
        #[arg(long, value_parser = ["host", "gpu"])]
        per: Option<String>,
        /// Only these hosts (agent names): a comma-separated list with `*` and `?` wildcards and numeric
        /// ranges as in Slurm (`gpu[01-16,20]`), a leading `!` leaving hosts out (`gpu[01-64],!gpu07`).
        #[arg(long, value_name = "LIST", value_parser = parse_hosts)]
        hosts: Option<HostList>,
        /// Drain every outlier host, its verdict as the reason (it finishes what it runs, takes no new work).
        #[arg(long)]
        drain_outliers: bool,
    },
    /// Each target's headline number (the objective on each profile, the median of its repeats) in every
    /// finished fleet check, oldest first, with its verdict; HOST limits it to one host's targets.
    History {
        host: Option<String>,
        /// Only checks of this name (the matrix's `name`).
        #[arg(long)]
        name: Option<String>,
    },
}

fn parse_hosts(text: &str) -> Result<HostList, String> {
    HostList::parse(text)
}

/// `fleet check`: submits the matrix as a fleet check, follows it, prints
/// the report (its fleet section first) and exits by the worst verdict.
pub(super) async fn check(
    controller: Option<&Target>,
    matrix: &Path,
    (per, hosts): (Option<&str>, Option<&HostList>),
    drain_outliers: bool,
    json: bool,
) -> anyhow::Result<i32> {
    let url = need_controller(controller)?;
    let mut sub = client::submission(matrix, None)?;
    sub.request.fleet_per = match (per, sub.matrix.strategy) {
        (Some(per), _) => per.to_owned(),
        (None, Strategy::Fleet) => String::new(),
        (None, _) => "host".to_owned(),
    };
    sub.request.fleet_hosts = hosts.map(ToString::to_string).unwrap_or_default();
    note_datasets(&sub);
    let mut c = client::connect(url).await?;
    let submitted = client::submit(&mut c, sub).await?;
    announce(&submitted);
    let run_id = submitted.run_id.clone();
    follow(url, &run_id, Duration::from_secs(300), json, false).await?;
    let request = pb::GetReportRequest { run_id: run_id.clone(), format: "json".to_owned() };
    let text = client::connect(url).await?.get_report(request).await.map_err(client::status)?.into_inner().text;
    let doc: ReportDoc = serde_json::from_str(&text).context("the controller's report is not a report document")?;
    if json {
        print!("{text}");
    } else {
        print!("{}", report::render_as(&doc, Format::Console));
        println!("run id: {run_id}");
    }
    let Some(fleet) = &doc.fleet else { anyhow::bail!("run {run_id} was not planned as a fleet check") };
    if drain_outliers {
        let mut drained: Vec<&str> = Vec::new();
        for row in fleet.cohorts.iter().flat_map(|c| &c.rows) {
            if row.verdict != Some(benchfleet_study::fleet::Verdict::Outlier) || drained.contains(&row.host.as_str()) {
                continue;
            }
            let said = row.metrics.first().map_or_else(String::new, |j| {
                format!(": {} on {} {:+.1}% from its cohort", j.metric, j.profile, j.deviation_pct)
            });
            let reason = format!("fleet check run {run_id}: {} outlier{said}", row.target);
            let request = pb::DrainAgentRequest { agent: row.host.clone(), reason, by: whoami() };
            let a = remote(controller, async |c| c.drain_agent(request).await).await?;
            eprintln!("drained {} ({}): outlier", a.name, a.agent_id);
            drained.push(&row.host);
        }
    }
    Ok(if fleet.worst() == Some(benchfleet_study::fleet::Verdict::Ok) { 0 } else { EXIT_FAILED_JOBS })
}

/// `fleet history`: every finished fleet check's report, read through the
/// controller or from the local store, one row per target and one column
/// per check.
pub(super) async fn history(
    cli: &Cli,
    controller: Option<&Target>,
    host: Option<&str>,
    name: Option<&str>,
) -> anyhow::Result<i32> {
    let is_check =
        |r: &pb::RunInfo| r.fleet_check && r.state.starts_with("finished") && name.is_none_or(|n| r.name == n);
    let mut docs: Vec<ReportDoc> = Vec::new();
    match controller {
        Some(url) => {
            let mut c = client::connect(url).await?;
            let runs = c.list_runs(pb::ListRunsRequest {}).await.map_err(client::status)?.into_inner().runs;
            for r in runs.iter().filter(|r| is_check(r)) {
                let request = pb::GetReportRequest { run_id: r.run_id.clone(), format: "json".to_owned() };
                let text = c.get_report(request).await.map_err(client::status)?.into_inner().text;
                docs.push(serde_json::from_str(&text).context("the controller's report is not a report document")?);
            }
        }
        None => {
            let store = open_store(&data_dir(cli.data_dir.as_deref()))?;
            for r in benchfleet_controller::convert::run_list(&store)?.iter().filter(|r| is_check(r)) {
                docs.push(document(&store, r.run_id.parse().map_err(anyhow::Error::msg)?, &|_, _| {})?);
            }
        }
    }
    let history = report::fleet::history(&docs, host);
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&history)?);
    } else {
        print!("{}", report::fleet::render_history(&history));
    }
    Ok(0)
}
