//! What a report says of search profiles: the load each configuration's
//! search found, every point it probed, each variant's capacity against
//! its engine's baseline, and, when the primary profile searches, the
//! configuration to serve.

use super::doc::*;
use crate::greedy::{self, Measured, Objective};
use crate::matrix::Matrix;
use crate::model::{Group, Job};
use crate::search::{self, Capacity, Step};
use crate::slo::Search;

/// The SLOs of a search in words: `P99 TTFT <= 500 ms`.
pub fn slo_words(s: &Search) -> Vec<String> {
    let mut words: Vec<String> =
        s.slo.iter().map(|b| format!("{} <= {} ms", b.label(), crate::slo::number(b.ms))).collect();
    if let Some(share) = s.goodput {
        words.push(format!("goodput >= {}% of requests", crate::slo::number(share * 100.0)));
    }
    words
}

/// A search in a line, for the profile's parameters.
pub fn search_words(s: &Search) -> String {
    format!(
        "{} from {} to {}, at most {} probes after the bounds, holding {}",
        s.over.field(),
        crate::slo::number(s.lo),
        crate::slo::show(s.over, s.hi),
        s.steps,
        slo_words(s).join(", ")
    )
}

/// Every search of the run, per configuration (`groups` once each, `jobs`
/// with their groups mapped onto those).
pub fn gather(matrix: &Matrix, groups: &[Group], jobs: &[Job]) -> Vec<SearchInfo> {
    let mut out = Vec::new();
    for (profile, s) in matrix.searches() {
        let mut results = Vec::new();
        for (g, of_config) in search::jobs_by_config(groups, jobs) {
            let probes = search::probes_of(&profile.name, of_config);
            if probes.is_empty() {
                continue;
            }
            let (judged, step) = search::state(s, &probes, matrix.min_success_rate);
            let mut infos: Vec<(u64, ProbeInfo)> = probes
                .iter()
                .zip(&judged)
                .map(|((point, js), j)| {
                    let first = js.iter().map(|j| j.id).min().unwrap_or_default();
                    let info = ProbeInfo {
                        point: *point,
                        profile: js.first().map(|j| j.profile.name.clone()).unwrap_or_default(),
                        held: j.as_ref().map(|j| j.held),
                        measured: j.as_ref().map(|j| j.measured.clone()).unwrap_or_default(),
                        missed: j.as_ref().and_then(|j| j.missed.clone()),
                        values: j.as_ref().map(|j| j.values.clone()).unwrap_or_default(),
                    };
                    (first, info)
                })
                .collect();
            // In the order they were probed.
            infos.sort_by_key(|(first, _)| *first);
            let (done, capacity) = match &step {
                Step::Done(c) => (true, Some(c.clone())),
                Step::Probe(_) | Step::Waiting => (false, None),
            };
            results.push(SearchResult {
                config: g.config.name.clone(),
                done,
                found: capacity.as_ref().and_then(|c| c.found),
                missed_at: capacity.as_ref().and_then(|c| c.missed_at),
                capacity: capacity.as_ref().map_or_else(|| "searching".to_owned(), Capacity::shown),
                probes: infos.into_iter().map(|(_, p)| p).collect(),
            });
        }
        if results.is_empty() {
            continue;
        }
        out.push(SearchInfo {
            profile: profile.name.clone(),
            primary: profile.name == matrix.primary_profile,
            over: s.over.field().to_owned(),
            unit: s.over.unit().to_owned(),
            lo: s.lo,
            hi: s.hi,
            steps: s.steps,
            slo: slo_words(s),
            bounds: s.slo.iter().map(|b| SloBound { key: b.key(), label: b.label(), ms: b.ms }).collect(),
            results,
        });
    }
    out
}

/// A finished search's capacity, as the planner ranks it.
fn capacity_of(info: &SearchInfo, r: &SearchResult) -> Option<Measured> {
    let over = if info.over == "rate" { crate::slo::Over::Rate } else { crate::slo::Over::Concurrency };
    r.done.then(|| Measured {
        summary: Default::default(),
        capacity: Some(Capacity { over, found: r.found, missed_at: r.missed_at, why_none: None }),
        steady: None,
    })
}

/// Each variant's capacity against its engine's baseline's, per search.
pub fn comparisons(searches: &[SearchInfo], configs: &[Configuration], min_effect: f64) -> Vec<ComparisonRow> {
    let mut rows = Vec::new();
    for info in searches {
        for v in configs.iter().filter(|c| !c.is_baseline()) {
            let Some(base) = configs.iter().find(|b| b.engine == v.engine && b.is_baseline()) else { continue };
            let result = |c: &Configuration| info.results.iter().find(|r| r.config == c.name);
            let (Some(vr), Some(br)) = (result(v), result(base)) else { continue };
            let mut row = ComparisonRow {
                profile: info.profile.clone(),
                config: v.name.clone(),
                baseline: base.name.clone(),
                metric: format!("Capacity ({})", info.unit),
                value: vr.found,
                baseline_value: br.found,
                tpot_ms: None,
                baseline_tpot_ms: None,
                verdict: Verdict::NoResult,
                said: "a search still running".to_owned(),
                difference: None,
                half_width: None,
                steady_state: false,
            };
            if let (Some(vm), Some(bm)) = (capacity_of(info, vr), capacity_of(info, br)) {
                (row.verdict, row.said) = match (vr.found, br.found) {
                    (None, _) => (
                        Verdict::BelowAcceptance,
                        format!(
                            "the SLOs did not hold even at {} {}, not adopted",
                            crate::slo::number(info.lo),
                            info.unit
                        ),
                    ),
                    (_, None) => (Verdict::NoResult, "the baseline held the SLOs at no load; not compared".to_owned()),
                    _ => {
                        let c = Objective::Capacity.compare(&[&bm], &[&vm], min_effect);
                        row.difference = Some(c.difference.diff);
                        match c.verdict {
                            greedy::Verdict::Better => (Verdict::Better, format!("{}, better", c.shown)),
                            greedy::Verdict::WithinNoise => {
                                (Verdict::WithinNoise, format!("{}, within noise", c.shown))
                            }
                            greedy::Verdict::Worse => (Verdict::Worse, format!("{}, worse", c.shown)),
                        }
                    }
                };
            }
            rows.push(row);
        }
    }
    rows
}

/// The configuration to serve when the primary profile searches: the
/// highest capacity found, a variant only when it beats its baseline's
/// beyond the searches' resolution; a greedy run's winner as it chose.
pub fn recommendation(
    search: &SearchInfo,
    configs: &[Configuration],
    profiles: &[ProfileInfo],
    (objective, min_effect): (Objective, f64),
    winner: Option<&str>,
) -> Option<Recommendation> {
    let finished = |c: &Configuration| {
        let r = search.results.iter().find(|r| r.config == c.name)?;
        capacity_of(search, r).filter(|_| r.found.is_some())
    };
    let candidates = configs.iter().filter(|c| winner.is_none_or(|w| c.name == w)).filter_map(|c| {
        let m = finished(c)?;
        if winner.is_none()
            && !c.is_baseline()
            && let Some(b) = configs.iter().find(|b| b.engine == c.engine && b.is_baseline())
            && let Some(bm) = finished(b)
            && Objective::Capacity.compare(&[&bm], &[&m], min_effect).verdict != greedy::Verdict::Better
        {
            return None;
        }
        Some((c, m))
    });
    let (best, m) =
        candidates.max_by(|a, b| Objective::Capacity.score(&a.1).total_cmp(&Objective::Capacity.score(&b.1)))?;
    let baseline = configs.iter().find(|b| b.engine == best.engine && b.is_baseline()).filter(|b| b.name != best.name);
    let base_m = baseline.and_then(finished);
    let said = |m: &Measured, base: Option<&Measured>| {
        let c = m.capacity.as_ref().map_or_else(String::new, Capacity::shown);
        let change = base.map_or(String::new(), |b| format!(" ({})", Objective::Capacity.change(b, m)));
        format!("Capacity: {c}{change} within {}", search.slo.join(", "))
    };
    let table = profiles
        .iter()
        .filter(|p| p.probe_of.is_none())
        .map(|p| {
            if p.name == search.profile {
                return BeforeAfter {
                    profile: p.name.clone(),
                    baseline: base_m.as_ref().map(|b| said(b, None)),
                    optimized: Some(said(&m, base_m.as_ref())),
                };
            }
            super::before_after(objective, &p.name, baseline, best)
        })
        .collect();
    let (serve_command, simulator_flags) = best.published_command();
    Some(Recommendation {
        config: best.name.clone(),
        serve_command,
        simulator_flags,
        profile: search.profile.clone(),
        why: format!(
            "the highest load within the SLOs ({}) on profile {}: {}",
            search.slo.join(", "),
            search.profile,
            m.capacity.as_ref().map_or_else(String::new, Capacity::shown)
        ),
        baseline: baseline.map(|b| b.name.clone()),
        table,
    })
}
