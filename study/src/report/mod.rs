//! The run report: one "Serving Benchmark Result" block per (engine
//! configuration, profile), each variant against its engine's baseline (a
//! variant below the matrix's acceptance is reported, never adopted), and
//! every failure with its reason; for a greedy run, the stages and the
//! choice made at each. Built from what is stored of a run alone
//! (`document`, given its measurements as `Measurements`; the controller's
//! `report` reads them from its store), so that `benchfleet report` says
//! the same long after the run, then rendered in
//! one of the formats: console text, the Markdown document of the
//! reference reports, JSON (`doc::ReportDoc`, a versioned schema), CSV
//! rows and a self-contained HTML page with charts.
//!
//! A configuration's repeats on a profile make one block, pooled
//! (`benchfleet_core::pool`): the percentiles of the union of their samples,
//! from the attempts' stored digests; never a mean of percentiles.

pub mod compare;
mod console;
mod csv;
pub mod doc;
pub mod fleet;
mod html;
mod markdown;
pub mod pareto;
mod searches;
pub mod words;

use std::collections::HashMap;

use benchfleet_core::cost::{Cost, Price};
use benchfleet_core::stats::Estimate;
use benchfleet_core::telemetry::{Energy, Series};
use benchfleet_core::{Digest, Summary, pool};

use crate::greedy::{self, Objective, Plan};
use crate::matrix::Strategy;
use crate::model::{AttemptKey, Dataset, Group, Job, JobState, Profile, Progress, Run};
use doc::*;

/// What a report reads beyond a run's groups and jobs: each succeeded
/// attempt's digest (its distributions, to pool repeats) and its
/// telemetry. The controller reads them from its store.
pub trait Measurements {
    type Error;

    /// The digest of a succeeded attempt whose stored summary is `summary`;
    /// the inner error says why there is none (its records are not all
    /// stored), the outer one that reading failed.
    fn digest(&self, attempt: &AttemptKey, summary: &Summary) -> Result<Result<Digest, String>, Self::Error>;

    /// The attempt's telemetry series (none when it kept none).
    fn telemetry(&self, attempt: &AttemptKey) -> Result<Vec<Series>, Self::Error>;
}

/// A rendered console report.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub text: String,
    /// The configuration recommended, if one met the acceptance (validity,
    /// success rate) on the primary profile.
    pub recommended: Option<String>,
}

impl Report {
    /// The console report of a document.
    pub fn of(doc: &ReportDoc) -> Report {
        Report { text: console::render(doc), recommended: doc.recommendation.as_ref().map(|r| r.config.clone()) }
    }
}

/// The formats a report is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Console,
    Markdown,
    Json,
    Csv,
    Html,
}

impl Format {
    pub const NAMES: &'static str = "console, markdown, json, csv or html";

    pub fn parse(name: &str) -> Result<Format, String> {
        match name.to_ascii_lowercase().as_str() {
            "" | "console" | "text" => Ok(Format::Console),
            "markdown" | "md" => Ok(Format::Markdown),
            "json" => Ok(Format::Json),
            "csv" => Ok(Format::Csv),
            "html" => Ok(Format::Html),
            other => Err(format!("unknown report format {other:?}: use {}", Format::NAMES)),
        }
    }

    /// The name `parse` takes for it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Console => "console",
            Format::Markdown => "markdown",
            Format::Json => "json",
            Format::Csv => "csv",
            Format::Html => "html",
        }
    }
}

/// The report in a format.
pub fn render_as(doc: &ReportDoc, format: Format) -> String {
    match format {
        Format::Console => console::render(doc),
        Format::Markdown => markdown::render(doc),
        Format::Json => serde_json::to_string_pretty(doc).expect("a report serializes") + "\n",
        Format::Csv => csv::render(doc),
        Format::Html => html::render(doc),
    }
}

/// Everything the report of a run says, gathered once from the run, all
/// its groups and jobs (as stored), and their measurements.
pub fn document<M: Measurements + ?Sized>(
    run: &Run,
    all_groups: &[Group],
    stored_jobs: &[Job],
    measured: &M,
) -> Result<ReportDoc, M::Error> {
    // A greedy run measures some configurations again in its final stage,
    // in groups of their own: the report shows each configuration once.
    let mut groups: Vec<Group> = Vec::new();
    for g in all_groups {
        if !groups.iter().any(|seen| seen.config.name == g.config.name) {
            groups.push(g.clone());
        }
    }
    let group_of: HashMap<u64, u64> = all_groups
        .iter()
        .map(|g| (g.id, groups.iter().find(|seen| seen.config.name == g.config.name).map_or(g.id, |seen| seen.id)))
        .collect();
    let progress = Progress::of(stored_jobs);
    let jobs: Vec<Job> = stored_jobs
        .iter()
        .cloned()
        .map(|mut j| {
            j.group = group_of.get(&j.group).copied().unwrap_or(j.group);
            j
        })
        .collect();
    // The stored matrix was valid when it was submitted; its files are not
    // needed to read its acceptance.
    let matrix = crate::matrix::reparse(&run.matrix_file, &run.matrix_yaml, &|_| Some(String::new())).ok();
    let objective = Objective::of(matrix.as_ref().map_or("", |m| m.objective.as_str()));
    // Blocks are measured at a fixed load: a capacity is a search's.
    let ranked = objective.for_blocks();
    let min_success_rate = matrix.as_ref().map_or(1.0, |m| m.min_success_rate);
    let min_effect = matrix.as_ref().map_or(crate::matrix::DEFAULT_MIN_EFFECT, |m| m.min_effect);

    let profile_list = profile_order(&jobs, matrix.as_ref());
    let primary = matrix
        .as_ref()
        .map(|m| m.primary_profile.clone())
        .or_else(|| profile_list.first().map(|p| p.name.clone()))
        .unwrap_or_default();
    let mut profiles: Vec<ProfileInfo> = profile_list.iter().map(|p| profile_info(p, p.name == primary)).collect();
    // A run stored before its jobs named their sweep: the matrix says.
    for info in profiles.iter_mut().filter(|p| p.sweep_of.is_none()) {
        info.sweep_of = matrix.as_ref().and_then(|m| m.profiles.iter().find(|q| q.name == info.name)?.sweep_of.clone());
    }

    let price = (matrix.as_ref().and_then(|m| m.cost.as_ref()), matrix.as_ref().map_or(1, |m| m.gpus_per_job));
    let mut configurations = Vec::with_capacity(groups.len());
    for group in &groups {
        let mut blocks = Vec::new();
        for profile in &profiles {
            let of_profile: Vec<&Job> =
                jobs.iter().filter(|j| j.group == group.id && j.profile.name == profile.name).collect();
            if !of_profile.is_empty() {
                blocks.push(block(measured, &profile.name, &of_profile, price)?);
            }
        }
        let c = &group.config;
        configurations.push(Configuration {
            name: c.name.clone(),
            engine: c.engine.clone(),
            kind: c.kind.as_str().to_owned(),
            variants: c.variants.clone(),
            stage: group.stage,
            model: c.model.clone(),
            image: c.image.clone(),
            runtime: c.runtime.as_str().to_owned(),
            args: c.args.clone(),
            serve_command: c.serve_command(),
            blocks,
        });
    }

    let (stages, greedy_outcome) = match matrix.as_ref().filter(|m| m.strategy == Strategy::Greedy) {
        Some(m) => {
            let (stages, outcome) =
                greedy_stages(m, (all_groups, stored_jobs), &configurations, (ranked, &primary), min_success_rate);
            (stages, Some(outcome))
        }
        None => (Vec::new(), None),
    };

    let searches = matrix.as_ref().map(|m| searches::gather(m, &groups, &jobs)).unwrap_or_default();
    let fixed: Vec<ProfileInfo> =
        profiles.iter().filter(|p| p.search.is_none() && p.probe_of.is_none()).cloned().collect();
    let mut comparisons = comparisons(&configurations, &fixed, (min_success_rate, min_effect), ranked);
    comparisons.extend(searches::comparisons(&searches, &configurations, min_effect));
    let winner = greedy_outcome.as_ref().and_then(|g| g.chosen.as_deref());
    let recommendation = matrix.as_ref().and_then(|m| match searches.iter().find(|s| s.primary) {
        Some(s) if objective == Objective::Capacity => {
            searches::recommendation(s, &configurations, &profiles, (ranked, m.min_effect), winner)
        }
        _ => recommendation(&configurations, &fixed, &primary, (m.min_success_rate, m.min_effect), ranked, winner),
    });

    let gpus = |config: &str| groups.iter().find(|g| g.config.name == config).map_or(1, |g| g.gpus_per_job);
    let pareto = pareto::gather(&profiles, &configurations, &gpus, min_success_rate);
    let setup = setup_of(&configurations);
    let fleet = run.fleet.as_ref().map(|f| {
        let thresholds = matrix.as_ref().and_then(|m| m.fleet.as_ref()).map(|f| f.thresholds).unwrap_or_default();
        fleet::gather(f, thresholds, (all_groups, stored_jobs), objective, &primary)
    });

    Ok(ReportDoc {
        schema: SCHEMA.to_owned(),
        generated_by: format!("benchfleet {}", env!("CARGO_PKG_VERSION")),
        run: RunInfo {
            id: run.id.0,
            name: run.name.clone(),
            matrix_file: run.matrix_file.clone(),
            state: match run.state {
                crate::model::RunState::Running => "running",
                crate::model::RunState::Finished => "finished",
                crate::model::RunState::Cancelled => "cancelled",
            }
            .to_owned(),
            created_unix_ms: run.created_unix_ms,
            ended_unix_ms: run.ended_unix_ms,
            jobs_total: progress.total,
            jobs_succeeded: progress.succeeded,
            jobs_failed: progress.failed,
            strategy: match matrix.as_ref().map(|m| m.strategy) {
                Some(Strategy::Greedy) => "greedy",
                _ if run.fleet.is_some() => "fleet",
                _ => "grid",
            }
            .to_owned(),
            objective: objective.name().to_owned(),
            primary_profile: primary,
            min_success_rate,
            min_effect,
            repeats: matrix.as_ref().map_or(1, |m| m.repeats),
            confirm_repeats: matrix.as_ref().and_then(|m| m.confirm_repeats),
        },
        setup,
        profiles,
        configurations,
        stages,
        greedy: greedy_outcome,
        comparisons,
        recommendation,
        searches,
        fleet,
        pareto,
    })
}

/// The profiles a run's jobs ran, a search's with its probes, in the
/// matrix's order (a greedy run measures the primary one first), each
/// search's probes after it by their load.
fn profile_order<'a>(jobs: &'a [Job], matrix: Option<&'a crate::matrix::Matrix>) -> Vec<&'a Profile> {
    let mut profile_list: Vec<&Profile> = Vec::new();
    for j in jobs {
        if !profile_list.iter().any(|p| p.name == j.profile.name) {
            profile_list.push(&j.profile);
        }
    }
    // A search profile that was probed is listed with its probes.
    if let Some(m) = matrix {
        for (p, _) in m.searches() {
            if profile_list.iter().any(|q| q.probe.as_ref().is_some_and(|probe| probe.search == p.name)) {
                profile_list.push(p);
            }
        }
    }
    // In the matrix's order (a greedy run measures the primary one first),
    // each search's probes after it by their load.
    if let Some(m) = matrix {
        profile_list.sort_by(|a, b| {
            let key = |p: &Profile| {
                let name = p.probe.as_ref().map_or(&p.name, |probe| &probe.search);
                let at = m.profiles.iter().position(|q| q.name == *name).unwrap_or(usize::MAX);
                (at, p.probe.as_ref().map_or(f64::MIN, |probe| probe.point))
            };
            let (ka, kb) = (key(a), key(b));
            ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
        });
    }
    profile_list
}

/// A greedy run's stages, each with its decisions and a sentence, and how
/// the procedure stands.
fn greedy_stages(
    m: &crate::matrix::Matrix,
    (all_groups, stored_jobs): (&[Group], &[Job]),
    configurations: &[Configuration],
    (ranked, primary): (Objective, &str),
    min_success_rate: f64,
) -> (Vec<StageInfo>, GreedyOutcome) {
    let mut stages = Vec::new();
    let planned = greedy::plan(m, &greedy::Results::of(all_groups, stored_jobs, m));
    for d in &planned.decisions {
        if stages.last().is_none_or(|s: &StageInfo| s.number != d.stage) {
            let mut measured: Vec<String> = Vec::new();
            for g in all_groups.iter().filter(|g| g.stage == d.stage) {
                if !measured.contains(&g.config.name) {
                    measured.push(g.config.name.clone());
                }
            }
            stages.push(StageInfo {
                number: d.stage,
                title: stage_title(d.stage, m.cumulative).to_owned(),
                decisions: Vec::new(),
                configurations: measured,
                summary: None,
            });
        }
        if let Some(s) = stages.last_mut() {
            s.decisions.push(Decision { config: d.config.clone(), verdict: d.verdict.clone() });
        }
    }
    let cumulative = m.cumulative;
    let outcome = match planned.plan {
        Plan::Next(next) => {
            GreedyOutcome { running_stage: Some(next.number), chosen: None, reason: String::new(), cumulative }
        }
        Plan::Done(outcome) => {
            GreedyOutcome { running_stage: None, chosen: outcome.winner, reason: outcome.reason, cumulative }
        }
    };
    // A stage in a sentence: what it decided between (stage 3 holds the
    // best single variant against its combinations).
    for s in &mut stages {
        let decided: Vec<String> = s.decisions.iter().map(|d| d.config.clone()).collect();
        s.summary = words::stage_sentence(ranked, configurations, &decided, primary, min_success_rate);
    }
    (stages, outcome)
}

/// The models, engines (their images, versions and digests), GPUs and
/// hosts the configurations ran on.
fn setup_of(configurations: &[Configuration]) -> Setup {
    let mut setup = Setup::default();
    for c in configurations {
        push_new(&mut setup.models, &c.model);
        match setup.engines.iter_mut().find(|e| e.name == c.engine) {
            Some(e) => {
                if !c.image.is_empty() {
                    push_new(&mut e.images, &c.image);
                }
            }
            None => setup.engines.push(EngineInfo {
                name: c.engine.clone(),
                kind: c.kind.clone(),
                runtime: c.runtime.clone(),
                images: if c.image.is_empty() { Vec::new() } else { vec![c.image.clone()] },
                versions: Vec::new(),
                image_digests: Vec::new(),
            }),
        }
        for r in c.blocks.iter().flat_map(|b| &b.repeats) {
            if let Some(e) = setup.engines.iter_mut().find(|e| e.name == c.engine) {
                if let Some(v) = &r.provenance.engine_version {
                    push_new(&mut e.versions, v);
                }
                if let Some(d) = &r.provenance.image_digest {
                    push_new(&mut e.image_digests, d);
                }
            }
            for g in &r.provenance.gpus {
                push_new(&mut setup.gpus, g);
            }
            if let Some(h) = &r.provenance.host {
                push_new(&mut setup.hosts, h);
            }
        }
    }
    setup
}

fn push_new(list: &mut Vec<String>, item: &str) {
    if !list.iter().any(|s| s == item) {
        list.push(item.to_owned());
    }
}

/// What a greedy stage does; a cumulative run's stage 3 tries every variant.
pub(crate) fn stage_title(stage: u32, cumulative: bool) -> &'static str {
    match stage {
        1 => "each engine at its defaults",
        2 => "each variant alone",
        3 if cumulative => "each variant on top of the configuration kept so far",
        3 => "the helping variants combined",
        _ => "the winner and the baseline on every profile",
    }
}

/// The percentiles of the distributions a block keeps for charts.
const CHART_PERCENTILES: [f64; 22] = [
    1.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0, 55.0, 60.0, 65.0, 70.0, 75.0, 80.0, 85.0, 90.0,
    95.0, 99.0, 99.9,
];

/// One configuration on one profile: every repeat with its provenance,
/// and the successful ones pooled from their digests (each repeat's read
/// as `Measurements` gives it: from the store, or built from its records).
/// `price`: the matrix's GPU-hour price, if any, and the GPUs a job has
/// where its fingerprint does not list them.
fn block<M: Measurements + ?Sized>(
    measured: &M,
    profile: &str,
    jobs: &[&Job],
    price: (Option<&Price>, u32),
) -> Result<Block, M::Error> {
    let done: Vec<(&Job, &Summary)> = jobs
        .iter()
        .filter(|j| j.state == JobState::Succeeded)
        .filter_map(|j| j.summary.as_ref().map(|s| (*j, s)))
        .collect();
    let summaries: Vec<&Summary> = done.iter().map(|(_, s)| *s).collect();
    // The inner error says why the repeats cannot be pooled (a repeat's
    // records are not all stored); the outer one is the reader's.
    let mut digests = Vec::with_capacity(done.len());
    let mut missing = None;
    for (j, s) in &done {
        match measured.digest(&j.key(), s)? {
            Ok(d) => digests.push(d),
            Err(why) => {
                missing = Some(why);
                break;
            }
        }
    }
    let (pooled, not_pooled) = match (&missing, summaries.len()) {
        // One repeat is its own block, digest or not.
        (_, 0 | 1) => (pool(&summaries, None), None),
        (Some(why), _) => (None, Some(why.clone())),
        (None, _) => (pool(&summaries, Some(&digests.iter().collect::<Vec<_>>())), None),
    };
    let (mut ttft_ms, mut itl_ms) = (Vec::new(), Vec::new());
    if missing.is_none()
        && let Some(first) = digests.first()
    {
        let mut all = first.clone();
        for d in &digests[1..] {
            all.merge(d);
        }
        ttft_ms = all.ttft.distribution(1e6, &CHART_PERCENTILES).percentiles;
        itl_ms = all.itl.distribution(1e6, &CHART_PERCENTILES).percentiles;
    }
    let telemetry = match done.first() {
        Some((j, _)) => {
            measured.telemetry(&j.key())?.into_iter().filter(|s| TELEMETRY_CHARTED.contains(&s.name.as_str())).collect()
        }
        None => Vec::new(),
    };
    let repeats = jobs
        .iter()
        .map(|j| Repeat {
            job: j.id,
            repeat: j.repeat,
            state: j.state.as_str().to_owned(),
            summary: j.summary.clone().filter(|_| j.state == JobState::Succeeded),
            error: j.error.clone().filter(|_| j.state != JobState::Succeeded),
            log_tail: j.log_tail.clone().filter(|_| j.state != JobState::Succeeded),
            provenance: provenance(j),
        })
        .collect();
    Ok(Block {
        profile: profile.to_owned(),
        pooled,
        not_pooled,
        intervals: intervals(&summaries),
        ttft_ms,
        itl_ms,
        telemetry,
        energy: energy(&done),
        cost: cost(&done, price),
        prefix_cache_hit_rate: prefix_cache_hit_rate(&done),
        repeats,
    })
}

/// The successful repeats' prefix cache hits over lookups, summed; `None`
/// unless every one of them counted some.
fn prefix_cache_hit_rate(done: &[(&Job, &Summary)]) -> Option<f64> {
    let (mut hits, mut queries) = (0.0, 0.0);
    for (j, _) in done {
        let (h, q) = j.telemetry.as_ref()?.prefix_cache()?;
        (hits, queries) = (hits + h, queries + q);
    }
    (queries > 0.0).then(|| hits / queries)
}

/// What the successful repeats' GPU time cost: each repeat's GPUs (as
/// fingerprinted, else the matrix's per job) over its load run, at the
/// price its agent said (`--gpu-hour-price`), else the matrix's; `None`
/// when a repeat has neither, or the prices' currencies differ.
fn cost(done: &[(&Job, &Summary)], (matrix_price, gpus_per_job): (Option<&Price>, u32)) -> Option<Cost> {
    let parts = done
        .iter()
        .map(|(j, s)| {
            let gpus = if j.gpu_fingerprint.is_empty() { gpus_per_job as usize } else { j.gpu_fingerprint.len() };
            let price = j.attempts.last().and_then(|a| a.price.as_ref()).or(matrix_price)?;
            Some((price, gpus as f64 * s.duration_s))
        })
        .collect::<Option<Vec<(&Price, f64)>>>()?;
    let tokens = |f: fn(&Summary) -> u64| done.iter().map(|(_, s)| f(s)).sum();
    Cost::of_parts(&parts, tokens(|s| s.total_input_tokens), tokens(|s| s.total_output_tokens))
}

/// The successful repeats' GPU energy as one: their joules, durations and
/// output tokens summed; `None` unless every one of them knows its joules.
fn energy(done: &[(&Job, &Summary)]) -> Option<Energy> {
    let (mut joules, mut duration_ms, mut tokens) = (0.0, 0, 0);
    for (j, s) in done {
        let t = j.telemetry.as_ref()?;
        joules += t.energy_j?;
        duration_ms += t.energy_duration_ms?;
        tokens += s.total_output_tokens;
    }
    Energy::of(joules, duration_ms as f64 / 1000.0, tokens)
}

fn provenance(j: &Job) -> Provenance {
    let attempt = j.current();
    let p = &j.profile;
    let rate = p.rate.map_or("all at once".to_owned(), |r| format!("{} req/s", words::number(r)));
    let arrival = match p.arrival {
        crate::model::Arrival::Constant => "constant",
        crate::model::Arrival::Poisson => "poisson",
    };
    let mut load = format!("{rate}, {arrival} arrivals, seed {}", p.seed);
    if let Some(c) = p.max_concurrency {
        load.push_str(&format!(", at most {c} in flight"));
    }
    Provenance {
        host: attempt.map(|a| a.agent_name.clone()).filter(|n| !n.is_empty()),
        attempt: j.attempt,
        started_unix_ms: attempt.map(|a| a.started_unix_ms),
        ended_unix_ms: attempt.and_then(|a| a.ended_unix_ms),
        gpus: j.gpu_fingerprint.clone(),
        engine_startup_s: j.engine_startup_s,
        prefix_cache: j.prefix_cache.clone(),
        dataset: dataset_words(&p.dataset),
        load,
        invalid: j.summary.as_ref().and_then(|s| s.invalid.clone()),
        token_counts: j.summary.as_ref().and_then(|s| s.usage_check).and_then(|u| u.describe()),
        engine_version: j.engine_version.clone(),
        image_digest: j.image_digest.clone(),
        loadgen_version: j.loadgen_version.clone(),
        reproduce: reproduce(j),
        throttled: j.throttle_flags(),
        peak_gpu_memory_bytes: j.peak_gpu_memory_bytes(),
        telemetry: j.telemetry.clone(),
    }
}

/// The flags of loadgen's run that tie it to the fleet: the stream of its
/// records to the controller, and the outcome file the agent reads.
const FLEET_FLAGS: [&str; 8] = [
    "--report-to",
    "--run-id",
    "--job",
    "--attempt",
    "--epoch",
    "--report-buffer-mib",
    "--report-ca",
    "--outcome-file",
];

/// The standalone `benchfleet-loadgen` command that sends a job's load
/// again: the arguments the agent ran it with (one mapping, the agent's),
/// without those that stream to the controller, against `$ENGINE_URL`, with
/// the matrix's names for the dataset and tokenizer files in place of the
/// agent's cached copies.
pub fn reproduce(j: &Job) -> Option<String> {
    if j.loadgen_args.is_empty() {
        return None;
    }
    let mut words = vec!["benchfleet-loadgen".to_owned()];
    let mut args = j.loadgen_args.iter();
    while let Some(a) = args.next() {
        if FLEET_FLAGS.contains(&a.as_str()) {
            args.next();
            continue;
        }
        if a == "--quiet" || a == "--report-insecure" {
            continue;
        }
        let value = match a.as_str() {
            "--base-url" => Some("\"$ENGINE_URL\"".to_owned()),
            "--dataset-path" => j.profile.dataset.file().map(|(file, _)| crate::model::shell_word(file)),
            "--processor" | "--tokenizer" => j.profile.processor.as_ref().map(|p| crate::model::shell_word(&p.file)),
            _ => None,
        };
        words.push(crate::model::shell_word(a));
        if let Some(v) = value {
            args.next();
            words.push(v);
        }
    }
    Some(words.join(" "))
}

fn dataset_words(d: &Dataset) -> String {
    match d {
        Dataset::Random { input_tokens, output_tokens, seed } => {
            format!("random: {input_tokens} input / {output_tokens} output tokens, seed {seed}")
        }
        Dataset::ShareGpt { file, sha256, output_tokens, sessions } => {
            let out = output_tokens.map_or(String::new(), |o| format!(", {o} output tokens"));
            let sessions = sessions.map_or(String::new(), |s| {
                format!(", each conversation a session ({} ms think time)", s.think_time_ms)
            });
            format!("ShareGPT {file} (sha256 {sha256}){out}{sessions}")
        }
        Dataset::SharedPrefix { groups, prefix_tokens, suffix_tokens, output_tokens, seed } => format!(
            "shared prefix: {groups} prefixes of {prefix_tokens} tokens, {suffix_tokens}-token suffixes, \
             {output_tokens} output tokens, seed {seed}"
        ),
        Dataset::Trace { file, sha256, format, speed } => {
            format!("{} trace {file} (sha256 {sha256}) at {}x", format.name(), words::number(*speed))
        }
        Dataset::MultiTurn { turns, user_tokens, output_tokens, think_time_ms, seed } => format!(
            "multi-turn: sessions of {turns} turns, {user_tokens} user / {output_tokens} output tokens a turn, \
             {think_time_ms} ms think time, seed {seed}"
        ),
    }
}

fn profile_info(p: &Profile, primary: bool) -> ProfileInfo {
    let mut parameters: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: String| parameters.push((k.to_owned(), v));
    match &p.dataset {
        Dataset::Random { input_tokens, output_tokens, seed } => {
            set("dataset_name", "random".into());
            set("input_tokens", input_tokens.to_string());
            set("output_tokens", output_tokens.to_string());
            set("dataset_seed", seed.to_string());
        }
        Dataset::ShareGpt { file, output_tokens, sessions, .. } => {
            set("dataset_name", "ShareGPT".into());
            set("dataset_file", file.clone());
            if let Some(o) = output_tokens {
                set("output_tokens", o.to_string());
            }
            if let Some(s) = sessions {
                set("sessions", "each conversation".into());
                set("think_time_ms", s.think_time_ms.to_string());
            }
        }
        Dataset::SharedPrefix { groups, prefix_tokens, suffix_tokens, output_tokens, seed } => {
            set("dataset_name", "shared_prefix".into());
            set("prefix_groups", groups.to_string());
            set("prefix_tokens", prefix_tokens.to_string());
            set("suffix_tokens", suffix_tokens.to_string());
            set("output_tokens", output_tokens.to_string());
            set("dataset_seed", seed.to_string());
        }
        Dataset::Trace { file, format, speed, .. } => {
            set("dataset_name", "trace".into());
            set("dataset_file", file.clone());
            set("trace_format", format.name().into());
            set("trace_speed", words::number(*speed));
        }
        Dataset::MultiTurn { turns, user_tokens, output_tokens, think_time_ms, seed } => {
            set("dataset_name", "multi_turn".into());
            set("turns", turns.to_string());
            set("user_tokens", user_tokens.to_string());
            set("output_tokens", output_tokens.to_string());
            set("think_time_ms", think_time_ms.to_string());
            set("dataset_seed", seed.to_string());
        }
    }
    let searched = |over: crate::slo::Over| p.search.as_ref().is_some_and(|s| s.over == over);
    if searched(crate::slo::Over::Rate) {
        set("request_rate", "searched".into());
    } else {
        set("request_rate", p.rate.map_or("inf".to_owned(), words::number));
    }
    if p.rate.is_some() || searched(crate::slo::Over::Rate) {
        set(
            "arrival",
            match p.arrival {
                crate::model::Arrival::Constant => "constant",
                crate::model::Arrival::Poisson => "poisson",
            }
            .into(),
        );
    }
    set("total_requests", p.requests.to_string());
    if searched(crate::slo::Over::Concurrency) {
        set("max_concurrency", "searched".into());
    } else if let Some(c) = p.max_concurrency {
        set("max_concurrency", c.to_string());
    }
    set(
        "endpoint",
        match p.endpoint {
            crate::model::Endpoint::Completions => "completions",
            crate::model::Endpoint::Chat => "chat",
        }
        .into(),
    );
    set("seed", p.seed.to_string());
    let window = |w: &crate::model::Window| match w {
        crate::model::Window::Requests(n) => format!("{n} requests"),
        crate::model::Window::Seconds(s) => format!("{}s", words::number(*s)),
    };
    if let Some(w) = &p.warmup {
        set("warmup", window(w));
    }
    if let Some(w) = &p.cooldown {
        set("cooldown", window(w));
    }
    if let Some(d) = p.max_duration_s {
        set("max_duration", format!("{}s", words::number(d)));
    }
    if p.ignore_eos {
        set("ignore_eos", "true".into());
    }
    if let Some(b) = &p.extra_body {
        set("extra_body", b.clone());
    }
    if let Some(g) = &p.goodput {
        set("goodput", g.words().join(" "));
    }
    if let Some(t) = &p.processor {
        set("processor", t.file.clone());
    }
    if let Some(s) = &p.search {
        set("search", searches::search_words(s));
    }
    ProfileInfo {
        name: p.name.clone(),
        primary,
        dataset: dataset_words(&p.dataset),
        rate: p.rate,
        arrival: match p.arrival {
            crate::model::Arrival::Constant => "constant",
            crate::model::Arrival::Poisson => "poisson",
        }
        .to_owned(),
        requests: p.requests,
        max_concurrency: p.max_concurrency,
        endpoint: match p.endpoint {
            crate::model::Endpoint::Completions => "completions",
            crate::model::Endpoint::Chat => "chat",
        }
        .to_owned(),
        seed: p.seed,
        parameters,
        search: p.search.as_ref().map(searches::search_words),
        probe_of: p.probe.as_ref().map(|probe| probe.search.clone()),
        sweep_of: p.sweep_of.clone(),
    }
}

/// A headline number: its name in a block, its name for `compare
/// --metric`, which way is better, and its value in a summary.
pub struct Headline {
    pub name: &'static str,
    pub key: &'static str,
    pub higher_is_better: bool,
    pub value: fn(&Summary) -> f64,
}

/// The headline numbers every block's intervals and `compare` cover.
pub const HEADLINE: [Headline; 15] = [
    Headline {
        name: "Request throughput (req/s)",
        key: "request_throughput",
        higher_is_better: true,
        value: |s| s.request_throughput,
    },
    Headline {
        name: "Output token throughput (tok/s)",
        key: "output_throughput",
        higher_is_better: true,
        value: |s| s.output_throughput,
    },
    Headline {
        name: "Total token throughput (tok/s)",
        key: "total_token_throughput",
        higher_is_better: true,
        value: |s| s.total_token_throughput,
    },
    Headline {
        name: "Mean E2E latency (ms)",
        key: "mean_latency_ms",
        higher_is_better: false,
        value: |s| s.latency_s.mean * 1e3,
    },
    Headline {
        name: "Median E2E latency (ms)",
        key: "median_latency_ms",
        higher_is_better: false,
        value: |s| s.latency_s.median * 1e3,
    },
    Headline {
        name: "P99 E2E latency (ms)",
        key: "p99_latency_ms",
        higher_is_better: false,
        value: |s| s.latency_s.p99 * 1e3,
    },
    Headline { name: "Mean TTFT (ms)", key: "mean_ttft_ms", higher_is_better: false, value: |s| s.ttft_ms.mean },
    Headline { name: "Median TTFT (ms)", key: "median_ttft_ms", higher_is_better: false, value: |s| s.ttft_ms.median },
    Headline { name: "P99 TTFT (ms)", key: "p99_ttft_ms", higher_is_better: false, value: |s| s.ttft_ms.p99 },
    Headline { name: "Mean TPOT (ms)", key: "mean_tpot_ms", higher_is_better: false, value: |s| s.tpot_ms.mean },
    Headline { name: "Median TPOT (ms)", key: "median_tpot_ms", higher_is_better: false, value: |s| s.tpot_ms.median },
    Headline { name: "P99 TPOT (ms)", key: "p99_tpot_ms", higher_is_better: false, value: |s| s.tpot_ms.p99 },
    Headline { name: "Mean ITL (ms)", key: "mean_itl_ms", higher_is_better: false, value: |s| s.itl_ms.mean },
    Headline { name: "Median ITL (ms)", key: "median_itl_ms", higher_is_better: false, value: |s| s.itl_ms.median },
    Headline { name: "P99 ITL (ms)", key: "p99_itl_ms", higher_is_better: false, value: |s| s.itl_ms.p99 },
];

/// Each headline number's 95% confidence interval over the repeats: the
/// mean of the repeats' own values, Student's t with n - 1 degrees of
/// freedom. One repeat has none.
fn intervals(repeats: &[&Summary]) -> Vec<Interval> {
    if let [one] = repeats {
        // One run: the interval its own requests give, where they give one.
        let Some(noise) = &one.noise else { return Vec::new() };
        return HEADLINE
            .iter()
            .map(|h| {
                let half_width = noise.se(h.key).map(|(se, df)| {
                    benchfleet_core::stats::t_quantile(1.0 - (1.0 - benchfleet_core::stats::CONFIDENCE) / 2.0, df) * se
                });
                Interval { metric: h.name.to_owned(), mean: (h.value)(one), half_width }
            })
            .collect();
    }
    if repeats.len() < 2 {
        return Vec::new();
    }
    HEADLINE
        .iter()
        .map(|h| {
            let values: Vec<f64> = repeats.iter().map(|s| (h.value)(s)).collect();
            let e = Estimate::of(&values);
            Interval { metric: h.name.to_owned(), mean: e.mean, half_width: e.half_width }
        })
        .collect()
}

/// The objective's name and value as the references' tables show them.
pub(crate) fn objective_metric(objective: Objective) -> (&'static str, fn(&Summary) -> f64) {
    match objective {
        Objective::MeanLatency => ("Mean latency (s)", |s| s.latency_s.mean),
        Objective::OutputThroughput => ("Output TPS", |s| s.output_throughput),
        Objective::TotalTokenThroughput | Objective::Capacity => ("Total TPS", |s| s.total_token_throughput),
    }
}

/// A profile's row of the recommendation's table: the baseline's and the
/// chosen configuration's pooled headline, with the change.
fn before_after(
    objective: Objective,
    profile: &str,
    baseline: Option<&Configuration>,
    best: &Configuration,
) -> BeforeAfter {
    let of =
        |c: &Configuration| c.block(profile).and_then(|b| greedy::Measured::pooled(&b.summaries().collect::<Vec<_>>()));
    let base = baseline.and_then(of);
    let opt = of(best);
    BeforeAfter {
        profile: profile.to_owned(),
        baseline: base.as_ref().map(|b| words::headline(objective, b, None)),
        optimized: opt.as_ref().map(|o| words::headline(objective, o, base.as_ref())),
    }
}

/// The baseline a variant configuration is compared with: its engine's
/// configuration without variants.
fn baseline_of<'a>(configs: &'a [Configuration], c: &Configuration) -> Option<&'a Configuration> {
    configs.iter().find(|b| b.engine == c.engine && b.is_baseline())
}

fn comparisons(
    configs: &[Configuration],
    profiles: &[ProfileInfo],
    (min_success_rate, min_effect): (f64, f64),
    objective: Objective,
) -> Vec<ComparisonRow> {
    let (metric, value) = objective_metric(objective);
    let mut rows = Vec::new();
    for profile in profiles {
        for v in configs.iter().filter(|c| !c.is_baseline()) {
            let Some(base) = baseline_of(configs, v) else { continue };
            // A variant a study never ran on this profile (a stage measures
            // its own profiles) has nothing to say here; one that ran and
            // failed does.
            let Some(s) = v.block(&profile.name) else { continue };
            let (b, s) = (base.block(&profile.name), Some(s));
            let pooled = |blk: Option<&Block>| blk.and_then(|b| pool(&b.summaries().collect::<Vec<_>>(), None));
            let mut row = ComparisonRow {
                profile: profile.name.clone(),
                config: v.name.clone(),
                baseline: base.name.clone(),
                metric: metric.to_owned(),
                value: None,
                baseline_value: None,
                tpot_ms: None,
                baseline_tpot_ms: None,
                verdict: Verdict::NoResult,
                said: "no result to compare".to_owned(),
                difference: None,
                half_width: None,
                steady_state: false,
            };
            if let (Some(bs), Some(ss), Some(bb), Some(sb)) = (pooled(b), pooled(s), b, s) {
                (row.value, row.baseline_value) = (Some(value(&ss)), Some(value(&bs)));
                (row.tpot_ms, row.baseline_tpot_ms) = (Some(ss.tpot_ms.mean), Some(bs.tpot_ms.mean));
                (row.verdict, row.said) = if let Some(why) = &ss.invalid {
                    (Verdict::Invalid, format!("run INVALID: {why}; not adopted"))
                } else if ss.success_rate() < min_success_rate {
                    (Verdict::BelowAcceptance, format!("{}, not adopted", ss.success_said()))
                } else if let Some(why) = &bs.invalid {
                    (Verdict::BaselineInvalid, format!("baseline run INVALID: {why}; not compared"))
                } else {
                    let (base_runs, runs) = (bb.summaries().collect::<Vec<_>>(), sb.summaries().collect::<Vec<_>>());
                    let c = objective.compare(&base_runs, &runs, min_effect);
                    (row.difference, row.half_width) = (Some(c.difference.diff), c.difference.half_width);
                    // The figures beside it are the whole runs': say when the change is not theirs.
                    row.steady_state = objective.in_steady_state(&base_runs) && objective.in_steady_state(&runs);
                    let shown = if row.steady_state { format!("steady state: {}", c.shown) } else { c.shown };
                    match c.verdict {
                        greedy::Verdict::Better => (Verdict::Better, format!("{shown}, better")),
                        greedy::Verdict::WithinNoise => (Verdict::WithinNoise, format!("{shown}, within noise")),
                        greedy::Verdict::Worse => (Verdict::Worse, format!("{shown}, worse")),
                    }
                };
            }
            rows.push(row);
        }
    }
    rows
}

/// The configuration to serve: the best on the primary profile by the
/// matrix's objective, among those whose runs were valid and met the
/// acceptance; for a greedy run, the procedure's winner (which is that best,
/// up to ties). A variant is recommended only when it is better than its
/// engine's acceptable baseline, beyond noise (the greedy winner already is).
fn recommendation(
    configs: &[Configuration],
    profiles: &[ProfileInfo],
    primary: &str,
    (min_success_rate, min_effect): (f64, f64),
    objective: Objective,
    winner: Option<&str>,
) -> Option<Recommendation> {
    let summaries = |c: &Configuration, profile: &str| -> Vec<Summary> {
        c.block(profile).map(|b| b.summaries().cloned().collect()).unwrap_or_default()
    };
    let acceptable = |c: &Configuration| {
        greedy::Measured::pooled(&summaries(c, primary).iter().collect::<Vec<_>>())
            .filter(|m| m.summary.invalid.is_none() && m.summary.success_rate() >= min_success_rate)
    };
    let candidates = configs.iter().filter(|c| winner.is_none_or(|w| c.name == w)).filter_map(|c| {
        let s = acceptable(c)?;
        if winner.is_none()
            && !c.is_baseline()
            && let Some(b) = baseline_of(configs, c).filter(|b| acceptable(b).is_some())
        {
            let (bs, vs) = (summaries(b, primary), summaries(c, primary));
            let cmp = objective.compare(&bs.iter().collect::<Vec<_>>(), &vs.iter().collect::<Vec<_>>(), min_effect);
            if cmp.verdict != greedy::Verdict::Better {
                return None;
            }
        }
        Some((c, s))
    });
    let (best, s) = candidates.max_by(|a, b| objective.score(&a.1).total_cmp(&objective.score(&b.1)))?;
    let baseline = baseline_of(configs, best).filter(|b| b.name != best.name);
    let table = profiles.iter().map(|p| before_after(objective, &p.name, baseline, best)).collect();
    let (serve_command, simulator_flags) = best.published_command();
    Some(Recommendation {
        config: best.name.clone(),
        serve_command,
        simulator_flags,
        profile: primary.to_owned(),
        why: format!("the best {} on profile {primary}", objective.show(&s)),
        baseline: baseline.map(|b| b.name.clone()),
        table,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Dataset, RunId};
    use benchfleet_core::telemetry::{SeriesStats, TelemetrySummary};

    fn job(hits: (f64, f64), queries: (f64, f64)) -> Job {
        let profile = Profile::new("p", Dataset::Random { input_tokens: 8, output_tokens: 8, seed: 0 }, 1);
        let mut j = Job::new(RunId(1), 0, 0, profile, 1);
        let counter = |name: &str, (first, last): (f64, f64)| SeriesStats {
            name: name.into(),
            gpu: String::new(),
            count: 3,
            min: first,
            mean: last,
            max: last,
            first,
            last,
        };
        j.telemetry = Some(TelemetrySummary {
            series: vec![
                counter("vllm:prefix_cache_hits_total", hits),
                counter("vllm:prefix_cache_queries_total", queries),
            ],
            ..TelemetrySummary::default()
        });
        j
    }

    #[test]
    fn a_block_s_prefix_cache_hit_rate_sums_its_repeats_counters() {
        let s = Summary::default();
        let (a, b) = (job((0.0, 300.0), (0.0, 1_000.0)), job((300.0, 1_200.0), (1_000.0, 4_000.0)));
        assert_eq!(prefix_cache_hit_rate(&[(&a, &s), (&b, &s)]), Some(1_200.0 / 4_000.0));
        let mut blind = job((0.0, 0.0), (0.0, 0.0));
        blind.telemetry = None;
        assert_eq!(prefix_cache_hit_rate(&[(&a, &s), (&blind, &s)]), None, "every repeat has it, or none is said");
    }

    #[test]
    fn one_repeat_s_intervals_are_its_own_requests_and_none_where_they_give_none() {
        let mut s = Summary { total_token_throughput: 1000.0, ..Summary::default() };
        s.ttft_ms.mean = 80.0;
        assert!(intervals(&[&s]).is_empty(), "a run too short for its noise");
        s.noise = Some(benchfleet_core::metrics::noise::Noise {
            batches: 10,
            metrics: vec![
                benchfleet_core::metrics::noise::MetricNoise {
                    metric: "total_token_throughput".into(),
                    se: 10.0,
                    batch_means: Vec::new(),
                },
                benchfleet_core::metrics::noise::MetricNoise {
                    metric: "mean_ttft_ms".into(),
                    se: 2.0,
                    batch_means: Vec::new(),
                },
            ],
            batch_requests: Vec::new(),
        });
        let got = intervals(&[&s]);
        let of = |name: &str| got.iter().find(|i| i.metric == name).expect("the metric");
        // t(0.975, 9) = 2.262.
        let tps = of("Total token throughput (tok/s)");
        assert!((tps.mean - 1000.0).abs() < 1e-9 && (tps.half_width.expect("an interval") - 22.62).abs() < 0.01);
        assert!((of("Mean TTFT (ms)").half_width.expect("an interval") - 4.524).abs() < 0.01);
        assert_eq!(of("Mean ITL (ms)").half_width, None);
    }

    #[test]
    fn a_block_s_cost_counts_each_repeat_s_gpus_over_its_run() {
        let price = Price { gpu_hour: 2.0, currency: "USD".into() };
        let s = Summary {
            duration_s: 1_800.0,
            total_input_tokens: 1_000,
            total_output_tokens: 4_000,
            ..Summary::default()
        };
        let mut two = job((0.0, 0.0), (0.0, 0.0));
        two.gpu_fingerprint = vec!["NVIDIA H200".into(), "NVIDIA H200".into()];
        let unlisted = job((0.0, 0.0), (0.0, 0.0));
        // Two GPUs for half an hour, and the matrix's 4 for another.
        let c = cost(&[(&two, &s), (&unlisted, &s)], (Some(&price), 4)).expect("a cost");
        assert!((c.gpu_hours - 3.0).abs() < 1e-12, "{c:?}");
        assert!((c.per_million_output.expect("output") - 6.0 / 8_000.0 * 1e6).abs() < 1e-6, "{c:?}");

        // An agent's own price comes before the matrix's: 4 GPUs for half an
        // hour at 5.00 and 2 at the matrix's 2.00.
        let mut priced = job((0.0, 0.0), (0.0, 0.0));
        let mut attempt = crate::model::AttemptInfo {
            price: Some(Price { gpu_hour: 5.0, currency: "USD".into() }),
            number: 1,
            epoch: 1,
            agent: crate::model::AgentId(1),
            agent_name: "h200-01".into(),
            started_unix_ms: 0,
            ended_unix_ms: Some(1),
            outcome: crate::model::AttemptOutcome::Succeeded,
            reason: None,
            charged: false,
            log_tail: None,
        };
        priced.attempts = vec![attempt.clone()];
        let c = cost(&[(&priced, &s), (&two, &s)], (Some(&price), 4)).expect("a cost");
        assert!((c.gpu_hours - 3.0).abs() < 1e-12 && (c.gpu_hour - 12.0 / 3.0).abs() < 1e-12, "{c:?}");
        // Without the matrix's, a repeat with no price of its own leaves the
        // block without a cost; with only priced repeats it has one.
        assert_eq!(cost(&[(&priced, &s), (&two, &s)], (None, 4)), None);
        assert!(cost(&[(&priced, &s)], (None, 4)).is_some());
        attempt.price = Some(Price { gpu_hour: 5.0, currency: "EUR".into() });
        priced.attempts = vec![attempt];
        assert_eq!(cost(&[(&priced, &s), (&two, &s)], (Some(&price), 4)), None, "two currencies");
    }
}
