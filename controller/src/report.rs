//! The run report: one "Serving Benchmark Result" block per (engine
//! configuration, profile), each variant against its engine's baseline (a
//! variant below the matrix's acceptance is reported, never adopted), and
//! every failure with its reason; for a greedy run, first the stages and
//! the choice made at each. Rendered from the store alone, so that
//! `benchfleet report` prints the same text long after the run.
//!
//! A configuration's repeats on a profile make one block, pooled
//! (`benchfleet_core::pool`): the percentiles of the union of their samples,
//! from the attempts' stored digests; never a mean of percentiles.

use std::fmt::Write as _;

use benchfleet_core::stats::Estimate;
use benchfleet_core::{Digest, Summary, pool, render_block};

use crate::greedy::{self, Objective, Plan};
use crate::matrix::Strategy;
use crate::model::{Group, Job, JobState, Progress, RunId};
use crate::store::{Store, StoreError};

/// A rendered report.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub text: String,
    /// The configuration recommended, if one met the acceptance (validity,
    /// success rate) on the primary profile.
    pub recommended: Option<String>,
}

/// Renders the report of a stored run; the digests it has to build (missing
/// from the store) are kept in memory only.
pub fn render(store: &dyn Store, run_id: RunId) -> Result<Report, StoreError> {
    render_keeping(store, run_id, &|_, _| {})
}

/// Renders the report of a stored run, handing each digest it had to build
/// from records to `keep` (the controller stores them).
pub fn render_keeping(
    store: &dyn Store,
    run_id: RunId,
    keep: &dyn Fn(crate::model::AttemptKey, &Digest),
) -> Result<Report, StoreError> {
    let run = store.run(run_id)?.ok_or_else(|| StoreError::NotFound(format!("run {run_id}")))?;
    let all_groups = store.groups(run_id)?;
    // A greedy run measures some configurations again in its final stage,
    // in groups of their own: the report shows each configuration once.
    let mut groups: Vec<Group> = Vec::new();
    for g in &all_groups {
        if !groups.iter().any(|seen| seen.config.name == g.config.name) {
            groups.push(g.clone());
        }
    }
    let group_of: std::collections::HashMap<u64, u64> = all_groups
        .iter()
        .map(|g| (g.id, groups.iter().find(|seen| seen.config.name == g.config.name).map_or(g.id, |seen| seen.id)))
        .collect();
    let stored_jobs = store.jobs(run_id)?;
    let progress = Progress::of(&stored_jobs);
    let jobs: Vec<Job> = stored_jobs
        .iter()
        .cloned()
        .map(|mut j| {
            j.group = group_of.get(&j.group).copied().unwrap_or(j.group);
            j
        })
        .collect();
    let state = match run.state {
        crate::model::RunState::Running => "running",
        crate::model::RunState::Finished => "finished",
        crate::model::RunState::Cancelled => "cancelled",
    };
    // The stored matrix was valid when it was submitted; its files are not
    // needed to read its acceptance.
    let matrix = crate::matrix::reparse(&run.matrix_file, &run.matrix_yaml, &|_| Some(String::new())).ok();
    let min_success_rate = matrix.as_ref().map_or(1.0, |m| m.min_success_rate);

    let mut out = String::new();
    let _ = writeln!(out, "Run {}: {} ({})", run.id, run.name, run.matrix_file);
    let _ = writeln!(
        out,
        "State: {state}; {} of {} jobs succeeded, {} failed",
        progress.succeeded, progress.total, progress.failed
    );

    let mut profiles: Vec<&str> = Vec::new();
    for j in &jobs {
        if !profiles.contains(&j.profile.name.as_str()) {
            profiles.push(&j.profile.name);
        }
    }

    for group in &groups {
        let _ = writeln!(out, "\n## {}\n", group.config.name);
        let _ = writeln!(out, "Serve command:\n\n{}\n", group.config.serve_command());
        if group.config.runtime == crate::model::RuntimeKind::Docker && !group.config.image.is_empty() {
            let _ = writeln!(out, "Image: {}", group.config.image);
        }
        // The GPUs every number of this configuration was measured on.
        let mut gpus: Vec<&String> = group_jobs(&jobs, group).flat_map(|j| &j.gpu_fingerprint).collect();
        gpus.sort();
        gpus.dedup();
        for gpu in &gpus {
            let _ = writeln!(out, "GPU: {gpu}");
        }
        if !gpus.is_empty() {
            out.push('\n');
        }
        for profile in &profiles {
            let of_profile: Vec<&Job> = group_jobs(&jobs, group).filter(|j| j.profile.name == *profile).collect();
            if of_profile.is_empty() {
                continue;
            }
            let _ = writeln!(out, "Profile: {profile}");
            let repeats = succeeded(&of_profile).count();
            match pooled_block(store, &of_profile, keep)? {
                Ok(Some(s)) => {
                    if repeats > 1 {
                        let _ = writeln!(out, "({repeats} repeats pooled)");
                    }
                    out.push('\n');
                    out.push_str(&render_block(&s));
                    intervals(&mut out, &succeeded(&of_profile).collect::<Vec<_>>());
                }
                Ok(None) => {
                    let _ = writeln!(out, "\nno successful repeat");
                }
                // Never a block of guessed percentiles: each repeat's own.
                Err(why) => {
                    let _ = writeln!(out, "(the {repeats} repeats cannot be pooled: {why}; each is shown alone)");
                    for j in of_profile.iter().filter(|j| j.state == JobState::Succeeded) {
                        if let Some(s) = &j.summary {
                            let _ = writeln!(out, "\nrepeat {}:\n", j.repeat);
                            out.push_str(&render_block(s));
                        }
                    }
                }
            }
            for j in of_profile.iter().filter(|j| j.state == JobState::Succeeded) {
                if let Some(warm) = j.prefix_cache.as_deref().filter(|c| c.starts_with("warm")) {
                    let _ = writeln!(out, "\nrepeat {} ran with its prefix cache {warm}", j.repeat);
                }
                if let Some(said) = j.summary.as_ref().and_then(|s| s.usage_check).and_then(|u| u.describe()) {
                    let _ = writeln!(out, "\nrepeat {}: token counts disagree: {said}", j.repeat);
                }
            }
            for j in of_profile.iter().filter(|j| j.state != JobState::Succeeded) {
                let _ = writeln!(
                    out,
                    "\nrepeat {} {}: {}",
                    j.repeat,
                    state_word(j.state),
                    j.error.as_deref().unwrap_or("no reason given")
                );
                if let Some(tail) = &j.log_tail {
                    let _ = writeln!(out, "last engine log lines:\n{tail}");
                }
            }
            out.push('\n');
        }
    }

    let mut winner = None;
    if let Some(m) = matrix.as_ref().filter(|m| m.strategy == Strategy::Greedy) {
        let planned = greedy::plan(m, &greedy::Results::of(&all_groups, &stored_jobs, &m.primary_profile));
        let _ = writeln!(out, "## Greedy stages\n");
        let mut stage = 0;
        for d in &planned.decisions {
            if d.stage != stage {
                stage = d.stage;
                let _ = writeln!(out, "Stage {stage}: {}", stage_title(stage));
            }
            let _ = writeln!(out, "  {:<40} {}", d.config, d.verdict);
        }
        match planned.plan {
            Plan::Next(next) => {
                let _ = writeln!(out, "Stage {} ({}) is running", next.number, stage_title(next.number));
            }
            Plan::Done(outcome) => {
                let chosen = outcome.winner.as_deref().map_or(String::new(), |w| format!("{w}: "));
                let _ = writeln!(out, "Chosen: {chosen}{}", outcome.reason);
                winner = outcome.winner;
            }
        }
        out.push('\n');
    }

    let objective = Objective::of(matrix.as_ref().map_or("", |m| m.objective.as_str()));
    let min_effect = matrix.as_ref().map_or(crate::matrix::DEFAULT_MIN_EFFECT, |m| m.min_effect);
    comparison(&mut out, &groups, &jobs, &profiles, (min_success_rate, min_effect), objective);
    let recommended = match &matrix {
        Some(m) => recommendation(&mut out, &groups, &jobs, m, winner.as_deref()),
        None => None,
    };
    if recommended.is_none() {
        let _ = writeln!(
            out,
            "## No recommendation\n\nNo configuration met the acceptance (a valid run and the success rate) on the primary profile."
        );
    }
    Ok(Report { text: out, recommended })
}

fn stage_title(stage: u32) -> &'static str {
    match stage {
        1 => "each engine at its defaults",
        2 => "each variant alone",
        3 => "the helping variants combined",
        _ => "the winner and the baseline on every profile",
    }
}

fn group_jobs<'a>(jobs: &'a [Job], group: &'a Group) -> impl Iterator<Item = &'a Job> {
    jobs.iter().filter(move |j| j.group == group.id)
}

fn succeeded<'a>(jobs: &'a [&'a Job]) -> impl Iterator<Item = &'a Summary> {
    jobs.iter().filter(|j| j.state == JobState::Succeeded).filter_map(|j| j.summary.as_ref())
}

/// The successful repeats' block, pooled, with every distribution: each
/// repeat's digest read from the store, or built from its records. The
/// inner error says why they cannot be pooled (a repeat's records are not
/// all stored); the outer one is the store's.
fn pooled_block(
    store: &dyn Store,
    jobs: &[&Job],
    keep: &dyn Fn(crate::model::AttemptKey, &Digest),
) -> Result<Result<Option<Summary>, String>, StoreError> {
    let done: Vec<(&Job, &Summary)> = jobs
        .iter()
        .filter(|j| j.state == JobState::Succeeded)
        .filter_map(|j| j.summary.as_ref().map(|s| (*j, s)))
        .collect();
    let summaries: Vec<&Summary> = done.iter().map(|(_, s)| *s).collect();
    if summaries.len() <= 1 {
        return Ok(Ok(pool(&summaries, None)));
    }
    let mut digests = Vec::with_capacity(done.len());
    for (j, s) in &done {
        match crate::digests::get_or_build(store, &j.key(), s, keep) {
            Ok(d) => digests.push(d),
            Err(StoreError::Invalid(why)) => return Ok(Err(why)),
            Err(e) => return Err(e),
        }
    }
    Ok(Ok(pool(&summaries, Some(&digests.iter().collect::<Vec<_>>()))))
}

/// The successful repeats pooled for their throughputs, means and success
/// rate (no percentiles: no digest is read).
pub fn pooled(jobs: &[&Job]) -> Option<Summary> {
    pool(&succeeded(jobs).collect::<Vec<_>>(), None)
}

fn state_word(s: JobState) -> &'static str {
    match s {
        JobState::Failed => "failed",
        JobState::Succeeded => "succeeded",
        JobState::Cancelled => "cancelled",
        _ => "did not finish",
    }
}

/// Each variant configuration against its engine's baseline, per profile.
/// Each headline number's 95% confidence interval over the repeats: the
/// mean of the repeats' own values, Student's t with n - 1 degrees of
/// freedom. One repeat has none, and the report says so.
fn intervals(out: &mut String, repeats: &[&Summary]) {
    if repeats.len() < 2 {
        let _ = writeln!(out, "One repeat: no confidence intervals.");
        return;
    }
    type Number = (&'static str, fn(&Summary) -> f64);
    let numbers: [Number; 15] = [
        ("Request throughput (req/s)", |s| s.request_throughput),
        ("Output token throughput (tok/s)", |s| s.output_throughput),
        ("Total token throughput (tok/s)", |s| s.total_token_throughput),
        ("Mean E2E latency (ms)", |s| s.latency_s.mean * 1e3),
        ("Median E2E latency (ms)", |s| s.latency_s.median * 1e3),
        ("P99 E2E latency (ms)", |s| s.latency_s.p99 * 1e3),
        ("Mean TTFT (ms)", |s| s.ttft_ms.mean),
        ("Median TTFT (ms)", |s| s.ttft_ms.median),
        ("P99 TTFT (ms)", |s| s.ttft_ms.p99),
        ("Mean TPOT (ms)", |s| s.tpot_ms.mean),
        ("Median TPOT (ms)", |s| s.tpot_ms.median),
        ("P99 TPOT (ms)", |s| s.tpot_ms.p99),
        ("Mean ITL (ms)", |s| s.itl_ms.mean),
        ("Median ITL (ms)", |s| s.itl_ms.median),
        ("P99 ITL (ms)", |s| s.itl_ms.p99),
    ];
    let _ = writeln!(
        out,
        "95% confidence intervals of the {} repeats' own values (Student's t, {} degrees of freedom):",
        repeats.len(),
        repeats.len() - 1
    );
    for (name, value) in numbers {
        let values: Vec<f64> = repeats.iter().map(|s| value(s)).collect();
        let e = Estimate::of(&values);
        let _ = writeln!(out, "  {:<34} {:.2} ± {:.2}", format!("{name}:"), e.mean, e.half_width.unwrap_or(0.0));
    }
}

fn comparison(
    out: &mut String,
    groups: &[Group],
    jobs: &[Job],
    profiles: &[&str],
    (min_success_rate, min_effect): (f64, f64),
    objective: Objective,
) {
    let variants: Vec<&Group> = groups.iter().filter(|g| !g.config.variants.is_empty()).collect();
    if variants.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Against the baseline\n");
    for profile in profiles {
        let _ = writeln!(out, "Profile: {profile}");
        for v in &variants {
            let Some(base) = groups.iter().find(|g| g.config.engine == v.config.engine && g.config.variants.is_empty())
            else {
                continue;
            };
            let of_profile = |group: u64| -> Vec<&Job> {
                jobs.iter().filter(|j| j.group == group && j.profile.name == *profile).collect()
            };
            let (base_jobs, variant_jobs) = (of_profile(base.id), of_profile(v.id));
            let line = match (pooled(&base_jobs), pooled(&variant_jobs)) {
                (Some(b), Some(s)) => {
                    let verdict = if let Some(why) = &s.invalid {
                        format!("run INVALID: {why}; not adopted")
                    } else if s.success_rate() < min_success_rate {
                        format!("success rate {:.1}%, not adopted", s.success_rate() * 100.0)
                    } else if let Some(why) = &b.invalid {
                        format!("baseline run INVALID: {why}; not compared")
                    } else {
                        let c = objective.compare(
                            &succeeded(&base_jobs).collect::<Vec<_>>(),
                            &succeeded(&variant_jobs).collect::<Vec<_>>(),
                            min_effect,
                        );
                        match c.verdict {
                            greedy::Verdict::Better => format!("{}, better", c.shown),
                            greedy::Verdict::WithinNoise => format!("{}, within noise", c.shown),
                            greedy::Verdict::Worse => format!("{}, worse", c.shown),
                        }
                    };
                    let (name, value): (&str, fn(&Summary) -> f64) = match objective {
                        Objective::MeanLatency => ("Mean latency (s)", |s| s.latency_s.mean),
                        Objective::OutputThroughput => ("Output TPS", |s| s.output_throughput),
                        Objective::TotalTokenThroughput => ("Total TPS", |s| s.total_token_throughput),
                    };
                    format!(
                        "{name}: {:.2} ({verdict}) Mean TPOT(ms): {:.2} | baseline {name}: {:.2} Mean TPOT(ms): {:.2}",
                        value(&s),
                        s.tpot_ms.mean,
                        value(&b),
                        b.tpot_ms.mean
                    )
                }
                _ => "no result to compare".to_owned(),
            };
            let _ = writeln!(out, "  {:<40} {line}", v.config.name);
        }
        out.push('\n');
    }
}

/// The configuration to serve: the best on the primary profile by the
/// matrix's objective, among those whose runs were valid and met the
/// acceptance; for a greedy run, the procedure's winner (which is that best,
/// up to ties).
fn recommendation(
    out: &mut String,
    groups: &[Group],
    jobs: &[Job],
    matrix: &crate::matrix::Matrix,
    winner: Option<&str>,
) -> Option<String> {
    let profile = matrix.primary_profile.as_str();
    let objective = Objective::of(&matrix.objective);
    let of = |id: u64| -> Vec<&Job> { jobs.iter().filter(|j| j.group == id && j.profile.name == profile).collect() };
    let acceptable =
        |id: u64| pooled(&of(id)).filter(|s| s.invalid.is_none() && s.success_rate() >= matrix.min_success_rate);
    let candidates = groups.iter().filter(|g| winner.is_none_or(|w| g.config.name == w)).filter_map(|g| {
        let s = acceptable(g.id)?;
        // A variant is recommended only when it is better than its engine's
        // acceptable baseline, beyond noise (the greedy winner already is).
        let baseline = groups.iter().find(|b| b.config.engine == g.config.engine && b.config.variants.is_empty());
        if winner.is_none()
            && !g.config.variants.is_empty()
            && let Some(b) = baseline.filter(|b| acceptable(b.id).is_some())
        {
            let (bj, vj) = (of(b.id), of(g.id));
            let c = objective.compare(
                &succeeded(&bj).collect::<Vec<_>>(),
                &succeeded(&vj).collect::<Vec<_>>(),
                matrix.min_effect,
            );
            if c.verdict != greedy::Verdict::Better {
                return None;
            }
        }
        Some((g, s))
    });
    let (best, s) = candidates.max_by(|a, b| objective.score(&a.1).total_cmp(&objective.score(&b.1)))?;
    let _ = writeln!(
        out,
        "## Recommended
"
    );
    let _ = writeln!(
        out,
        "{}
",
        best.config.serve_command()
    );
    let value = objective.show(&s);
    let _ = writeln!(
        out,
        "({}: the best {value} on profile {profile} among the configurations that met the acceptance; a variant within noise of its baseline is not recommended)",
        best.config.name
    );
    Some(best.config.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Dataset, EngineConfig, EngineKind, Profile, Run, RuntimeKind};
    use crate::store::SledStore;

    const MATRIX: &str = "\
name: acceptance
model: m
acceptance: { min_success_rate: 0.99 }
engines: { vllm: {} }
variants:
  mtp: { args: [--mtp] }
  fp8: { model: m-fp8 }
profiles:
  p: { dataset: { random: { input_tokens: 8, output_tokens: 8 } }, requests: 1000 }
";

    fn group(id: u64, variants: &[&str]) -> Group {
        Group {
            run: RunId(1),
            id,
            config: EngineConfig {
                name: std::iter::once("vllm").chain(variants.iter().copied()).collect::<Vec<_>>().join("+"),
                engine: "vllm".into(),
                kind: EngineKind::Vllm,
                variants: variants.iter().map(|v| v.to_string()).collect(),
                model: "m".into(),
                image: String::new(),
                args: Vec::new(),
                runtime: RuntimeKind::Process,
                url: None,
                allow_warm_cache: false,
            },
            gpu: None,
            gpus_per_job: 1,
            jobs: vec![id],
            stage: 1,
            placement: None,
            failed_on: Vec::new(),
        }
    }

    fn job(group: u64, tps: f64, successful: u64) -> Job {
        let profile = Profile::new("p", Dataset::Random { input_tokens: 8, output_tokens: 8, seed: 0 }, 1000);
        let mut job = Job::new(RunId(1), group, group, profile, 1);
        job.state = JobState::Succeeded;
        job.summary =
            Some(Summary { successful, failed: 1000 - successful, total_token_throughput: tps, ..Summary::default() });
        job
    }

    /// A store holding run 1 of `MATRIX` (finished) with its groups, jobs
    /// and their summaries.
    fn stored(name: &str, groups: &[Group], jobs: &[Job]) -> (tempfile::TempDir, SledStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path()).expect("store");
        store.create_run(&finished_run(name), groups, jobs).expect("create");
        let summaries = jobs.iter().map(|j| (j.key(), j.summary.clone().expect("set above"))).collect();
        store.commit_records(&crate::store::RecordCommit { summaries, ..Default::default() }).expect("summaries");
        (dir, store)
    }

    /// Run 1 of `MATRIX`, finished.
    fn finished_run(name: &str) -> Run {
        Run {
            id: RunId(1),
            name: name.into(),
            matrix_file: "m.yaml".into(),
            matrix_yaml: MATRIX.into(),
            created_unix_ms: 0,
            state: crate::model::RunState::Finished,
            ended_unix_ms: None,
            note: None,
            files: Default::default(),
            runtime_override: None,
        }
    }

    #[test]
    fn variants_below_the_acceptance_are_reported_but_not_adopted() {
        let groups = [group(0, &[]), group(1, &["mtp"]), group(2, &["fp8"])];
        let jobs = [job(0, 9632.01, 1000), job(1, 15514.15, 516), job(2, 9942.93, 1000)];
        let (_dir, store) = stored("acceptance", &groups, &jobs);
        let report = render(&store, RunId(1)).expect("render").text;
        // mtp has the highest throughput but failed half its requests.
        assert!(
            report.contains("## Recommended\n\nvllm serve m\n\n(vllm+fp8: the best total token throughput"),
            "{report}"
        );
        let lines: Vec<&str> = report.lines().filter(|l| l.contains("| baseline")).collect();
        assert_eq!(
            lines,
            [
                "  vllm+mtp                                 Total TPS: 15514.15 (success rate 51.6%, not adopted) \
                 Mean TPOT(ms): 0.00 | baseline Total TPS: 9632.01 Mean TPOT(ms): 0.00",
                "  vllm+fp8                                 Total TPS: 9942.93 (+3.23%, better) \
                 Mean TPOT(ms): 0.00 | baseline Total TPS: 9632.01 Mean TPOT(ms): 0.00",
            ]
        );
    }

    #[test]
    fn repeats_whose_records_are_missing_are_shown_one_by_one() {
        let (first, mut second) = (job(0, 100.0, 1000), job(0, 200.0, 1000));
        (second.id, second.repeat) = (1, 2);
        let jobs = [first, second];
        let (_dir, store) = stored("repeats", &[group(0, &[])], &jobs);
        let report = render(&store, RunId(1)).expect("render").text;
        assert!(
            report.contains(
                "(the 2 repeats cannot be pooled: attempt 0 of job 1/0 has 0 records stored but its summary counts 1000; each is shown alone)"
            ),
            "{report}"
        );
        assert_eq!(report.matches("Serving Benchmark Result").count(), 2, "{report}");
    }

    #[test]
    fn an_invalid_baseline_is_not_compared() {
        let mut base = job(0, 5000.0, 1000);
        if let Some(s) = base.summary.as_mut() {
            s.invalid = Some("p99 dispatch lag 9.00 ms exceeds 5.00 ms".into());
        }
        let jobs = [base, job(2, 9942.93, 1000)];
        let (_dir, store) = stored("invalid", &[group(0, &[]), group(2, &["fp8"])], &jobs);
        let report = render(&store, RunId(1)).expect("render").text;
        assert!(
            report.contains(
                "Total TPS: 9942.93 (baseline run INVALID: p99 dispatch lag 9.00 ms exceeds 5.00 ms; not compared)"
            ),
            "{report}"
        );
        assert!(report.contains("One repeat: no confidence intervals."), "{report}");
        assert_eq!(render(&store, RunId(1)).expect("render").recommended.as_deref(), Some("vllm+fp8"));

        // Every configuration INVALID: nothing is recommended, and it says so.
        let mut fp8 = jobs[1].clone();
        if let Some(s) = fp8.summary.as_mut() {
            s.invalid = Some("achieved 1.00 req/s is below 95% of the offered 2.00 req/s".into());
        }
        store
            .commit_records(&crate::store::RecordCommit {
                summaries: vec![(fp8.key(), fp8.summary.clone().expect("set"))],
                ..Default::default()
            })
            .expect("summary");
        store.apply(&[crate::model::Write::Job(fp8)]).expect("job");
        let r = render(&store, RunId(1)).expect("render");
        assert_eq!(r.recommended, None);
        assert!(r.text.contains("## No recommendation\n\nNo configuration met the acceptance"), "{}", r.text);
    }

    #[test]
    fn a_variant_within_noise_of_its_baseline_is_not_recommended() {
        // +0.01%: the best throughput, but within noise.
        let jobs = [job(0, 9632.01, 1000), job(2, 9633.0, 1000)];
        let (_dir, store) = stored("noise", &[group(0, &[]), group(2, &["fp8"])], &jobs);
        let r = render(&store, RunId(1)).expect("render");
        assert_eq!(r.recommended.as_deref(), Some("vllm"), "{}", r.text);
        assert!(r.text.contains("(+0.01%, below the 1.00% minimum effect, within noise)"), "{}", r.text);
    }
}
