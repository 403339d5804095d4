//! The greedy strategy's planner: from a matrix and the results so far, the
//! next stage to run, or the end of the procedure with its winner.
//!
//! The stages are those of the reference reports: (1) each engine at its
//! defaults on the primary profile, the best kept; (2) each variant alone on
//! top of it; (3) the variants that helped, combined one at a time from the
//! most helpful down, each kept only if it still helps; (4) the winner and
//! the baseline on the other profiles. Planning is a pure function of the
//! stored results: the controller calls it whenever a stage ends (and after a
//! restart), and the report calls it to explain each choice.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use benchfleet_core::Summary;
use benchfleet_core::stats::Difference;

use crate::matrix::{EngineDef, Matrix, VariantDef};
use crate::model::{EngineConfig, Group, Job, JobState, Profile};
use crate::search::{self, Capacity, Step};

/// The stage that measures the winner and the baseline on every profile.
pub const FINAL_STAGE: u32 = 4;

/// What the planner knows of a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Results {
    /// Per configuration whose jobs on the primary profile have all ended
    /// (while a confirmation runs, those of the matrix's repeats):
    /// its successful repeats there pooled (throughputs over their summed
    /// durations, means over all their requests; no percentiles), `None`
    /// when none succeeded.
    /// A configuration with a job still pending or running is absent.
    /// When the primary profile searches: per configuration whose search
    /// is done, the capacity it found, with the pooled summary of the
    /// point found (empty when none was).
    pub primary: BTreeMap<String, Option<Measured>>,
    /// The successful repeats behind each of `primary`, one summary each,
    /// for the intervals that say whether a difference is real. A
    /// configuration absent here counts as its pooled summary alone.
    pub repeats: BTreeMap<String, Vec<Summary>>,
    /// The highest repeat of each of `primary` run on the primary profile,
    /// successful or not: a confirmation numbers its repeats after it. A
    /// configuration absent here ran the matrix's `repeats`.
    pub runs: BTreeMap<String, u32>,
    /// Whether the final stage was scheduled.
    pub final_scheduled: bool,
}

/// What a configuration's measurement on the primary profile gave.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measured {
    pub summary: Summary,
    /// What its search found, when the primary profile searches.
    pub capacity: Option<Capacity>,
    /// Its repeats' steady states pooled, when every repeat is a closed
    /// loop that reached one (`Summary::steady_state_ranked`).
    pub steady: Option<Steady>,
}

impl Measured {
    /// A configuration's repeats pooled as they are ranked: their summaries,
    /// and their steady states where every repeat reached one.
    pub fn pooled(repeats: &[&Summary]) -> Option<Measured> {
        let summary = benchfleet_core::pool(repeats, None)?;
        Some(Measured { summary, capacity: None, steady: Steady::pooled(repeats) })
    }
}

impl From<Summary> for Measured {
    fn from(summary: Summary) -> Measured {
        let steady = summary.steady_state_ranked().map(Steady::of);
        Measured { summary, capacity: None, steady }
    }
}

/// The throughputs a closed loop is ranked by: its steady state's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Steady {
    pub total_token_throughput: f64,
    pub output_throughput: f64,
    /// Successful requests sent in the window(s).
    pub requests: u64,
}

impl Steady {
    fn of(w: &benchfleet_core::metrics::steady::SteadyState) -> Steady {
        Steady {
            total_token_throughput: w.total_token_throughput,
            output_throughput: w.output_throughput,
            requests: w.requests,
        }
    }

    /// Repeats' windows together, as repeats are pooled: tokens over the
    /// windows' summed durations; `None` unless every one of them has one.
    pub fn pooled(summaries: &[&Summary]) -> Option<Steady> {
        let windows: Vec<_> = summaries.iter().map(|s| s.steady_state_ranked()).collect::<Option<_>>()?;
        let seconds: f64 = windows.iter().map(|w| w.end_s - w.start_s).sum();
        if windows.is_empty() || seconds <= 0.0 {
            return None;
        }
        let tokens = |f: fn(&benchfleet_core::metrics::steady::SteadyState) -> f64| {
            windows.iter().map(|w| f(w) * (w.end_s - w.start_s)).sum::<f64>() / seconds
        };
        Some(Steady {
            total_token_throughput: tokens(|w| w.total_token_throughput),
            output_throughput: tokens(|w| w.output_throughput),
            requests: windows.iter().map(|w| w.requests).sum(),
        })
    }
}

/// What an objective ranks: a summary, or a measurement that may hold a
/// search's capacity.
pub trait Scored {
    fn summary(&self) -> &Summary;
    fn capacity(&self) -> Option<&Capacity> {
        None
    }
    /// The steady state a throughput is ranked by, when it stands for the run.
    fn steady(&self) -> Option<Steady> {
        self.summary().steady_state_ranked().map(Steady::of)
    }
}

impl Scored for Summary {
    fn summary(&self) -> &Summary {
        self
    }
}

impl Scored for Measured {
    fn summary(&self) -> &Summary {
        &self.summary
    }
    fn capacity(&self) -> Option<&Capacity> {
        self.capacity.as_ref()
    }
    fn steady(&self) -> Option<Steady> {
        self.steady
    }
}

impl Results {
    /// Collects the results of a run's stored groups and jobs.
    pub fn of(groups: &[Group], jobs: &[Job], matrix: &Matrix) -> Results {
        let primary_profile = matrix.primary_profile.as_str();
        let final_scheduled = groups.iter().any(|g| g.stage >= FINAL_STAGE);
        if let Some((_, s)) = matrix.searches().find(|(p, _)| p.name == primary_profile) {
            return Results::of_search(groups, jobs, (primary_profile, s), matrix.min_success_rate, final_scheduled);
        }
        let mut by_config: BTreeMap<&str, Vec<&Job>> = BTreeMap::new();
        for g in groups {
            let of_group = jobs.iter().filter(|j| j.group == g.id && j.profile.name == primary_profile);
            by_config.entry(&g.config.name).or_default().extend(of_group);
        }
        let done = |js: &[&Job]| !js.is_empty() && js.iter().all(|j| j.state.is_terminal());
        let ended: Vec<(&str, Vec<&Job>)> = by_config
            .into_iter()
            .filter_map(|(name, js)| {
                if done(&js) {
                    return Some((name, js));
                }
                // While a confirmation runs, the matrix's repeats stand for the configuration.
                let asked: Vec<&Job> = js.into_iter().filter(|j| j.repeat <= matrix.repeats).collect();
                done(&asked).then_some((name, asked))
            })
            .collect();
        let repeats: BTreeMap<String, Vec<Summary>> = ended
            .iter()
            .map(|(name, js)| {
                let done = js.iter().filter(|j| j.state == JobState::Succeeded).filter_map(|j| j.summary.clone());
                ((*name).to_owned(), done.collect())
            })
            .collect();
        let runs = ended
            .iter()
            .map(|(name, js)| ((*name).to_owned(), js.iter().map(|j| j.repeat).max().unwrap_or_default()))
            .collect();
        let primary = ended
            .iter()
            .map(|(name, _)| {
                let done: Vec<&Summary> = repeats.get(*name).map(|rs| rs.iter().collect()).unwrap_or_default();
                ((*name).to_owned(), Measured::pooled(&done))
            })
            .collect();
        Results { primary, repeats, runs, final_scheduled }
    }

    /// The results of a primary profile that searches: each configuration
    /// whose search is done, with its capacity.
    fn of_search(
        groups: &[Group],
        jobs: &[Job],
        (profile, s): (&str, &crate::slo::Search),
        min_success_rate: f64,
        final_scheduled: bool,
    ) -> Results {
        let mut primary = BTreeMap::new();
        for (g, of_config) in search::jobs_by_config(groups, jobs) {
            let probes = search::probes_of(profile, of_config);
            if probes.is_empty() {
                continue;
            }
            if let (_, Step::Done(capacity)) = search::state(s, &probes, min_success_rate) {
                let at_found = capacity.found.and_then(|f| probes.iter().find(|(x, _)| *x == f));
                let summary = at_found.and_then(|(_, js)| crate::model::pooled(js)).unwrap_or_default();
                primary
                    .insert(g.config.name.clone(), Some(Measured { summary, capacity: Some(capacity), steady: None }));
            }
        }
        Results { primary, final_scheduled, ..Results::default() }
    }

    /// A configuration's repeats (its pooled summary when they are not
    /// known).
    fn repeats_of<'a>(&'a self, name: &str, pooled: &'a Summary) -> Vec<&'a Summary> {
        match self.repeats.get(name) {
            Some(rs) if !rs.is_empty() => rs.iter().collect(),
            _ => vec![pooled],
        }
    }
}

/// Configurations to run next, each on the given profiles.
#[derive(Clone, Debug, PartialEq)]
pub struct Stage {
    pub number: u32,
    pub configs: Vec<EngineConfig>,
    pub profiles: Vec<Profile>,
    /// The repeats to run of each of `configs` (in its order): the matrix's
    /// `1..=repeats`, or for a confirmation those after the ones it ran.
    pub repeats: Vec<RangeInclusive<u32>>,
}

/// How the procedure ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The configuration to serve; `None` when the procedure stopped early.
    pub winner: Option<String>,
    /// The chosen engine at its defaults, which the winner is measured against.
    pub baseline: Option<String>,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    Next(Stage),
    Done(Outcome),
}

/// One configuration the procedure looked at, and what it made of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub stage: u32,
    pub config: String,
    /// As the report shows it, e.g. `+9.75%, kept`.
    pub verdict: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// The decisions taken so far, in the order they were taken.
    pub decisions: Vec<Decision>,
    pub plan: Plan,
}

/// Plans the next stage of a greedy run from its results so far.
pub fn plan(matrix: &Matrix, results: &Results) -> Planned {
    let g = Greedy {
        matrix,
        results,
        objective: Objective::of(&matrix.objective),
        primary: matrix.profiles.iter().filter(|p| p.name == matrix.primary_profile).cloned().collect(),
    };
    let mut decisions = Vec::new();
    let planned = g.stage1(&mut decisions).and_then(|(engine, baseline, base)| {
        let (chosen, current) = if matrix.cumulative {
            g.cumulative(engine, (&baseline, base), &mut decisions)?
        } else {
            let helping = g.stage2(engine, (&baseline, base), &mut decisions)?;
            g.stage3(engine, (&baseline, base), helping, &mut decisions)?
        };
        Ok(g.finish(engine, (&baseline, base), (&chosen, current), &mut decisions))
    });
    let plan = planned.unwrap_or_else(|early| early);
    Planned { decisions, plan }
}

/// A stage's result, or the plan it ends the procedure with (the next
/// configurations to run, or a stop).
type Staged<T> = Result<T, Plan>;

/// What every stage reads.
struct Greedy<'a> {
    matrix: &'a Matrix,
    results: &'a Results,
    objective: Objective,
    /// The primary profile, which stages 1 to 3 run.
    primary: Vec<Profile>,
}

impl<'a> Greedy<'a> {
    fn next(&self, number: u32, configs: Vec<EngineConfig>) -> Plan {
        let repeats = vec![1..=self.matrix.repeats; configs.len()];
        Plan::Next(Stage { number, configs, profiles: self.primary.clone(), repeats })
    }

    /// The highest repeat a configuration ran on the primary profile.
    fn runs(&self, name: &str) -> u32 {
        self.results.runs.get(name).copied().unwrap_or(self.matrix.repeats)
    }

    /// Whether either configuration ran more repeats than the matrix asks:
    /// a comparison of them was confirmed, and says on how many.
    fn confirmed(&self, a: &str, b: &str) -> bool {
        self.runs(a).max(self.runs(b)) > self.matrix.repeats
    }

    /// A combination kept, against the baseline; against the previous one
    /// too where that was confirmed on more repeats.
    fn kept(&self, base: &Measured, previous: (&str, &Measured), candidate: (&str, &Measured)) -> String {
        let now = self.objective.change(base, candidate.1);
        if self.confirmed(previous.0, candidate.0) {
            format!("{now}, kept ({} against the previous)", self.compare(previous, candidate).shown)
        } else {
            format!("{now}, kept")
        }
    }

    /// The sides of a comparison to run again before it is taken
    /// (`acceptance.confirm_repeats`): none unless the candidate's gain is
    /// from 0 to twice the minimum effect, where one run each may fall on
    /// either side of the gate; else each side run fewer times than asked.
    fn unconfirmed(
        &self,
        reference: (&EngineConfig, &Measured),
        candidate: (&EngineConfig, &Measured),
    ) -> Vec<EngineConfig> {
        let Some(n) = self.matrix.confirm_repeats else { return Vec::new() };
        let c = self.compare((&reference.0.name, reference.1), (&candidate.0.name, candidate.1));
        // Against a reference of 0 there is no relative gain to be near the gate with.
        if c.reference == 0.0 || !(0.0..2.0 * self.matrix.min_effect).contains(&c.gain) {
            return Vec::new();
        }
        [reference.0, candidate.0].into_iter().filter(|config| self.runs(&config.name) < n).cloned().collect()
    }

    /// Stage `number`'s candidates that may be adopted, each against the
    /// `reference`: the stage that runs those near the gate and the reference
    /// again up to `acceptance.confirm_repeats` (each once, in that order),
    /// if there is any.
    fn confirm(&self, number: u32, reference: (&EngineConfig, &Measured), candidates: &[EngineConfig]) -> Staged<()> {
        let n = self.matrix.confirm_repeats.unwrap_or_default();
        let mut again: Vec<EngineConfig> = Vec::new();
        let acceptable = candidates.iter().filter_map(|c| Some((c, self.acceptable(&c.name).ok()?)));
        for config in acceptable.flat_map(|candidate| self.unconfirmed(reference, candidate)) {
            if !again.iter().any(|c| c.name == config.name) {
                again.push(config);
            }
        }
        if again.is_empty() {
            return Ok(());
        }
        let repeats = again.iter().map(|c| self.runs(&c.name) + 1..=n).collect();
        Err(Plan::Next(Stage { number, configs: again, profiles: self.primary.clone(), repeats }))
    }

    fn stop(reason: String) -> Plan {
        Plan::Done(Outcome { winner: None, baseline: None, reason })
    }

    /// A configuration's result on the primary profile, if it may be
    /// adopted; else why not.
    fn acceptable(&self, name: &str) -> Result<&'a Measured, String> {
        match self.results.primary.get(name) {
            Some(Some(m)) if let Some(c) = &m.capacity => match c.found {
                Some(_) => Ok(m),
                None => Err(format!(
                    "the SLOs did not hold even at the lower bound, {} ({}); not adopted",
                    crate::slo::show(c.over, c.missed_at.unwrap_or_default()),
                    c.why_none.as_deref().unwrap_or("no reason given")
                )),
            },
            Some(Some(m)) => match &m.summary.invalid {
                Some(why) => Err(format!("run INVALID: {why}; not adopted")),
                None if m.summary.success_rate() < self.matrix.min_success_rate => {
                    Err(format!("{}, not adopted", m.summary.success_said()))
                }
                None => Ok(m),
            },
            _ => Err("no successful repeat, not adopted".to_owned()),
        }
    }

    /// The configurations not yet run on the primary profile.
    fn untried(&self, configs: &[EngineConfig]) -> Vec<EngineConfig> {
        configs.iter().filter(|c| !self.results.primary.contains_key(&c.name)).cloned().collect()
    }

    fn compare(&self, reference: (&str, &Measured), candidate: (&str, &Measured)) -> Comparison {
        let min_effect = self.matrix.min_effect;
        if self.objective == Objective::Capacity {
            return self.objective.compare(&[reference.1], &[candidate.1], min_effect);
        }
        let (r, c) = (
            self.results.repeats_of(reference.0, &reference.1.summary),
            self.results.repeats_of(candidate.0, &candidate.1.summary),
        );
        let mut comparison = self.objective.compare(&r, &c, min_effect);
        if self.confirmed(reference.0, candidate.0) {
            comparison.shown.push_str(&format!(", over {} and {} repeats", r.len(), c.len()));
        }
        comparison
    }

    /// Stage 1: each engine at its defaults; the best is built on.
    fn stage1(&self, decisions: &mut Vec<Decision>) -> Staged<(&'a EngineDef, EngineConfig, &'a Measured)> {
        let (matrix, objective) = (self.matrix, self.objective);
        let baselines: Vec<(&EngineDef, EngineConfig)> =
            matrix.engines.iter().map(|e| (e, matrix.config_with(e, &[]))).collect();
        let configs: Vec<EngineConfig> = baselines.iter().map(|(_, c)| c.clone()).collect();
        let missing = self.untried(&configs);
        if !missing.is_empty() {
            return Err(self.next(1, missing));
        }
        let mut best: Option<(&EngineDef, &EngineConfig, &Measured)> = None;
        for (engine, config) in &baselines {
            if let Ok(s) = self.acceptable(&config.name)
                && best.is_none_or(|(_, _, b)| objective.better(s, b))
            {
                best = Some((engine, config, s));
            }
        }
        for (_, config) in &baselines {
            let verdict = match (self.acceptable(&config.name), best) {
                (Err(why), _) => why,
                (Ok(s), Some((_, chosen, _))) if chosen.name == config.name => {
                    format!("{}, chosen", objective.show(s))
                }
                (Ok(s), Some((_, chosen, _))) => format!("{}, below {}", objective.show(s), chosen.name),
                (Ok(s), None) => objective.show(s),
            };
            decisions.push(Decision { stage: 1, config: config.name.clone(), verdict });
        }
        let Some((engine, baseline, base)) = best else {
            return Err(Greedy::stop(format!(
                "stage 1: no engine met the acceptance at its defaults on profile {}; nothing to build on",
                matrix.primary_profile
            )));
        };
        Ok((engine, baseline.clone(), base))
    }

    /// Stage 2: each variant that applies to the chosen engine, alone on
    /// top of it; those that help, with their results.
    fn stage2(
        &self,
        engine: &'a EngineDef,
        (baseline, base): (&EngineConfig, &'a Measured),
        decisions: &mut Vec<Decision>,
    ) -> Staged<Vec<(&'a VariantDef, &'a Measured)>> {
        let matrix = self.matrix;
        let applicable: Vec<&VariantDef> = matrix.variants.iter().filter(|v| v.applies_to(&engine.name)).collect();
        let singles: Vec<EngineConfig> =
            applicable.iter().map(|v| matrix.config_with(engine, &[v.name.as_str()])).collect();
        let missing = self.untried(&singles);
        if !missing.is_empty() {
            return Err(self.next(2, missing));
        }
        self.confirm(2, (baseline, base), &singles)?;
        let mut helping = Vec::new();
        for (v, config) in applicable.iter().zip(&singles) {
            let verdict = match self.acceptable(&config.name) {
                Err(why) => why,
                Ok(s) => {
                    let c = self.compare((&baseline.name, base), (&config.name, s));
                    match c.verdict {
                        Verdict::Better => {
                            helping.push((*v, s));
                            format!("{}, helps", c.shown)
                        }
                        Verdict::WithinNoise => format!("{}, within noise, not adopted", c.shown),
                        Verdict::Worse => format!("{}, does not help", c.shown),
                    }
                }
            };
            decisions.push(Decision { stage: 2, config: config.name.clone(), verdict });
        }
        if !singles.is_empty() && singles.iter().all(|c| matches!(self.results.primary.get(&c.name), Some(None))) {
            return Err(Greedy::stop(format!(
                "stage 2: every variant on top of {} failed without a result; check the engine's log lines",
                baseline.name
            )));
        }
        Ok(helping)
    }

    /// Stage 3: the helping variants combined cumulatively, the most
    /// helpful first (file order among equals: the sort is stable); the
    /// variants kept and the result of the last configuration kept.
    fn stage3(
        &self,
        engine: &'a EngineDef,
        (baseline, base): (&EngineConfig, &'a Measured),
        mut helping: Vec<(&'a VariantDef, &'a Measured)>,
        decisions: &mut Vec<Decision>,
    ) -> Staged<(Vec<&'a str>, &'a Measured)> {
        let (matrix, objective) = (self.matrix, self.objective);
        helping.sort_by(|a, b| objective.score(b.1).total_cmp(&objective.score(a.1)));
        let mut chosen: Vec<&str> = Vec::new();
        let mut current = base;
        let mut current_name = baseline.name.clone();
        if let Some((first, s)) = helping.first() {
            chosen.push(&first.name);
            current = s;
            current_name = matrix.config_with(engine, &chosen).name;
            decisions.push(Decision {
                stage: 3,
                config: current_name.clone(),
                verdict: format!("{}, the best single variant, kept", objective.change(base, s)),
            });
        }
        for &(variant, alone) in helping.iter().skip(1) {
            // One of a group of alternatives at a time: the most helpful of
            // it came first.
            let taken = variant.group.as_ref().and_then(|g| {
                helping.iter().find(|(v, _)| v.group.as_ref() == Some(g) && chosen.contains(&v.name.as_str()))
            });
            if let Some(&(other, other_alone)) = taken {
                let group = variant.group.as_deref().unwrap_or_default();
                let name = matrix.config_with(engine, &[variant.name.as_str()]).name;
                let c = self
                    .compare((&matrix.config_with(engine, &[other.name.as_str()]).name, other_alone), (&name, alone));
                let kept = if c.verdict == Verdict::WithinNoise {
                    "within noise of it, which is kept for its larger figure"
                } else {
                    "which is kept"
                };
                let verdict = format!(
                    "an alternative to {} (group {group}; {} against it), {kept}; not combined",
                    other.name, c.shown
                );
                decisions.push(Decision { stage: 3, config: name, verdict });
                continue;
            }
            let mut candidate = chosen.clone();
            candidate.push(&variant.name);
            let config = matrix.config_with(engine, &candidate);
            if !self.results.primary.contains_key(&config.name) {
                return Err(self.next(3, vec![config]));
            }
            self.confirm(3, (&matrix.config_with(engine, &chosen), current), std::slice::from_ref(&config))?;
            let verdict = match self.acceptable(&config.name) {
                Err(why) => why,
                Ok(s) => {
                    let c = self.compare((&current_name, current), (&config.name, s));
                    match c.verdict {
                        Verdict::Better => {
                            let kept = self.kept(base, (&current_name, current), (&config.name, s));
                            chosen = candidate;
                            current = s;
                            current_name = config.name.clone();
                            kept
                        }
                        Verdict::WithinNoise | Verdict::Worse => self.not_kept(base, current, s, &c),
                    }
                }
            };
            decisions.push(Decision { stage: 3, config: config.name, verdict });
        }
        Ok((chosen, current))
    }

    /// Stage 3 of a cumulative run (no stage 2): each variant in file order
    /// on top of the configuration kept so far, kept when it helps; a
    /// group's alternatives are tried side by side at its first member's
    /// place, and the best of those that help is kept. The variants kept
    /// and the result of the last configuration kept.
    fn cumulative(
        &self,
        engine: &'a EngineDef,
        (baseline, base): (&EngineConfig, &'a Measured),
        decisions: &mut Vec<Decision>,
    ) -> Staged<(Vec<&'a str>, &'a Measured)> {
        let (matrix, objective) = (self.matrix, self.objective);
        let mut slots: Vec<Vec<&'a VariantDef>> = Vec::new();
        for v in matrix.variants.iter().filter(|v| v.applies_to(&engine.name)) {
            let same_group = |slot: &&mut Vec<&VariantDef>| v.group.is_some() && slot[0].group == v.group;
            match slots.iter_mut().find(same_group) {
                Some(slot) => slot.push(v),
                None => slots.push(vec![v]),
            }
        }
        let mut chosen: Vec<&'a str> = Vec::new();
        let (mut current, mut current_name) = (base, baseline.name.clone());
        for slot in slots {
            let candidates: Vec<EngineConfig> = slot
                .iter()
                .map(|v| matrix.config_with(engine, &[chosen.as_slice(), &[v.name.as_str()]].concat()))
                .collect();
            let missing = self.untried(&candidates);
            if !missing.is_empty() {
                return Err(self.next(3, missing));
            }
            self.confirm(3, (&matrix.config_with(engine, &chosen), current), &candidates)?;
            // Each candidate helps (its result) or why not.
            let judged: Vec<Result<&'a Measured, String>> = candidates
                .iter()
                .map(|config| {
                    let s = self.acceptable(&config.name)?;
                    let c = self.compare((&current_name, current), (&config.name, s));
                    if c.verdict == Verdict::Better { Ok(s) } else { Err(self.not_kept(base, current, s, &c)) }
                })
                .collect();
            // Of a group's alternatives that help, the best is kept (the first in file order among equals).
            let best = judged
                .iter()
                .enumerate()
                .filter_map(|(i, j)| Some((i, *j.as_ref().ok()?)))
                .reduce(|a, b| if objective.better(b.1, a.1) { b } else { a });
            for (i, judged) in judged.into_iter().enumerate() {
                let verdict = match (judged, best) {
                    (Ok(s), Some((b, _))) if b == i => {
                        self.kept(base, (&current_name, current), (&candidates[i].name, s))
                    }
                    (Ok(s), Some((b, kept))) => {
                        let c = self.compare((&candidates[b].name, kept), (&candidates[i].name, s));
                        let (now, best, group) = (
                            objective.change(base, s),
                            &candidates[b].name,
                            slot[i].group.as_deref().unwrap_or_default(),
                        );
                        if c.verdict == Verdict::WithinNoise {
                            format!(
                                "{now}, helps as much as {best} within noise (group {group}; {} against it), which is \
                                 kept for its larger figure; not kept",
                                c.shown
                            )
                        } else {
                            format!(
                                "{now}, helps but {best} helps more (group {group}; {} against it), not kept",
                                c.shown
                            )
                        }
                    }
                    (Ok(_), None) => unreachable!("a candidate that helps makes a best"),
                    (Err(why), _) => why,
                };
                decisions.push(Decision { stage: 3, config: candidates[i].name.clone(), verdict });
            }
            if let Some((b, s)) = best {
                chosen.push(&slot[b].name);
                current = s;
                current_name = candidates[b].name.clone();
            }
        }
        Ok((chosen, current))
    }

    /// Why a combination that does not beat the previous one is not kept. Before anything is kept
    /// the previous one is the baseline, named so rather than as its change over itself.
    fn not_kept(&self, base: &Measured, current: &Measured, s: &Measured, c: &Comparison) -> String {
        let now = self.objective.change(base, s);
        let before = if std::ptr::eq(base, current) {
            "the baseline".to_owned()
        } else {
            format!("the previous {}", self.objective.change(base, current))
        };
        match c.verdict {
            Verdict::WithinNoise => format!("{now}, within noise of {before} ({} against it), not kept", c.shown),
            _ => format!("{now}, below {before}, not kept"),
        }
    }

    /// The outcome, once stage 4 (the winner and the baseline on the
    /// profiles they have not run) is done or not needed.
    fn finish(
        &self,
        engine: &EngineDef,
        (baseline, base): (&EngineConfig, &Measured),
        (chosen, current): (&[&str], &Measured),
        decisions: &mut Vec<Decision>,
    ) -> Plan {
        let (matrix, objective) = (self.matrix, self.objective);
        let winner = matrix.config_with(engine, chosen);
        let reason = if chosen.is_empty() {
            format!("no variant helped; {} at its defaults is the best", baseline.name)
        } else {
            format!("{} over {} on profile {}", objective.change(base, current), baseline.name, matrix.primary_profile)
        };
        let done =
            Plan::Done(Outcome { winner: Some(winner.name.clone()), baseline: Some(baseline.name.clone()), reason });
        let others: Vec<Profile> =
            matrix.profiles.iter().filter(|p| p.name != matrix.primary_profile).cloned().collect();
        if others.is_empty() {
            return done;
        }
        let mut finalists = vec![winner.clone()];
        if winner.name != baseline.name {
            finalists.push(baseline.clone());
        }
        if !self.results.final_scheduled {
            let repeats = vec![1..=matrix.repeats; finalists.len()];
            return Plan::Next(Stage { number: FINAL_STAGE, configs: finalists, profiles: others, repeats });
        }
        for f in &finalists {
            let role = if f.name == winner.name { "the winner" } else { "the baseline" };
            decisions.push(Decision {
                stage: FINAL_STAGE,
                config: f.name.clone(),
                verdict: format!("{role}, measured on every profile"),
            });
        }
        done
    }
}

/// What a comparison of a candidate with a reference concludes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Better by at least the minimum effect, and (when there are repeats
    /// enough for one) the interval of the difference excludes zero.
    Better,
    /// Worse by as much.
    Worse,
    /// Neither: the interval holds zero, or the difference is below the
    /// minimum effect.
    WithinNoise,
}

/// A candidate against a reference by the objective, over their repeats.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The mean over each side's repeats of the objective's value.
    pub reference: f64,
    pub candidate: f64,
    /// candidate - reference, with Welch's 95% interval.
    pub difference: Difference,
    /// The relative change, positive when the candidate is better (0
    /// against a reference of 0).
    pub gain: f64,
    pub verdict: Verdict,
    /// As the report shows it: `+9.75% ± 1.20%`, `+0.11%, below the 1.00%
    /// minimum effect`, `1.26x faster (2.09 s vs 1.65 s)`.
    pub shown: String,
}

/// The matrix's objective: what is compared, and which way is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Objective {
    TotalTokenThroughput,
    OutputThroughput,
    MeanLatency,
    /// The load the primary profile's search found within its SLOs.
    Capacity,
}

impl Objective {
    /// The matrix's (validated) objective name; throughput by default.
    pub fn of(name: &str) -> Objective {
        match name {
            "output_throughput" => Objective::OutputThroughput,
            "mean_latency" => Objective::MeanLatency,
            "capacity" => Objective::Capacity,
            _ => Objective::TotalTokenThroughput,
        }
    }

    /// The objective a block (one profile's measurement at a fixed load)
    /// is ranked by: a search's capacity is not a block's, so its run's
    /// blocks are ranked by their total token throughput.
    pub fn for_blocks(self) -> Objective {
        match self {
            Objective::Capacity => Objective::TotalTokenThroughput,
            other => other,
        }
    }

    /// A throughput is a closed loop's steady state's when it reached one
    /// (`Scored::steady`), else the whole run's.
    pub fn value<S: Scored + ?Sized>(self, s: &S) -> f64 {
        match (self, s.steady()) {
            (Objective::TotalTokenThroughput, Some(w)) => w.total_token_throughput,
            (Objective::OutputThroughput, Some(w)) => w.output_throughput,
            _ => self.whole_run(s),
        }
    }

    /// [`Objective::value`] over `s`'s whole run, its steady state left aside.
    pub fn whole_run<S: Scored + ?Sized>(self, s: &S) -> f64 {
        let summary = s.summary();
        match self {
            Objective::TotalTokenThroughput => summary.total_token_throughput,
            Objective::OutputThroughput => summary.output_throughput,
            Objective::MeanLatency => summary.latency_s.mean,
            Objective::Capacity => s.capacity().map_or(0.0, Capacity::value),
        }
    }

    /// Whether [`Objective::compare`] (or, of two, [`Objective::change`]) takes every one of
    /// `runs` by its steady state (a throughput objective on closed-loop runs that each reached
    /// one), not by its whole run.
    pub fn in_steady_state<S: Scored>(self, runs: &[&S]) -> bool {
        !runs.is_empty() && runs.iter().all(|s| self.steady_of(*s).is_some())
    }

    /// Whether [`Objective::value`] is `s`'s steady state's.
    pub(crate) fn steady_of<S: Scored + ?Sized>(self, s: &S) -> Option<Steady> {
        matches!(self, Objective::TotalTokenThroughput | Objective::OutputThroughput).then(|| s.steady()).flatten()
    }

    /// The figure's name in a run's `noise`, and the factor from its unit
    /// there to the objective's (latency: ms there, s here).
    fn noise_key(self) -> Option<(&'static str, f64)> {
        match self {
            Objective::TotalTokenThroughput => Some(("total_token_throughput", 1.0)),
            Objective::OutputThroughput => Some(("output_throughput", 1.0)),
            Objective::MeanLatency => Some(("mean_latency_ms", 1e-3)),
            Objective::Capacity => None,
        }
    }

    /// Higher is better, so latency is negated.
    pub fn score<S: Scored + ?Sized>(self, s: &S) -> f64 {
        match self {
            Objective::MeanLatency => -self.value(s),
            _ => self.value(s),
        }
    }

    /// Strictly better: a tie does not help.
    pub fn better<S: Scored + ?Sized>(self, s: &S, than: &S) -> bool {
        self.score(s) > self.score(than)
    }

    /// The matrix's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Objective::TotalTokenThroughput => "total_token_throughput",
            Objective::OutputThroughput => "output_throughput",
            Objective::MeanLatency => "mean_latency",
            Objective::Capacity => "capacity",
        }
    }

    /// The value with its name, e.g. `total token throughput 9632.01 tok/s`.
    pub fn show<S: Scored + ?Sized>(self, s: &S) -> String {
        match self {
            Objective::Capacity => match s.capacity() {
                Some(c) => format!("capacity {} within the SLOs", c.shown()),
                None => "no capacity".to_owned(),
            },
            Objective::TotalTokenThroughput | Objective::OutputThroughput => {
                let steady = if self.steady_of(s).is_some() { "steady-state " } else { "" };
                let what = if self == Objective::OutputThroughput { "output" } else { "total token" };
                format!("{steady}{what} throughput {:.2} tok/s", self.value(s))
            }
            Objective::MeanLatency => format!("mean latency {:.2} s", self.value(s)),
        }
    }

    /// The change of the objective's value from `base`: `+9.75%` for a
    /// throughput, `1.26x faster` for a latency. Like with like: where one
    /// side has a steady state to rank by and the other has not, their whole
    /// runs.
    pub fn change<S: Scored + ?Sized>(self, base: &S, s: &S) -> String {
        if self.steady_of(base).is_some() == self.steady_of(s).is_some() {
            self.change_of(self.value(base), self.value(s))
        } else {
            self.change_of(self.whole_run(base), self.whole_run(s))
        }
    }

    fn change_of(self, b: f64, n: f64) -> String {
        match self {
            Objective::MeanLatency if n > 0.0 && b >= n => format!("{:.2}x faster", b / n),
            Objective::MeanLatency if b > 0.0 => format!("{:.2}x slower", n / b),
            _ => {
                let pct = if b == 0.0 { 0.0 } else { (n - b) / b * 100.0 };
                format!("{pct:+.2}%")
            }
        }
    }

    /// Compares a candidate's repeats with a reference's: the difference of
    /// the means of the objective's per-repeat values, with Welch's 95%
    /// interval when both sides have two repeats or more, or, with one run
    /// on each side, the interval their own requests give (each run's
    /// standard error by batch means, `metrics::noise`; for a mean latency
    /// of two runs of the same requests, the batches' paired differences'
    /// standard error, `Noise::paired_se`). Better or worse
    /// only when the interval excludes zero and the relative difference is
    /// at least `min_effect` (a fraction); otherwise within noise.
    ///
    /// Capacities are compared by the load found; a difference is real
    /// only when one side held its SLOs where the other missed them (the
    /// searches' brackets do not overlap), else it is within the searches'
    /// resolution.
    pub fn compare<S: Scored>(self, reference: &[&S], candidate: &[&S], min_effect: f64) -> Comparison {
        if self == Objective::Capacity {
            return compare_capacities(
                reference.first().and_then(|s| s.capacity()),
                candidate.first().and_then(|s| s.capacity()),
                min_effect,
            );
        }
        let values = |ss: &[&S]| ss.iter().map(|s| self.value(*s)).collect::<Vec<f64>>();
        let (r, c) = (values(reference), values(candidate));
        let mean = |v: &[f64]| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
        let (rm, cm) = (mean(&r), mean(&c));
        // One run each: the interval its own requests give.
        let noise = |ss: &[&S]| match ss {
            [one] => {
                let (key, scale) = self.noise_key()?;
                let (se, df) = one.summary().noise.as_ref()?.se(key)?;
                // A steady state's figure is the run's over fewer requests: its
                // standard error scaled to the window (docs/metrics.md).
                let window = match self.steady_of(*one) {
                    Some(w) if w.requests > 0 => {
                        let run = match self {
                            Objective::OutputThroughput => one.summary().output_throughput,
                            _ => one.summary().total_token_throughput,
                        };
                        let share = one.summary().successful as f64 / w.requests as f64;
                        if run > 0.0 { self.value(*one) / run * share.sqrt() } else { 1.0 }
                    }
                    _ => 1.0,
                };
                Some((se * scale * window, df))
            }
            _ => None,
        };
        // One run each of the same requests: their mean figures compared batch by batch.
        let paired = match (reference, candidate, self.noise_key()) {
            ([r], [c], Some((key, scale))) => {
                let (nr, nc) = (r.summary().noise.as_ref(), c.summary().noise.as_ref());
                nr.zip(nc).and_then(|(nr, nc)| nr.paired_se(nc, key)).map(|(se, df)| (se * scale, df))
            }
            _ => None,
        };
        let difference = match (paired, noise(reference), noise(candidate)) {
            (Some(error), _, _) => Difference::paired(cm - rm, error),
            (None, Some(er), Some(ec)) => Difference::of_errors(cm - rm, ec, er),
            _ => Difference::welch(&c, &r),
        };
        let relative = if rm == 0.0 { 0.0 } else { difference.diff / rm.abs() };
        // Positive when the candidate is better.
        let gain = if self == Objective::MeanLatency { -relative } else { relative };
        let verdict = if gain.abs() < min_effect || difference.contains_zero() == Some(true) {
            Verdict::WithinNoise
        } else if gain > 0.0 {
            Verdict::Better
        } else {
            Verdict::Worse
        };
        let below = gain.abs() < min_effect && difference.contains_zero() != Some(true);
        let mut shown = match (self, difference.half_width) {
            (Objective::MeanLatency, h) => {
                // A paired interval can be a few ms wide: shown to the ms where it is under 10.
                let digits = if h.is_some_and(|h| h < 0.01) { 3 } else { 2 };
                let spread =
                    h.map_or(String::new(), |h| format!(", difference {:+.digits$} ± {h:.digits$} s", difference.diff));
                format!("{} ({rm:.2} s vs {cm:.2} s{spread})", self.change_of(rm, cm))
            }
            (_, Some(h)) if rm != 0.0 => format!("{:+.2}% ± {:.2}%", relative * 100.0, h / rm.abs() * 100.0),
            _ => self.change_of(rm, cm),
        };
        if below {
            shown.push_str(&format!(", below the {:.2}% minimum effect", min_effect * 100.0));
        }
        Comparison { reference: rm, candidate: cm, difference, gain, verdict, shown }
    }
}

/// Two searches' capacities: better or worse only beyond the other's
/// bracket, and by the minimum effect.
fn compare_capacities(reference: Option<&Capacity>, candidate: Option<&Capacity>, min_effect: f64) -> Comparison {
    let value = |c: Option<&Capacity>| c.map_or(0.0, Capacity::value);
    let (rm, cm) = (value(reference), value(candidate));
    let relative = if rm == 0.0 { 0.0 } else { (cm - rm) / rm };
    // Held where the other missed: nothing between the two is unknown.
    let beyond =
        |a: Option<&Capacity>, b: Option<&Capacity>| match (a.and_then(|c| c.found), b.and_then(|c| c.missed_at)) {
            (Some(found), Some(missed)) => found >= missed,
            _ => false,
        };
    let over = candidate.or(reference).map_or(crate::slo::Over::Rate, |c| c.over);
    let verdict = if relative.abs() < min_effect {
        Verdict::WithinNoise
    } else if relative > 0.0 && beyond(candidate, reference) {
        Verdict::Better
    } else if relative < 0.0 && beyond(reference, candidate) {
        Verdict::Worse
    } else {
        Verdict::WithinNoise
    };
    let mut shown =
        format!("{:+.2}% ({} vs {})", relative * 100.0, crate::slo::show(over, rm), crate::slo::show(over, cm));
    if relative.abs() < min_effect {
        shown.push_str(&format!(", below the {:.2}% minimum effect", min_effect * 100.0));
    } else if verdict == Verdict::WithinNoise {
        shown.push_str(", within the searches' resolution");
    }
    let difference = Difference { diff: cm - rm, half_width: None, df: None };
    Comparison { reference: rm, candidate: cm, difference, gain: relative, verdict, shown }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MATRIX: &str = "\
name: greedy
model: m
acceptance: { min_success_rate: 0.99 }
engines:
  vllm: { runtime: process }
  sglang: { runtime: process }
variants:
  a: { args: [--a] }
  b: { args: [--b] }
  c: { args: [--c] }
profiles:
  p: { dataset: { random: { input_tokens: 8, output_tokens: 8 } }, requests: 100 }
  q: { dataset: { random: { input_tokens: 8, output_tokens: 8 } }, requests: 100 }
strategy: greedy
";

    /// A configuration's result: its throughput, its success rate in
    /// percent, and whether loadgen marked it invalid; `None` for a
    /// configuration whose every repeat failed.
    type R = Option<(f64, u64, bool)>;

    fn results(of: &[(&str, R)], final_scheduled: bool) -> Results {
        let primary = of
            .iter()
            .map(|(name, r)| {
                let summary = r.map(|(tps, ok, invalid)| Summary {
                    successful: ok,
                    failed: 100 - ok,
                    total_token_throughput: tps,
                    invalid: invalid.then(|| "dispatch lag".to_owned()),
                    ..Summary::default()
                });
                ((*name).to_owned(), summary.map(Measured::from))
            })
            .collect();
        Results { primary, final_scheduled, ..Results::default() }
    }

    /// The decisions one a line, then the plan.
    fn check_with(yaml: &str, of: &[(&str, R)], final_scheduled: bool, expected: &str) {
        let m = crate::matrix::parse("m.yaml", yaml, &|_| None).expect("valid matrix");
        let planned = plan(&m, &results(of, final_scheduled));
        let mut shown: Vec<String> =
            planned.decisions.iter().map(|d| format!("{} {}: {}", d.stage, d.config, d.verdict)).collect();
        shown.push(match planned.plan {
            Plan::Next(s) => format!(
                "next {} on {}: {}",
                s.number,
                s.profiles.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "),
                s.configs.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
            Plan::Done(o) => format!("done: {:?} ({:?}): {}", o.winner, o.baseline, o.reason),
        });
        assert_eq!(shown.join("\n"), expected.trim());
    }

    fn check(of: &[(&str, R)], final_scheduled: bool, expected: &str) {
        check_with(MATRIX, of, final_scheduled, expected);
    }

    const OK: u64 = 100;

    /// Stage 1 and 2 results where a (+10%) and c (+5%) help and b hurts.
    const STAGE_2: [(&str, R); 5] = [
        ("vllm", Some((100.0, OK, false))),
        ("sglang", Some((90.0, OK, false))),
        ("vllm+a", Some((110.0, OK, false))),
        ("vllm+b", Some((95.0, OK, false))),
        ("vllm+c", Some((105.0, OK, false))),
    ];

    /// Each variant on top of the configuration kept so far, in file order: the reference reports'
    /// procedure where each optimization builds on the last (x and y are alternatives).
    const CUMULATIVE: &str = "\
name: cumulative
model: m
engines:
  vllm: { runtime: process }
variants:
  a: { args: [--a] }
  b: { args: [--b] }
  x: { args: [--x=1], group: g }
  c: { args: [--c] }
  y: { args: [--x=2], group: g }
profiles:
  p: { dataset: { random: { input_tokens: 8, output_tokens: 8 } }, requests: 100 }
strategy: greedy
cumulative: true
";

    #[test]
    fn a_cumulative_run_tries_each_variant_on_the_configuration_kept_so_far() {
        let ok = |tps: f64| Some((tps, OK, false));
        let mut of = vec![("vllm", ok(100.0))];
        check_with(CUMULATIVE, &of, false, "1 vllm: total token throughput 100.00 tok/s, chosen\nnext 3 on p: vllm+a");
        // Nothing kept yet, a variant is measured against the baseline, and named so.
        let worse = [of.clone(), vec![("vllm+a", ok(95.0))]].concat();
        check_with(
            CUMULATIVE,
            &worse,
            false,
            "1 vllm: total token throughput 100.00 tok/s, chosen\n3 vllm+a: -5.00%, below the baseline, not kept\n\
             next 3 on p: vllm+b",
        );
        let level = [of.clone(), vec![("vllm+a", ok(100.4)), ("vllm+b", ok(95.0))]].concat();
        check_with(
            CUMULATIVE,
            &level,
            false,
            "1 vllm: total token throughput 100.00 tok/s, chosen\n\
             3 vllm+a: +0.40%, within noise of the baseline (+0.40%, below the 1.00% minimum effect against it), \
             not kept\n3 vllm+b: -5.00%, below the baseline, not kept\nnext 3 on p: vllm+x, vllm+y",
        );
        of.push(("vllm+a", ok(110.0)));
        check_with(
            CUMULATIVE,
            &of,
            false,
            "1 vllm: total token throughput 100.00 tok/s, chosen\n3 vllm+a: +10.00%, kept\nnext 3 on p: vllm+a+b",
        );
        // b does not help on top of a (it might alone: it is never tried alone); the group's
        // alternatives go side by side, at x's place, before c.
        of.push(("vllm+a+b", ok(108.0)));
        check_with(
            CUMULATIVE,
            &of,
            false,
            "1 vllm: total token throughput 100.00 tok/s, chosen\n3 vllm+a: +10.00%, kept\n\
             3 vllm+a+b: +8.00%, below the previous +10.00%, not kept\nnext 3 on p: vllm+a+x, vllm+a+y",
        );
        of.extend([("vllm+a+x", ok(115.0)), ("vllm+a+y", ok(120.0)), ("vllm+a+c+y", ok(120.5))]);
        check_with(
            CUMULATIVE,
            &of,
            false,
            "
1 vllm: total token throughput 100.00 tok/s, chosen
3 vllm+a: +10.00%, kept
3 vllm+a+b: +8.00%, below the previous +10.00%, not kept
3 vllm+a+x: +15.00%, helps but vllm+a+y helps more (group g; -4.17% against it), not kept
3 vllm+a+y: +20.00%, kept
3 vllm+a+c+y: +20.50%, within noise of the previous +20.00% (+0.42%, below the 1.00% minimum effect against it), not kept
done: Some(\"vllm+a+y\") (Some(\"vllm\")): +20.00% over vllm on profile p",
        );
        // Only with the greedy strategy.
        let grid = CUMULATIVE.replace("strategy: greedy", "strategy: grid");
        let err = crate::matrix::parse("m.yaml", &grid, &|_| None).expect_err("cumulative on a grid");
        assert_eq!(err.field, "cumulative");
        assert!(err.message.contains("set strategy: greedy"), "{err}");
    }

    #[test]
    fn starts_with_every_engine_at_its_defaults_on_the_primary_profile() {
        check(&[], false, "next 1 on p: vllm, sglang");
    }

    #[test]
    fn builds_on_the_best_engine() {
        check(
            &STAGE_2[..2],
            false,
            "
1 vllm: total token throughput 100.00 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
next 2 on p: vllm+a, vllm+b, vllm+c",
        );
    }

    #[test]
    fn an_engine_below_the_acceptance_is_not_chosen() {
        check(
            &[("vllm", Some((200.0, 51, false))), ("sglang", Some((90.0, OK, false)))],
            false,
            "
1 vllm: success rate 51.0%, not adopted
1 sglang: total token throughput 90.00 tok/s, chosen
next 2 on p: sglang+a, sglang+b, sglang+c",
        );
    }

    #[test]
    fn stops_when_no_engine_has_a_result() {
        check(
            &[("vllm", None), ("sglang", Some((90.0, OK, true)))],
            false,
            "
1 vllm: no successful repeat, not adopted
1 sglang: run INVALID: dispatch lag; not adopted
done: None (None): stage 1: no engine met the acceptance at its defaults on profile p; nothing to build on",
        );
    }

    #[test]
    fn combines_the_helping_variants_most_helpful_first() {
        check(
            &STAGE_2,
            false,
            "
1 vllm: total token throughput 100.00 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
2 vllm+a: +10.00%, helps
2 vllm+b: -5.00%, does not help
2 vllm+c: +5.00%, helps
3 vllm+a: +10.00%, the best single variant, kept
next 3 on p: vllm+a+c",
        );
    }

    /// [`MATRIX`] with a and b as alternatives of one group.
    fn seqs_group() -> String {
        MATRIX
            .replace("  a: { args: [--a] }", "  a: { args: [--seqs=512], group: seqs }")
            .replace("  b: { args: [--b] }", "  b: { args: [--seqs=1024], group: seqs }")
    }

    #[test]
    fn alternatives_of_a_group_are_never_combined_and_engine_bound_variants_stay_on_their_engine() {
        let yaml = seqs_group()
            .replace("  c: { args: [--c] }", "  c: { args: [--c] }\n  s: { args: [--sglang-only], engines: [sglang] }");
        let of = [
            ("vllm", Some((100.0, OK, false))),
            ("sglang", Some((90.0, OK, false))),
            ("vllm+a", Some((110.0, OK, false))),
            ("vllm+b", Some((120.0, OK, false))),
            ("vllm+c", Some((105.0, OK, false))),
            ("vllm+b+c", Some((125.0, OK, false))),
        ];
        check_with(
            &yaml,
            &of,
            false,
            "
1 vllm: total token throughput 100.00 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
2 vllm+a: +10.00%, helps
2 vllm+b: +20.00%, helps
2 vllm+c: +5.00%, helps
3 vllm+b: +20.00%, the best single variant, kept
3 vllm+a: an alternative to b (group seqs; -8.33% against it), which is kept; not combined
3 vllm+b+c: +25.00%, kept
next 4 on q: vllm+b+c, vllm",
        );
    }

    /// Which of two alternatives that help as much as each other within noise is kept is the
    /// noise's choice: the decisions say so, in both procedures.
    #[test]
    fn an_alternative_within_noise_of_the_one_kept_says_so() {
        let yaml = seqs_group();
        let ok = |tps: f64| Some((tps, OK, false));
        let of = [
            ("vllm", ok(100.0)),
            ("sglang", ok(90.0)),
            ("vllm+a", ok(119.5)),
            ("vllm+b", ok(120.0)),
            ("vllm+c", ok(95.0)),
        ];
        check_with(
            &yaml,
            &of,
            true,
            "
1 vllm: total token throughput 100.00 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
2 vllm+a: +19.50%, helps
2 vllm+b: +20.00%, helps
2 vllm+c: -5.00%, does not help
3 vllm+b: +20.00%, the best single variant, kept
3 vllm+a: an alternative to b (group seqs; -0.42%, below the 1.00% minimum effect against it), within noise of it, which is kept for its larger figure; not combined
4 vllm+b: the winner, measured on every profile
4 vllm: the baseline, measured on every profile
done: Some(\"vllm+b\") (Some(\"vllm\")): +20.00% over vllm on profile p",
        );
        let of = [
            ("vllm", ok(100.0)),
            ("vllm+a", ok(110.0)),
            ("vllm+a+b", ok(105.0)),
            ("vllm+a+x", ok(119.5)),
            ("vllm+a+y", ok(120.0)),
            ("vllm+a+c+y", ok(100.0)),
        ];
        check_with(
            CUMULATIVE,
            &of,
            false,
            "
1 vllm: total token throughput 100.00 tok/s, chosen
3 vllm+a: +10.00%, kept
3 vllm+a+b: +5.00%, below the previous +10.00%, not kept
3 vllm+a+x: +19.50%, helps as much as vllm+a+y within noise (group g; -0.42%, below the 1.00% minimum effect against it), which is kept for its larger figure; not kept
3 vllm+a+y: +20.00%, kept
3 vllm+a+c+y: +0.00%, below the previous +20.00%, not kept
done: Some(\"vllm+a+y\") (Some(\"vllm\")): +20.00% over vllm on profile p",
        );
    }

    #[test]
    fn variants_below_the_acceptance_or_invalid_never_help() {
        let mut of = STAGE_2.to_vec();
        of[2] = ("vllm+a", Some((300.0, 51, false)));
        of[4] = ("vllm+c", Some((300.0, OK, true)));
        check(
            &of,
            true,
            "
1 vllm: total token throughput 100.00 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
2 vllm+a: success rate 51.0%, not adopted
2 vllm+b: -5.00%, does not help
2 vllm+c: run INVALID: dispatch lag; not adopted
4 vllm: the winner, measured on every profile
done: Some(\"vllm\") (Some(\"vllm\")): no variant helped; vllm at its defaults is the best",
        );
    }

    #[test]
    fn a_combination_that_still_helps_is_kept_then_the_final_stage_runs() {
        let mut of = STAGE_2.to_vec();
        of.push(("vllm+a+c", Some((112.0, OK, false))));
        check(
            &of,
            false,
            "
1 vllm: total token throughput 100.00 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
2 vllm+a: +10.00%, helps
2 vllm+b: -5.00%, does not help
2 vllm+c: +5.00%, helps
3 vllm+a: +10.00%, the best single variant, kept
3 vllm+a+c: +12.00%, kept
next 4 on q: vllm+a+c, vllm",
        );
    }

    #[test]
    fn a_combination_below_the_previous_is_not_kept() {
        let mut of = STAGE_2.to_vec();
        of.push(("vllm+a+c", Some((108.0, OK, false))));
        check(
            &of,
            true,
            "
1 vllm: total token throughput 100.00 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
2 vllm+a: +10.00%, helps
2 vllm+b: -5.00%, does not help
2 vllm+c: +5.00%, helps
3 vllm+a: +10.00%, the best single variant, kept
3 vllm+a+c: +8.00%, below the previous +10.00%, not kept
4 vllm+a: the winner, measured on every profile
4 vllm: the baseline, measured on every profile
done: Some(\"vllm+a\") (Some(\"vllm\")): +10.00% over vllm on profile p",
        );
    }

    #[test]
    fn a_dropped_variant_is_left_out_of_the_next_combination() {
        let yaml = MATRIX.replace("  c: { args: [--c] }", "  c: { args: [--c] }\n  d: { args: [--d] }");
        let of = [
            ("vllm", Some((100.0, OK, false))),
            ("sglang", Some((90.0, OK, false))),
            ("vllm+a", Some((110.0, OK, false))),
            ("vllm+b", Some((104.0, OK, false))),
            ("vllm+c", Some((105.0, OK, false))),
            ("vllm+d", Some((90.0, OK, false))),
            ("vllm+a+c", Some((100.0, 51, false))),
        ];
        check_with(
            &yaml,
            &of,
            false,
            "
1 vllm: total token throughput 100.00 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
2 vllm+a: +10.00%, helps
2 vllm+b: +4.00%, helps
2 vllm+c: +5.00%, helps
2 vllm+d: -10.00%, does not help
3 vllm+a: +10.00%, the best single variant, kept
3 vllm+a+c: success rate 51.0%, not adopted
next 3 on p: vllm+a+b",
        );
    }

    #[test]
    fn stops_when_every_variant_failed() {
        let of = [
            ("vllm", Some((100.0, OK, false))),
            ("sglang", Some((90.0, OK, false))),
            ("vllm+a", None),
            ("vllm+b", None),
            ("vllm+c", None),
        ];
        check(
            &of,
            false,
            "
1 vllm: total token throughput 100.00 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
2 vllm+a: no successful repeat, not adopted
2 vllm+b: no successful repeat, not adopted
2 vllm+c: no successful repeat, not adopted
done: None (None): stage 2: every variant on top of vllm failed without a result; check the engine's log lines",
        );
    }

    #[test]
    fn one_profile_needs_no_final_stage() {
        let yaml =
            MATRIX.replace("  q: { dataset: { random: { input_tokens: 8, output_tokens: 8 } }, requests: 100 }\n", "");
        let of = [
            ("vllm", Some((100.0, OK, false))),
            ("sglang", Some((90.0, OK, false))),
            ("vllm+a", Some((110.0, OK, false))),
            ("vllm+b", Some((95.0, OK, false))),
            ("vllm+c", Some((99.0, OK, false))),
        ];
        check_with(
            &yaml,
            &of,
            false,
            "
1 vllm: total token throughput 100.00 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
2 vllm+a: +10.00%, helps
2 vllm+b: -5.00%, does not help
2 vllm+c: -1.00%, does not help
3 vllm+a: +10.00%, the best single variant, kept
done: Some(\"vllm+a\") (Some(\"vllm\")): +10.00% over vllm on profile p",
        );
    }

    #[test]
    fn lower_latency_is_better() {
        let yaml = format!("{MATRIX}objective: mean_latency\n");
        let m = crate::matrix::parse("m.yaml", &yaml, &|_| None).expect("valid matrix");
        let latency = |l: f64| {
            let mut s = Summary { successful: OK, ..Summary::default() };
            s.latency_s.mean = l;
            Some(Measured::from(s))
        };
        let r = Results {
            primary: [("vllm", latency(2.0)), ("sglang", latency(1.0))]
                .into_iter()
                .map(|(n, s)| (n.to_owned(), s))
                .collect(),
            ..Results::default()
        };
        let planned = plan(&m, &r);
        let Plan::Next(stage) = planned.plan else { panic!("expected stage 2") };
        assert_eq!(stage.configs[0].name, "sglang+a");
        let mut r = r;
        r.primary.insert("sglang+a".into(), latency(0.8));
        r.primary.insert("sglang+b".into(), latency(1.0));
        r.primary.insert("sglang+c".into(), latency(1.25));
        let verdicts: Vec<String> = plan(&m, &r).decisions.iter().map(|d| d.verdict.clone()).collect();
        assert_eq!(
            verdicts[2..5],
            [
                "1.25x faster (1.00 s vs 0.80 s), helps",
                "1.00x faster (1.00 s vs 1.00 s), below the 1.00% minimum effect, within noise, not adopted",
                "1.25x slower (1.00 s vs 1.25 s), does not help",
            ]
        );
    }

    #[test]
    fn capacities_differ_only_beyond_the_other_s_bracket() {
        let cap = |found: Option<f64>, missed_at: Option<f64>| Measured {
            summary: Summary::default(),
            capacity: Some(Capacity { over: crate::slo::Over::Rate, found, missed_at, why_none: None }),
            steady: None,
        };
        let o = Objective::Capacity;
        let base = cap(Some(10.0), Some(11.0));
        let verdict = |c: &Measured| o.compare(&[&base], &[c], 0.01);
        // Held at 12, where the baseline missed.
        assert_eq!(verdict(&cap(Some(12.0), Some(13.0))).verdict, Verdict::Better);
        // 10.5 is more, but the baseline was never tried there.
        let c = verdict(&cap(Some(10.5), Some(11.0)));
        assert_eq!(
            (c.verdict, c.shown.as_str()),
            (Verdict::WithinNoise, "+5.00% (10 req/s vs 10.5 req/s), within the searches' resolution")
        );
        // Missed at 9, where the baseline held.
        assert_eq!(verdict(&cap(Some(8.0), Some(9.0))).verdict, Verdict::Worse);
        assert_eq!(verdict(&cap(Some(10.0), Some(12.0))).verdict, Verdict::WithinNoise);
        // Held at the upper bound: at least as good.
        assert_eq!(verdict(&cap(Some(32.0), None)).verdict, Verdict::Better);
        assert_eq!(o.show(&cap(Some(32.0), None)), "capacity at least 32 req/s (the upper bound) within the SLOs");
    }

    #[test]
    fn an_engine_whose_search_held_nothing_says_why_and_is_not_chosen() {
        let yaml = MATRIX.replace(
            "  p: { dataset: { random: { input_tokens: 8, output_tokens: 8 } }, requests: 100 }",
            "  p: { dataset: { random: { input_tokens: 8, output_tokens: 8 } }, requests: 100, \
             search: { rate: [1, 32], slo: { ttft_p99_ms: 200 } } }",
        );
        let m = crate::matrix::parse("m.yaml", &yaml, &|_| None).expect("valid matrix");
        assert_eq!(m.objective, "capacity");
        let cap = |found: Option<f64>, missed_at: Option<f64>, why: Option<&str>| Measured {
            summary: Summary::default(),
            capacity: Some(Capacity {
                over: crate::slo::Over::Rate,
                found,
                missed_at,
                why_none: why.map(str::to_owned),
            }),
            steady: None,
        };
        let mut r = Results::default();
        r.primary.insert("vllm".into(), Some(cap(Some(8.0), Some(9.0), None)));
        r.primary
            .insert("sglang".into(), Some(cap(None, Some(1.0), Some("repeat 1 failed: engine exited with code 1"))));
        let planned = plan(&m, &r);
        let verdicts: Vec<String> = planned.decisions.iter().map(|d| format!("{}: {}", d.config, d.verdict)).collect();
        assert_eq!(
            verdicts,
            [
                "vllm: capacity 8 req/s within the SLOs, chosen",
                "sglang: the SLOs did not hold even at the lower bound, 1 req/s (repeat 1 failed: engine exited with \
                 code 1); not adopted",
            ]
        );
        let Plan::Next(stage) = planned.plan else { panic!("stage 2 next") };
        assert_eq!((stage.number, stage.configs[0].name.as_str()), (2, "vllm+a"));
    }

    /// Results where each configuration has three repeats of the given
    /// throughputs.
    fn repeated(of: &[(&str, [f64; 3])]) -> Results {
        let summary = |tps: f64| Summary { successful: OK, total_token_throughput: tps, ..Summary::default() };
        // The final stage ran: the plan ends with its winner.
        let mut r = Results { final_scheduled: true, ..Results::default() };
        for (name, tps) in of {
            let mean = tps.iter().sum::<f64>() / 3.0;
            r.primary.insert((*name).to_owned(), Some(summary(mean).into()));
            r.repeats.insert((*name).to_owned(), tps.iter().map(|&t| summary(t)).collect());
        }
        r
    }

    /// A closed loop of 100 requests whose run gave `run` tok/s and whose
    /// steady state, reached or not, gave `steady` over 10 s and 60 requests.
    fn closed(run: f64, steady: f64, reached: bool) -> Summary {
        use benchfleet_core::metrics::steady::SteadyState;
        Summary {
            successful: OK,
            total_token_throughput: run,
            max_concurrency: Some(32),
            steady_state: Some(SteadyState {
                reached,
                start_s: 2.0,
                end_s: 12.0,
                requests: 60,
                total_token_throughput: steady,
                output_throughput: steady / 2.0,
                ..SteadyState::default()
            }),
            ..Summary::default()
        }
    }

    #[test]
    fn a_closed_loop_is_ranked_by_its_steady_state_and_an_open_loop_by_its_run() {
        let o = Objective::TotalTokenThroughput;
        // The variant's run is 5% higher, its steady state 8% lower: its
        // ramp and drain were shorter, the engine was not faster.
        let (base, variant) = (closed(100.0, 120.0, true), closed(105.0, 110.0, true));
        assert_eq!((o.value(&base), o.value(&variant)), (120.0, 110.0));
        assert!(o.better(&base, &variant));
        assert_eq!(o.compare(&[&base], &[&variant], 0.01).verdict, Verdict::Worse);
        assert_eq!(o.show(&base), "steady-state total token throughput 120.00 tok/s");
        assert_eq!(Objective::OutputThroughput.value(&base), 60.0);
        // Not reached, or an open loop: the whole run.
        assert_eq!(o.value(&closed(100.0, 120.0, false)), 100.0);
        let open = Summary { offered_rate: Some(8.0), ..closed(100.0, 120.0, true) };
        assert_eq!((o.value(&open), o.show(&open).as_str()), (100.0, "total token throughput 100.00 tok/s"));
        // A latency objective is the run's either way.
        assert_eq!(Objective::MeanLatency.value(&base), base.latency_s.mean);
    }

    #[test]
    fn a_change_is_taken_like_with_like() {
        let o = Objective::TotalTokenThroughput;
        // Both sides by their steady states (+10%), and said to be.
        let (base, variant) = (closed(100.0, 120.0, true), closed(103.0, 132.0, true));
        assert_eq!(o.change(&base, &variant), "+10.00%");
        assert!(o.in_steady_state(&[&base, &variant]));
        // One side without one (repeats pooled without their windows): both whole runs, +3%,
        // not one's window against the other's run (+32%).
        let pooled = Summary { steady_state: None, ..base.clone() };
        assert_eq!(o.change(&pooled, &variant), "+3.00%");
        assert!(!o.in_steady_state(&[&pooled, &variant]));
    }

    #[test]
    fn repeats_steady_states_pool_over_their_windows_and_only_when_all_have_one() {
        let long = Summary {
            steady_state: Some(benchfleet_core::metrics::steady::SteadyState {
                start_s: 0.0,
                end_s: 30.0,
                ..closed(0.0, 200.0, true).steady_state.expect("a window")
            }),
            ..closed(0.0, 200.0, true)
        };
        let short = closed(0.0, 100.0, true);
        // 10 s at 100 and 30 s at 200: 175 over the 40 s.
        let pooled = Steady::pooled(&[&short, &long]).expect("both reached one");
        assert_eq!((pooled.total_token_throughput, pooled.requests), (175.0, 120));
        assert_eq!(Steady::pooled(&[&short, &closed(0.0, 100.0, false)]), None);
        assert_eq!(Steady::pooled(&[]), None);
        let measured = Measured::from(short.clone());
        assert_eq!(Objective::TotalTokenThroughput.value(&measured), 100.0);
    }

    #[test]
    fn one_run_s_interval_on_a_steady_state_is_scaled_to_its_window() {
        let o = Objective::TotalTokenThroughput;
        let with_noise = |s: Summary| Summary {
            noise: Some(benchfleet_core::metrics::noise::Noise {
                batches: 10,
                metrics: vec![benchfleet_core::metrics::noise::MetricNoise {
                    metric: "total_token_throughput".into(),
                    se: 1.0,
                    batch_means: Vec::new(),
                }],
                batch_requests: Vec::new(),
            }),
            ..s
        };
        // The same se of 1 tok/s over the run; the window has 60 of the 100
        // requests and 1.2x the run's throughput: se 1.2 x sqrt(100/60).
        let (a, b) = (with_noise(closed(100.0, 120.0, true)), with_noise(closed(100.0, 121.0, true)));
        let steady = o.compare(&[&a], &[&b], 0.0);
        let (a, b) = (with_noise(closed(120.0, 0.0, false)), with_noise(closed(121.0, 0.0, false)));
        let run = o.compare(&[&a], &[&b], 0.0);
        let ratio =
            steady.difference.half_width.expect("an interval") / run.difference.half_width.expect("an interval");
        let expected = ((1.2f64 * (100.0f64 / 60.0).sqrt()).powi(2) + (1.21 * (100.0f64 / 60.0).sqrt()).powi(2)).sqrt()
            / 2f64.sqrt();
        // The t quantile's degrees of freedom move a hair with the errors' ratio.
        assert!((ratio / expected - 1.0).abs() < 1e-3, "{ratio} against {expected}");
    }

    #[test]
    fn one_run_each_of_the_same_requests_compares_mean_latency_batch_by_batch() {
        use benchfleet_core::metrics::noise::{MetricNoise, Noise};
        // Each run's mean latency has a 100 ms error from its own requests (their replies' lengths);
        // batch by batch, the candidate is 7.5% faster, give or take a few ms.
        let reference: Vec<f64> = (0..10).map(|b| 2_400.0 + 60.0 * f64::from(b)).collect();
        let run = |factor: f64, jitter: f64, requests: Vec<u64>| {
            let batch_means: Vec<f64> = reference
                .iter()
                .enumerate()
                .map(|(b, m)| m * factor + if b % 2 == 0 { jitter } else { -jitter })
                .collect();
            let mut s = Summary::default();
            s.latency_s.mean = batch_means.iter().sum::<f64>() / 10.0 / 1e3;
            s.noise = Some(Noise {
                batches: 10,
                metrics: vec![MetricNoise { metric: "mean_latency_ms".into(), se: 100.0, batch_means }],
                batch_requests: requests,
            });
            s
        };
        let requests: Vec<u64> = (0..10).collect();
        let (a, b) = (run(1.0, 0.0, requests.clone()), run(0.925, 5.0, requests.clone()));
        let paired = Objective::MeanLatency.compare(&[&a], &[&b], 0.01);
        assert_eq!(paired.verdict, Verdict::Better, "{}", paired.shown);
        assert!(paired.difference.half_width.expect("an interval") < 0.02, "{}", paired.shown);
        // Other requests: each run's own error alone, and the gain is within it.
        let other = run(0.925, 5.0, (1..11).collect());
        let unpaired = Objective::MeanLatency.compare(&[&a], &[&other], 0.01);
        assert_eq!(unpaired.verdict, Verdict::WithinNoise, "{}", unpaired.shown);
        // A throughput has no pairing: its batches are spans of time, not requests.
        assert_eq!(Objective::TotalTokenThroughput.compare(&[&a], &[&b], 0.01).difference.half_width, None);
    }

    #[test]
    fn a_variant_within_noise_is_not_adopted() {
        let m = crate::matrix::parse("m.yaml", MATRIX, &|_| None).expect("valid matrix");
        let r = repeated(&[
            ("vllm", [99.0, 100.0, 101.0]),
            ("sglang", [89.0, 90.0, 91.0]),
            // +0.2% with a 1% spread: the interval holds zero.
            ("vllm+a", [99.2, 100.2, 101.2]),
            // +5% with the same spread: real.
            ("vllm+b", [104.0, 105.0, 106.0]),
            // +3% but a 10% spread: the interval holds zero.
            ("vllm+c", [93.0, 103.0, 113.0]),
        ]);
        let planned = plan(&m, &r);
        let stage2: Vec<String> =
            planned.decisions.iter().filter(|d| d.stage == 2).map(|d| format!("{}: {}", d.config, d.verdict)).collect();
        assert_eq!(
            stage2,
            [
                "vllm+a: +0.20% ± 2.27%, within noise, not adopted",
                "vllm+b: +5.00% ± 2.27%, helps",
                "vllm+c: +3.00% ± 24.50%, within noise, not adopted",
            ]
        );
        let Plan::Done(outcome) = planned.plan else { panic!("one helping variant: nothing to combine") };
        assert_eq!(outcome.winner.as_deref(), Some("vllm+b"));

        // The same +0.2% with a 0.01% spread is real, but still below the
        // matrix's minimum effect unless it is lowered.
        let tight = repeated(&[
            ("vllm", [99.99, 100.0, 100.01]),
            ("sglang", [89.0, 90.0, 91.0]),
            ("vllm+a", [100.19, 100.2, 100.21]),
            ("vllm+b", [50.0, 50.0, 50.0]),
            ("vllm+c", [50.0, 50.0, 50.0]),
        ]);
        let winner = |yaml: &str| {
            let m = crate::matrix::parse("m.yaml", yaml, &|_| None).expect("valid matrix");
            match plan(&m, &tight).plan {
                Plan::Done(o) => o.winner,
                Plan::Next(s) => panic!("unexpected stage {}", s.number),
            }
        };
        assert_eq!(winner(MATRIX).as_deref(), Some("vllm"));
        let lowered = MATRIX.replace(
            "acceptance: { min_success_rate: 0.99 }",
            "acceptance: { min_success_rate: 0.99, min_effect: 0.1% }",
        );
        assert_ne!(lowered, MATRIX);
        assert_eq!(winner(&lowered).as_deref(), Some("vllm+a"));
    }

    /// Results where each configuration ran the throughputs given, one repeat each.
    fn ran(of: &[(&str, &[f64])]) -> Results {
        let summary = |tps: f64| Summary { successful: OK, total_token_throughput: tps, ..Summary::default() };
        let mut results = Results::default();
        for (name, runs) in of {
            let mean = runs.iter().sum::<f64>() / runs.len().max(1) as f64;
            results.primary.insert((*name).to_owned(), Some(Measured::from(summary(mean))));
            results.repeats.insert((*name).to_owned(), runs.iter().map(|&t| summary(t)).collect());
            results.runs.insert((*name).to_owned(), runs.len() as u32);
        }
        results
    }

    /// The decisions one a line, then the plan with each configuration's repeats.
    fn check_repeated(yaml: &str, results: &Results, expected: &str) {
        let m = crate::matrix::parse("m.yaml", yaml, &|_| None).expect("valid matrix");
        let planned = plan(&m, results);
        let mut shown: Vec<String> =
            planned.decisions.iter().map(|d| format!("{} {}: {}", d.stage, d.config, d.verdict)).collect();
        shown.push(match planned.plan {
            Plan::Next(s) => {
                let configs = s.configs.iter().zip(&s.repeats);
                let runs: Vec<String> =
                    configs.map(|(c, r)| format!("{} (repeats {}-{})", c.name, r.start(), r.end())).collect();
                format!("next {}: {}", s.number, runs.join(", "))
            }
            Plan::Done(o) => format!("done: {:?}: {}", o.winner, o.reason),
        });
        assert_eq!(shown.join("\n"), expected.trim());
    }

    #[test]
    fn a_gain_near_the_minimum_effect_is_confirmed_on_more_repeats_before_it_is_taken() {
        let yaml = MATRIX.replace("min_success_rate: 0.99 }", "min_success_rate: 0.99, confirm_repeats: 3 }");
        // c's +1.5% is under twice the 1% minimum effect: one more run each could put it on either
        // side, so c and the baseline it is compared with run to 3 repeats first. a (+10%) and b
        // (-5%) are far from it, and stage 1's choice has no gate.
        let one = [
            ("vllm", &[100.0][..]),
            ("sglang", &[90.0]),
            ("vllm+a", &[110.0]),
            ("vllm+b", &[95.0]),
            ("vllm+c", &[101.5]),
        ];
        check_repeated(
            &yaml,
            &ran(&one),
            "
1 vllm: total token throughput 100.00 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
next 2: vllm (repeats 2-3), vllm+c (repeats 2-3)",
        );
        // Confirmed: the three runs each put c within noise, and the procedure goes on.
        let mut three = one;
        three[0].1 = &[100.0, 103.0, 98.0];
        three[4].1 = &[101.5, 99.0, 102.5];
        check_repeated(
            &yaml,
            &ran(&three),
            "
1 vllm: total token throughput 100.33 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
2 vllm+a: +9.63%, over 3 and 1 repeats, helps
2 vllm+b: -5.32%, over 3 and 1 repeats, does not help
2 vllm+c: +0.66% ± 5.15%, over 3 and 3 repeats, within noise, not adopted
3 vllm+a: +9.63%, the best single variant, kept
next 4: vllm+a (repeats 1-1), vllm (repeats 1-1)",
        );
        // Repeats that failed are not run again: what succeeded decides.
        let mut failed = ran(&one);
        failed.runs.extend([("vllm".to_owned(), 3), ("vllm+c".to_owned(), 3)]);
        check_repeated(
            &yaml,
            &failed,
            "
1 vllm: total token throughput 100.00 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
2 vllm+a: +10.00%, over 1 and 1 repeats, helps
2 vllm+b: -5.00%, over 1 and 1 repeats, does not help
2 vllm+c: +1.50%, over 1 and 1 repeats, helps
3 vllm+a: +10.00%, the best single variant, kept
next 3: vllm+a+c (repeats 1-1)",
        );
        // Without confirm_repeats, c is taken on its one run.
        check_repeated(
            MATRIX,
            &ran(&one),
            "
1 vllm: total token throughput 100.00 tok/s, chosen
1 sglang: total token throughput 90.00 tok/s, below vllm
2 vllm+a: +10.00%, helps
2 vllm+b: -5.00%, does not help
2 vllm+c: +1.50%, helps
3 vllm+a: +10.00%, the best single variant, kept
next 3: vllm+a+c (repeats 1-1)",
        );
    }

    #[test]
    fn a_reference_of_zero_has_no_gain_to_confirm() {
        let yaml = MATRIX.replace("min_success_rate: 0.99 }", "min_success_rate: 0.99, confirm_repeats: 3 }");
        let of = [("vllm", &[0.0][..]), ("sglang", &[0.0]), ("vllm+a", &[0.0]), ("vllm+b", &[0.0]), ("vllm+c", &[5.0])];
        let planned = plan(&crate::matrix::parse("m.yaml", &yaml, &|_| None).expect("valid"), &ran(&of));
        let Plan::Next(stage) = planned.plan else { panic!("{planned:?}") };
        assert_eq!((stage.number, &stage.repeats), (4, &vec![1..=1]), "no confirmation: {stage:?}");
    }

    #[test]
    fn a_cumulative_run_confirms_a_step_near_the_minimum_effect_against_the_configuration_kept() {
        let yaml = format!("{CUMULATIVE}acceptance: {{ confirm_repeats: 3 }}\n");
        let mut of = vec![("vllm", &[100.0][..]), ("vllm+a", &[110.0]), ("vllm+a+b", &[111.6])];
        check_repeated(
            &yaml,
            &ran(&of),
            "
1 vllm: total token throughput 100.00 tok/s, chosen
3 vllm+a: +10.00%, kept
next 3: vllm+a (repeats 2-3), vllm+a+b (repeats 2-3)",
        );
        // b's +1.5% on top of a holds over three runs each: kept, and the group's alternatives
        // come next on top of both.
        of[1].1 = &[110.0, 110.2, 109.8];
        of[2].1 = &[111.6, 111.8, 111.4];
        check_repeated(
            &yaml,
            &ran(&of),
            "
1 vllm: total token throughput 100.00 tok/s, chosen
3 vllm+a: +10.00%, kept (+10.00%, over 1 and 3 repeats against the previous)
3 vllm+a+b: +11.60%, kept (+1.45% ± 0.41%, over 3 and 3 repeats against the previous)
next 3: vllm+a+b+x (repeats 1-1), vllm+a+b+y (repeats 1-1)",
        );
    }
}
