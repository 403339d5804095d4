//! The matrix file: parsing, validation and expansion into engine groups and
//! jobs. Every error names the file, the line where it can be found and the
//! field; nothing is scheduled from a matrix that has one.

use std::fmt;

use crate::fleet::{FleetSpec, Per};
use crate::model::{
    Arrival, Dataset, Endpoint, EngineConfig, EngineKind, LoadSpec, Profile, RuntimeKind, Sessions, StoredFile, Window,
};
use crate::slo::{Over, Search};

mod profile;
mod raw;
mod reference;
mod text;

use profile::*;
pub use profile::{MAX_SEARCH_CONCURRENCY, MAX_SEARCH_RATE, MAX_SWEEP, MIN_SEARCH_RATE};
use raw::*;

pub use text::{MAX_BYTES, decode};

/// Most jobs a grid may expand into.
pub const MAX_JOBS: u64 = 100_000;
/// Most requests one job may send.
pub const MAX_REQUESTS: u64 = 1_000_000;
/// Most prompt tokens one job's requests may hold together, which loadgen
/// builds before the first request is sent.
pub const MAX_PROMPT_TOKENS: u64 = 200_000_000;
/// Most tokens one request's input or output may have.
pub const MAX_TOKENS: i64 = 1 << 20;
/// Most repeats of a job.
pub const MAX_REPEATS: i64 = 100;
/// Most GPUs one job may ask for (one host's).
pub const MAX_GPUS_PER_JOB: i64 = 16;
/// Most engines, and most variants, a matrix may define.
pub const MAX_DEFINITIONS: usize = 64;
/// The smallest relative gain that counts as one when none is set: 1%.
pub const DEFAULT_MIN_EFFECT: f64 = 0.01;

/// A matrix file that cannot be run, and where it is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct MatrixError {
    pub file: String,
    pub line: Option<usize>,
    /// Dotted path of the field, e.g. `profiles.throughput.rate`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for MatrixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// How the controller explores the configurations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Every engine x variant set x profile x repeat.
    Grid,
    /// The reference reports' procedure, in stages the controller plans as
    /// results come in (see `greedy`).
    Greedy,
    /// One configuration on every host (or GPU) of the fleet, each judged
    /// against its peers (see `fleet`).
    Fleet,
}

/// An engine as the matrix defines it, before any variant is applied.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineDef {
    pub name: String,
    pub kind: EngineKind,
    pub image: String,
    pub args: Vec<String>,
    pub runtime: RuntimeKind,
    pub url: Option<String>,
    /// The profiles its configurations run; `None`: every one.
    pub profiles: Option<Vec<String>>,
}

/// A variant: flags (and perhaps another model) applied on top of an engine.
#[derive(Clone, Debug, PartialEq)]
pub struct VariantDef {
    pub name: String,
    pub model: Option<String>,
    pub args: Vec<String>,
    /// The engines it applies to, by name; `None`: every engine.
    pub engines: Option<Vec<String>>,
    /// Variants of one group are alternatives: at most one applies at once.
    pub group: Option<String>,
    /// The profiles a configuration with it runs; `None`: every one.
    pub profiles: Option<Vec<String>>,
}

impl VariantDef {
    pub fn applies_to(&self, engine: &str) -> bool {
        self.engines.as_ref().is_none_or(|names| names.iter().any(|n| n == engine))
    }
}

/// The variant sets of an engine, the baseline (no variant) first, then by
/// size, in a stable order: each group of alternatives (and each variant
/// outside a group) contributes none or one of its variants.
fn variant_sets<'a>(variants: &'a [VariantDef], engine: &str) -> Vec<Vec<&'a VariantDef>> {
    let slots = variant_slots(variants, engine);
    let mut sets = Vec::new();
    let mut choice = vec![0usize; slots.len()];
    loop {
        let mut set: Vec<&VariantDef> =
            slots.iter().zip(&choice).filter(|(_, c)| **c > 0).map(|(slot, c)| slot[*c - 1]).collect();
        // Applied in file order, whatever the slots' order.
        set.sort_by_key(|v| variants.iter().position(|w| w.name == v.name));
        sets.push(set);
        // The next choice: the first slot turns fastest.
        let Some(i) = (0..slots.len()).find(|&i| choice[i] < slots[i].len()) else { break };
        choice[i] += 1;
        choice[..i].iter_mut().for_each(|c| *c = 0);
    }
    sets.sort_by_key(Vec::len);
    sets
}

/// The variants that apply to an engine, as slots: a group's alternatives
/// together, every other variant alone; in the file order of their first.
fn variant_slots<'a>(variants: &'a [VariantDef], engine: &str) -> Vec<Vec<&'a VariantDef>> {
    let mut slots: Vec<Vec<&VariantDef>> = Vec::new();
    for v in variants.iter().filter(|v| v.applies_to(engine)) {
        match slots.iter_mut().find(|s| v.group.is_some() && s[0].group == v.group) {
            Some(slot) => slot.push(v),
            None => slots.push(vec![v]),
        }
    }
    slots
}

/// How many variant sets an engine has, if it can be counted in a u64.
fn variant_set_count(variants: &[VariantDef], engine: &str) -> Option<u64> {
    variant_slots(variants, engine).iter().try_fold(1u64, |n, slot| n.checked_mul(slot.len() as u64 + 1))
}

/// A validated matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    pub name: String,
    pub file: String,
    pub model: String,
    pub objective: String,
    pub gpu: Option<String>,
    pub gpus_per_job: u32,
    pub min_success_rate: f64,
    /// The smallest relative difference (0.01 = 1%) that counts as one: a
    /// smaller one is within noise, whatever its interval.
    pub min_effect: f64,
    /// With the greedy strategy: a decision taken on fewer repeats than
    /// this, whose gain is under twice `min_effect` (from 0), is taken again
    /// once both sides have run this many (`acceptance.confirm_repeats`).
    pub confirm_repeats: Option<u32>,
    /// Jobs may run with a warm prefix cache when an engine's cannot be
    /// emptied between them.
    pub allow_warm_cache: bool,
    pub repeats: u32,
    pub strategy: Strategy,
    /// With the greedy strategy: each variant, in file order, tried on top of
    /// the configuration kept so far (a group's alternatives side by side),
    /// instead of each alone on the baseline and the helping ones combined.
    pub cumulative: bool,
    /// A fleet check's settings (`strategy: fleet`).
    pub fleet: Option<FleetSpec>,
    /// The price of a GPU-hour (`cost:`): every block says what its tokens
    /// cost.
    pub cost: Option<benchfleet_core::cost::Price>,
    /// In file order.
    pub engines: Vec<EngineDef>,
    /// In file order, which is the order their args are applied in.
    pub variants: Vec<VariantDef>,
    /// For grid: one per engine and variant set, baselines first. Empty for
    /// greedy, whose configurations are built stage by stage.
    pub configs: Vec<EngineConfig>,
    /// In file order of their names.
    pub profiles: Vec<Profile>,
    pub primary_profile: String,
    /// Profiles (by name) that run only on configurations with all these
    /// variants.
    pub only_with: Vec<(String, Vec<String>)>,
    /// What may be wrong but does not stop the run, as `file:line: field:
    /// message`.
    pub warnings: Vec<String>,
}

/// A dataset file a matrix names, which must travel with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileRef {
    /// As the matrix names it (relative to the matrix file).
    pub path: String,
    /// Dotted path of the field naming it.
    pub field: String,
}

/// Lists the dataset files a matrix names, without validating the rest, so
/// that a client can read them before submitting.
pub fn referenced_files(file: &str, yaml: &str) -> Result<Vec<FileRef>, MatrixError> {
    let (raw, _, _) = parse_raw(file, yaml, true)?;
    let processor = raw.processor.iter().map(|path| FileRef { path: path.clone(), field: "processor".to_owned() });
    Ok(raw
        .profiles
        .iter()
        .filter_map(|(name, p)| {
            let sharegpt = p.dataset.sharegpt.as_ref().map(|path| (path, "sharegpt"));
            let trace = p.dataset.trace.as_ref().map(|t| (&t.path, "trace.path"));
            sharegpt
                .or(trace)
                .map(|(path, f)| FileRef { path: path.clone(), field: format!("profiles.{name}.dataset.{f}") })
        })
        .chain(processor)
        .collect())
}

/// Parses and validates a matrix. `file_hash` gives the SHA-256 of each
/// dataset file the matrix names (by its path in the matrix), or `None` for
/// a file that could not be had; such a file is an error.
pub fn parse(file: &str, yaml: &str, file_hash: &dyn Fn(&str) -> Option<String>) -> Result<Matrix, MatrixError> {
    parse_as(file, yaml, file_hash, true)
}

/// Parses a matrix that was stored with a run: what it means is read as
/// `parse` reads it, but the limits and checks a new submission must pass
/// (sizes, names, GPU families, image references, control characters,
/// context lengths) are not applied again, so that a run accepted under
/// older rules can still be planned and reported.
pub fn reparse(file: &str, yaml: &str, file_hash: &dyn Fn(&str) -> Option<String>) -> Result<Matrix, MatrixError> {
    parse_as(file, yaml, file_hash, false)
}

fn parse_as(
    file: &str,
    yaml: &str,
    file_hash: &dyn Fn(&str) -> Option<String>,
    strict: bool,
) -> Result<Matrix, MatrixError> {
    let (raw, value, plain) = parse_raw(file, yaml, strict)?;
    let cx = Ctx { file, plain, value, strict };
    let mut warnings = Vec::new();
    let top = cx.top(&raw)?;
    let (min_success_rate, min_effect) = cx.acceptance(&raw)?;
    cx.required(&raw)?;
    let profiles = cx.profiles(&raw, file_hash, &mut warnings)?;
    let (primary_profile, objective) = cx.objective(&raw, &profiles)?;
    let variants = cx.variants(&raw, &profiles)?;
    let engines = cx.engines(&raw, &profiles)?;
    let configs = match top.strategy {
        Strategy::Grid => cx.grid(&raw, top.repeats, &engines, &variants, &profiles, &mut warnings)?,
        Strategy::Greedy => {
            cx.greedy(&primary_profile, &engines, &variants, &profiles)?;
            Vec::new()
        }
        Strategy::Fleet => cx.one_config(&raw, top.repeats, &engines, &variants, &profiles, &mut warnings)?,
    };
    let fleet = cx.fleet(&raw, top.strategy)?;
    let confirm_repeats =
        cx.confirm_repeats(&raw, &top, min_effect, profiles.list.iter().find(|p| p.name == primary_profile))?;
    if raw.cumulative && top.strategy != Strategy::Greedy {
        return Err(
            cx.err("cumulative", "orders the greedy strategy's stages: set strategy: greedy, or remove it".to_owned())
        );
    }
    let cost = cx.cost(&raw)?;
    if strict {
        let checked = checked_configs(&raw, top.strategy, &configs, &engines, &variants, &profiles);
        cx.contexts(&checked, &profiles, &mut warnings)?;
        let mut spread = checked;
        if top.strategy == Strategy::Greedy {
            spread.extend(greedy_combinations(&raw, &engines, &variants, &profiles));
        }
        cx.parallelism(&spread, &engines, &variants, top.gpus_per_job)?;
        cx.engine_options(&engines, &variants, &mut warnings);
    }
    Ok(Matrix {
        name: raw.name,
        file: file.to_owned(),
        model: raw.model,
        objective,
        gpu: top.gpu,
        gpus_per_job: top.gpus_per_job,
        min_success_rate,
        min_effect,
        confirm_repeats,
        allow_warm_cache: raw.allow_warm_cache,
        repeats: top.repeats,
        strategy: top.strategy,
        cumulative: raw.cumulative,
        fleet,
        cost,
        engines,
        variants,
        configs,
        profiles: profiles.list,
        primary_profile,
        only_with: profiles.only_with,
        warnings,
    })
}

/// What every section's checks share: where an error points, and whether
/// the limits of a new submission apply (`strict`) or a stored matrix is
/// read again.
struct Ctx<'a> {
    file: &'a str,
    /// The YAML without comments, where fields are located.
    plain: String,
    /// The YAML as a tree: the order of each section's keys.
    value: serde_yaml_ng::Value,
    strict: bool,
}

/// The matrix's top-level settings.
struct Top {
    repeats: u32,
    strategy: Strategy,
    gpu: Option<String>,
    gpus_per_job: u32,
}

/// The profiles, each sweep's name and the profiles it makes, and the
/// profiles that run only on configurations with some variants.
struct Profiles {
    list: Vec<Profile>,
    sweeps: Vec<(String, Vec<String>)>,
    only_with: Vec<(String, Vec<String>)>,
}

impl Ctx<'_> {
    fn err(&self, field: &str, message: String) -> MatrixError {
        let path: Vec<&str> = field.split('.').collect();
        MatrixError { file: self.file.to_owned(), line: locate(&self.plain, &path), field: field.to_owned(), message }
    }

    /// A check a new submission must pass.
    fn admit(&self, check: Result<(), MatrixError>) -> Result<(), MatrixError> {
        if self.strict { check } else { Ok(()) }
    }

    /// A limit a new submission must keep.
    fn cap(&self, max: i64) -> i64 {
        if self.strict { max } else { i64::MAX }
    }

    fn keys(&self, section: &str) -> Vec<String> {
        key_order(&self.value, section)
    }

    /// `repeats`, `name`, `model`, `strategy` and `hardware`.
    fn top(&self, raw: &RawMatrix) -> Result<Top, MatrixError> {
        let err = |field: &str, message: String| self.err(field, message);
        self.admit(plain_text(&err, "name", &raw.name))?;
        self.admit(plain_text(&err, "model", &raw.model))?;
        let strategy = match raw.strategy.as_deref() {
            None | Some("grid") => Strategy::Grid,
            Some("greedy") => Strategy::Greedy,
            Some("fleet") => Strategy::Fleet,
            Some(other) => {
                return Err(err("strategy", format!("unknown strategy '{other}'; expected grid, greedy or fleet")));
            }
        };
        // A fleet check measures each host's run-to-run spread: three
        // repeats unless the matrix says.
        let asked = raw.repeats.unwrap_or(if strategy == Strategy::Fleet { 3 } else { 1 });
        let repeats = u32::try_from(asked)
            .ok()
            .filter(|&r| (1..=self.cap(MAX_REPEATS)).contains(&i64::from(r)))
            .ok_or_else(|| err("repeats", format!("must be from 1 to {MAX_REPEATS}, got {asked}")))?;
        let (gpu, gpus_per_job) = match &raw.hardware {
            Some(h) => {
                let n = u32::try_from(h.gpus_per_job)
                    .ok()
                    .filter(|&n| (1..=self.cap(MAX_GPUS_PER_JOB)).contains(&i64::from(n)))
                    .ok_or_else(|| {
                        err(
                            "hardware.gpus_per_job",
                            format!("must be from 1 to {MAX_GPUS_PER_JOB} (one host's GPUs), got {}", h.gpus_per_job),
                        )
                    })?;
                if h.gpu.trim().is_empty() {
                    return Err(err("hardware.gpu", "must name a GPU model, e.g. H100 or H200".to_owned()));
                }
                self.admit(plain_text(&err, "hardware.gpu", &h.gpu))?;
                if self.strict && !h.allow_other_gpus && !benchfleet_core::gpu::supported_family(&h.gpu) {
                    return Err(err(
                        "hardware.gpu",
                        format!(
                            "'{}' is not of the H100 or H200 families benchfleet is made for; \
                             set hardware.allow_other_gpus: true to run on it anyway",
                            h.gpu
                        ),
                    ));
                }
                (Some(h.gpu.clone()), n)
            }
            None => (None, 1),
        };
        Ok(Top { repeats, strategy, gpu, gpus_per_job })
    }

    /// `objective`'s spelling, and the sections that may not be empty.
    fn required(&self, raw: &RawMatrix) -> Result<(), MatrixError> {
        let err = |field: &str, message: String| self.err(field, message);
        match raw.objective.as_deref() {
            None | Some("total_token_throughput" | "output_throughput" | "mean_latency" | "capacity") => {}
            Some(other) => {
                return Err(err(
                    "objective",
                    format!(
                        "unknown objective '{other}'; expected total_token_throughput, output_throughput, \
                         mean_latency or capacity"
                    ),
                ));
            }
        }
        if raw.model.trim().is_empty() {
            return Err(err("model", "must name the model to serve".to_owned()));
        }
        if raw.engines.is_empty() {
            return Err(err("engines", "at least one engine is required".to_owned()));
        }
        if raw.profiles.is_empty() {
            return Err(err("profiles", "at least one profile is required".to_owned()));
        }
        Ok(())
    }

    /// `acceptance`: the success rate a configuration needs, and the
    /// smallest effect that counts.
    fn acceptance(&self, raw: &RawMatrix) -> Result<(f64, f64), MatrixError> {
        let err = |field: &str, message: String| self.err(field, message);
        let min_success_rate = match &raw.acceptance {
            Some(a) if !(0.0..=1.0).contains(&a.min_success_rate) => {
                return Err(err(
                    "acceptance.min_success_rate",
                    format!("must be between 0 and 1, got {}", a.min_success_rate),
                ));
            }
            Some(a) => a.min_success_rate,
            None => 1.0,
        };
        let min_effect = match raw.acceptance.as_ref().and_then(|a| a.min_effect.as_ref()) {
            None => DEFAULT_MIN_EFFECT,
            Some(v) => fraction(&err, "acceptance.min_effect", v)?,
        };
        Ok((min_success_rate, min_effect))
    }

    /// `acceptance.confirm_repeats`: more than `repeats`, with the greedy
    /// strategy on a primary profile that does not search, and a minimum
    /// effect to be near.
    fn confirm_repeats(
        &self,
        raw: &RawMatrix,
        top: &Top,
        min_effect: f64,
        primary: Option<&Profile>,
    ) -> Result<Option<u32>, MatrixError> {
        let Some(asked) = raw.acceptance.as_ref().and_then(|a| a.confirm_repeats) else { return Ok(None) };
        let err = |message: String| Err(self.err("acceptance.confirm_repeats", message));
        let Some(n) = u32::try_from(asked).ok().filter(|&n| (2..=self.cap(MAX_REPEATS)).contains(&i64::from(n))) else {
            return err(format!("must be from 2 to {MAX_REPEATS}, got {asked}"));
        };
        if top.strategy != Strategy::Greedy {
            return err(
                "only the greedy strategy confirms its decisions: set strategy: greedy, or remove it".to_owned()
            );
        }
        if n <= top.repeats {
            return err(format!("{n} is not more than repeats ({}): a confirmation runs more repeats", top.repeats));
        }
        if min_effect <= 0.0 {
            return err(
                "confirms a gain under twice acceptance.min_effect, which is 0: set a minimum effect".to_owned()
            );
        }
        if primary.is_some_and(|p| p.search.is_some()) {
            return err("the primary profile searches, and a capacity is confirmed by its search's probes".to_owned());
        }
        Ok(Some(n))
    }

    /// `profiles` (each sweep expanded into its points) and `processor`.
    fn profiles(
        &self,
        raw: &RawMatrix,
        file_hash: &dyn Fn(&str) -> Option<String>,
        warnings: &mut Vec<String>,
    ) -> Result<Profiles, MatrixError> {
        let err = |field: &str, message: String| self.err(field, message);
        let processor = match &raw.processor {
            None => None,
            Some(path) => {
                self.admit(plain_text(&err, "processor", path))?;
                let sha256 = file_hash(path).ok_or_else(|| {
                    err(
                        "processor",
                        format!("cannot read the tokenizer file '{path}' (paths are relative to the matrix file)"),
                    )
                })?;
                Some(StoredFile { file: path.clone(), sha256 })
            }
        };
        let mut profiles: Vec<Profile> = Vec::new();
        let mut sweeps: Vec<(String, Vec<String>)> = Vec::new();
        for name in self.keys("profiles") {
            let raw_profile = &raw.profiles[&name];
            let points = sweep_points(&name, raw_profile, &err)?;
            let swept = raw_profile.rate.as_ref().is_some_and(OneOrMany::is_sweep)
                || raw_profile.max_concurrency.as_ref().is_some_and(OneOrMany::is_sweep);
            if swept {
                sweeps.push((name.clone(), points.iter().map(|(n, ..)| n.clone()).collect()));
            }
            for (point, rate, cap) in points {
                let mut p = profile(&name, raw_profile, (rate, cap), &err, file_hash, self.strict)?;
                if profiles.iter().any(|q| q.name == point) {
                    let maker = sweeps.iter().find(|(_, ps)| ps.contains(&point)).map_or(point.as_str(), |(b, _)| b);
                    let why = if maker == name {
                        format!("its sweep makes a profile named '{point}', which profile '{point}' already is")
                    } else {
                        format!("the sweep of profile '{maker}' makes a profile of this name too")
                    };
                    return Err(err(&format!("profiles.{name}"), why));
                }
                p.name = point;
                p.processor = processor.clone();
                p.sweep_of = swept.then(|| name.clone());
                profiles.push(p);
            }
        }
        // A cap above the requests sent changes nothing: those probes repeat one.
        for (p, s) in profiles.iter().filter_map(|p| p.search.as_ref().map(|s| (p, s))) {
            if s.over == Over::Concurrency && s.hi > p.requests as f64 {
                let e = err(
                    &format!("profiles.{}.search.max_concurrency", p.name),
                    format!(
                        "the upper bound {} is above the profile's {} requests: caps above {} all send the same load",
                        s.hi, p.requests, p.requests
                    ),
                );
                warnings.push(e.to_string());
            }
        }
        let mut only_with: Vec<(String, Vec<String>)> = Vec::new();
        for name in self.keys("profiles") {
            let Some(needed) = &raw.profiles[&name].only_with else { continue };
            let field = format!("profiles.{name}.only_with");
            if needed.is_empty() {
                return Err(err(&field, "names no variant; leave it out to run on every configuration".to_owned()));
            }
            if let Some(unknown) = needed.iter().find(|n| !raw.variants.contains_key(*n)) {
                return Err(err(
                    &field,
                    format!("no variant named '{unknown}'; variants are: {}", self.keys("variants").join(", ")),
                ));
            }
            let points =
                sweeps.iter().find(|(b, _)| *b == name).map_or_else(|| vec![name.clone()], |(_, ps)| ps.clone());
            for point in points {
                only_with.push((point, needed.clone()));
            }
        }
        Ok(Profiles { list: profiles, sweeps, only_with })
    }

    /// `primary_profile` and `objective`: a search's result is the load it
    /// found, which is what `capacity` ranks by.
    fn objective(&self, raw: &RawMatrix, profiles: &Profiles) -> Result<(String, String), MatrixError> {
        let err = |field: &str, message: String| self.err(field, message);
        let primary_profile = match raw.primary_profile.clone() {
            Some(name) if let Some((_, points)) = profiles.sweeps.iter().find(|(base, _)| *base == name) => {
                return Err(err(
                    "primary_profile",
                    format!("'{name}' is a sweep; name one of its profiles: {}", points.join(", ")),
                ));
            }
            Some(name) if !profiles.list.iter().any(|p| p.name == name) => {
                return Err(err(
                    "primary_profile",
                    format!(
                        "no profile named '{name}'; profiles are: {}",
                        profiles.list.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
            Some(name) => name,
            None => profiles.list[0].name.clone(),
        };
        let primary_searches = profiles.list.iter().any(|p| p.name == primary_profile && p.search.is_some());
        let objective = match (raw.objective.as_deref(), primary_searches) {
            (None, true) | (Some("capacity"), true) => "capacity".to_owned(),
            (Some("capacity"), false) => {
                return Err(err(
                    "objective",
                    format!(
                        "capacity ranks by the load a search found, but the primary profile '{primary_profile}' \
                         does not search; give it search: or make a search profile primary"
                    ),
                ));
            }
            (Some(other), true) => {
                return Err(err(
                    "objective",
                    format!(
                        "the primary profile '{primary_profile}' searches, so its result is the load it found: use \
                         objective: capacity (or leave it out), not {other}, or make another profile primary"
                    ),
                ));
            }
            (other, false) => other.unwrap_or("total_token_throughput").to_owned(),
        };
        Ok((primary_profile, objective))
    }

    /// `variants`, in file order (the order their args apply in); also
    /// checks the names of both definition sections.
    fn variants(&self, raw: &RawMatrix, profiles: &Profiles) -> Result<Vec<VariantDef>, MatrixError> {
        let err = |field: &str, message: String| self.err(field, message);
        for section in ["engines", "variants"] {
            let names = self.keys(section);
            if self.strict && names.len() > MAX_DEFINITIONS {
                return Err(err(section, format!("defines {} entries; at most {MAX_DEFINITIONS}", names.len())));
            }
            for name in &names {
                self.admit(check_name(&err, &format!("{section}.{name}"), name))?;
            }
        }
        for (name, v) in &raw.variants {
            if v.model.is_none() && v.args.is_empty() {
                return Err(err(&format!("variants.{name}"), "changes nothing: give args or a model".to_owned()));
            }
            if let Some(model) = &v.model {
                self.admit(plain_text(&err, &format!("variants.{name}.model"), model))?;
            }
            self.admit(check_args(&err, &format!("variants.{name}.args"), &v.args))?;
        }
        let mut variants = Vec::new();
        for name in self.keys("variants") {
            let v = &raw.variants[&name];
            let field = format!("variants.{name}.profiles");
            let limit = profile_limit(&field, v.profiles.as_deref(), &profiles.list, &profiles.sweeps, &err)?;
            variants.push(VariantDef {
                model: v.model.clone(),
                args: v.args.clone(),
                engines: v.engines.clone(),
                group: v.group.clone(),
                profiles: limit,
                name,
            });
        }
        for v in &variants {
            if let Some(names) = &v.engines {
                let field = format!("variants.{}.engines", v.name);
                if names.is_empty() {
                    return Err(err(
                        &field,
                        "names no engine; leave it out to apply the variant to every engine".to_owned(),
                    ));
                }
                if let Some(unknown) = names.iter().find(|n| !raw.engines.contains_key(*n)) {
                    return Err(err(
                        &field,
                        format!("no engine named '{unknown}'; engines are: {}", self.keys("engines").join(", ")),
                    ));
                }
            }
            if let Some(group) = &v.group {
                self.admit(check_name(&err, &format!("variants.{}.group", v.name), group))?;
            }
        }
        Ok(variants)
    }

    /// `engines`, in file order.
    fn engines(&self, raw: &RawMatrix, profiles: &Profiles) -> Result<Vec<EngineDef>, MatrixError> {
        let err = |field: &str, message: String| self.err(field, message);
        let mut engines = Vec::new();
        for name in self.keys("engines") {
            let e = &raw.engines[&name];
            let field = format!("engines.{name}");
            let kind = match e.kind.as_deref().unwrap_or(&name) {
                "vllm" => EngineKind::Vllm,
                "sglang" => EngineKind::Sglang,
                other if e.kind.is_some() => {
                    return Err(err(
                        &format!("{field}.kind"),
                        format!("unknown engine kind '{other}'; expected vllm or sglang"),
                    ));
                }
                _ => {
                    return Err(err(
                        &field,
                        "cannot tell the engine from its name; set kind: vllm or sglang".to_owned(),
                    ));
                }
            };
            let runtime = match e.runtime.as_deref() {
                None | Some("docker") => RuntimeKind::Docker,
                Some("process") => RuntimeKind::Process,
                Some("external") => RuntimeKind::External,
                Some(other) => {
                    return Err(err(
                        &format!("{field}.runtime"),
                        format!("unknown runtime '{other}'; expected docker, process or external"),
                    ));
                }
            };
            if runtime == RuntimeKind::External && e.url.is_none() {
                return Err(err(&format!("{field}.url"), "the external runtime needs the engine's url".to_owned()));
            }
            if let Some(image) = &e.image {
                self.admit(reference::check(image).map_err(|why| {
                    err(&format!("{field}.image"), format!("'{image}' is not an image reference: it {why}"))
                }))?;
            }
            if let Some(url) = &e.url {
                self.admit(plain_text(&err, &format!("{field}.url"), url))?;
            }
            self.admit(check_args(&err, &format!("{field}.args"), &e.args))?;
            let limit = profile_limit(
                &format!("{field}.profiles"),
                e.profiles.as_deref(),
                &profiles.list,
                &profiles.sweeps,
                &err,
            )?;
            engines.push(EngineDef {
                name,
                kind,
                image: e.image.clone().unwrap_or_default(),
                args: e.args.clone(),
                runtime,
                url: e.url.clone(),
                profiles: limit,
            });
        }
        Ok(engines)
    }

    /// The grid: one configuration per engine and set of its variants,
    /// counted before anything is built (64 variants are 2^64 sets).
    /// A fleet check's one configuration: the grid's, which must make
    /// exactly one (one engine, no variants), every profile without a
    /// search (a fleet compares fixed loads).
    fn one_config(
        &self,
        raw: &RawMatrix,
        repeats: u32,
        engines: &[EngineDef],
        variants: &[VariantDef],
        profiles: &Profiles,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<EngineConfig>, MatrixError> {
        let configs = self.grid(raw, repeats, engines, variants, profiles, warnings)?;
        match fleet_refusal(&configs, &profiles.list) {
            Some((field, why)) => Err(self.err(&field, why)),
            None => Ok(configs),
        }
    }

    /// The `cost:` section: a positive price per GPU-hour and a currency
    /// code (USD when none is given).
    fn cost(&self, raw: &RawMatrix) -> Result<Option<benchfleet_core::cost::Price>, MatrixError> {
        let Some(c) = &raw.cost else { return Ok(None) };
        if !(c.gpu_hour.is_finite() && c.gpu_hour > 0.0 && c.gpu_hour <= 1e6) {
            return Err(self.err("cost.gpu_hour", format!("must be a price above 0, got {}", c.gpu_hour)));
        }
        let currency = c.currency.clone().unwrap_or_else(|| "USD".to_owned());
        if currency.is_empty() || currency.len() > 8 || !currency.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(self.err("cost.currency", format!("must be a currency code such as USD, got '{currency}'")));
        }
        Ok(Some(benchfleet_core::cost::Price { gpu_hour: c.gpu_hour, currency }))
    }

    /// The `fleet:` section: only with `strategy: fleet`, its thresholds
    /// positive and the outlier's beyond the warning's.
    fn fleet(&self, raw: &RawMatrix, strategy: Strategy) -> Result<Option<FleetSpec>, MatrixError> {
        let err = |field: &str, message: String| self.err(field, message);
        if strategy != Strategy::Fleet {
            return match raw.fleet {
                Some(_) => {
                    Err(err("fleet", "is a fleet check's section: set strategy: fleet, or remove it".to_owned()))
                }
                None => Ok(None),
            };
        }
        let mut spec = FleetSpec::default();
        let Some(f) = &raw.fleet else { return Ok(Some(spec)) };
        if let Some(per) = &f.per {
            spec.per = Per::parse(per).ok_or_else(|| err("fleet.per", format!("must be host or gpu, got '{per}'")))?;
        }
        let t = &mut spec.thresholds;
        for (field, given, slot) in [
            ("fleet.warn_pct", f.warn_pct, &mut t.warn_pct),
            ("fleet.fail_pct", f.fail_pct, &mut t.fail_pct),
            ("fleet.z", f.z, &mut t.z),
            ("fleet.drift_pct", f.drift_pct, &mut t.drift_pct),
        ] {
            if let Some(v) = given {
                if !(v.is_finite() && v > 0.0 && v <= 1000.0) {
                    return Err(err(field, format!("must be a number above 0, got {v}")));
                }
                *slot = v;
            }
        }
        if t.fail_pct < t.warn_pct {
            return Err(err(
                "fleet.fail_pct",
                format!("must be at least warn_pct ({}), got {}", t.warn_pct, t.fail_pct),
            ));
        }
        if let Some(hosts) = &f.hosts {
            crate::hostlist::HostList::parse(hosts).map_err(|why| err("fleet.hosts", why))?;
            spec.hosts = Some(hosts.clone());
        }
        Ok(Some(spec))
    }

    fn grid(
        &self,
        raw: &RawMatrix,
        repeats: u32,
        engines: &[EngineDef],
        variants: &[VariantDef],
        profiles: &Profiles,
        warnings: &mut Vec<String>,
    ) -> Result<Vec<EngineConfig>, MatrixError> {
        let sets = engines.iter().try_fold(0u64, |n, e| n.checked_add(variant_set_count(variants, &e.name)?));
        // A search profile counts its most probes.
        let profile_jobs: u64 =
            profiles.list.iter().map(|p| p.search.as_ref().map_or(1, |s| 2 + u64::from(s.steps))).sum();
        let jobs = sets
            .and_then(|c| c.checked_mul(profile_jobs))
            .and_then(|j| j.checked_mul(u64::from(repeats)))
            .filter(|&j| !self.strict || j <= MAX_JOBS);
        if jobs.is_none() {
            let sets = sets.map_or_else(|| "more than 2^64".to_owned(), |n| n.to_string());
            return Err(self.err(
                "variants",
                format!(
                    "the grid of {sets} configurations ({} engines with every set of their variants) x {} \
                     profiles x {repeats} repeats is more than {MAX_JOBS} jobs; use strategy: greedy, fewer \
                     variants, or groups of alternatives",
                    engines.len(),
                    profiles.list.len()
                ),
            ));
        }
        let mut configs = Vec::new();
        for engine in engines {
            for set in variant_sets(variants, &engine.name) {
                let c = config(&raw.model, engine, &set, raw.allow_warm_cache, (&profiles.list, &profiles.only_with));
                if profiles.list.iter().any(|p| c.runs(&p.name)) {
                    configs.push(c);
                } else {
                    warnings.push(format!(
                        "{} runs no profile (its engine's and variants' profiles have none in common) and is left out",
                        c.name
                    ));
                }
            }
        }
        Ok(configs)
    }

    /// The greedy strategy decides on the primary profile: whatever it may
    /// try must run it.
    fn greedy(
        &self,
        primary_profile: &str,
        engines: &[EngineDef],
        variants: &[VariantDef],
        profiles: &Profiles,
    ) -> Result<(), MatrixError> {
        if profiles.only_with.iter().any(|(p, _)| p == primary_profile) {
            let base = profiles
                .sweeps
                .iter()
                .find(|(_, ps)| ps.iter().any(|p| p == primary_profile))
                .map_or(primary_profile, |(b, _)| b.as_str());
            return Err(self.err(
                &format!("profiles.{base}.only_with"),
                format!(
                    "the primary profile '{primary_profile}' must run on every configuration: the greedy strategy \
                     decides on it"
                ),
            ));
        }
        let limits = engines
            .iter()
            .map(|e| (format!("engines.{}.profiles", e.name), &e.profiles))
            .chain(variants.iter().map(|v| (format!("variants.{}.profiles", v.name), &v.profiles)));
        for (field, limit) in limits {
            if let Some(names) = limit
                && !names.iter().any(|n| n == primary_profile)
            {
                return Err(self.err(
                    &field,
                    format!("leaves out the primary profile '{primary_profile}', on which the greedy strategy decides"),
                ));
            }
        }
        Ok(())
    }

    /// Each configuration of `checked` against the context its engine is
    /// given: prompts that cannot fit are an error, replies cut short a
    /// warning.
    fn contexts(
        &self,
        checked: &[EngineConfig],
        profiles: &Profiles,
        warnings: &mut Vec<String>,
    ) -> Result<(), MatrixError> {
        let list = &profiles.list;
        for c in checked {
            let Some((flag, limit)) = context_limit(c) else { continue };
            for p in list.iter().filter(|p| c.runs(&p.name)) {
                if let Dataset::MultiTurn { turns, user_tokens, output_tokens, .. } = p.dataset {
                    // The last turn carries every earlier one and its reply.
                    let (t, u, o) = (u64::from(turns), u64::from(user_tokens), u64::from(output_tokens));
                    let last = t * u + (t - 1) * o;
                    if last + o > limit {
                        return Err(self.err(
                            &format!("profiles.{}.dataset.multi_turn", p.name),
                            format!(
                                "a session's turn {turns} carries {last} input tokens (the conversation so far) and \
                                 asks {o} more: that does not fit the context of {} ({flag}={limit})",
                                c.name
                            ),
                        ));
                    }
                    continue;
                }
                let Some(input_tokens) = p.dataset.input_tokens() else { continue };
                let output_tokens = p.dataset.output_tokens().unwrap_or(0);
                let (field, input_field) = match p.dataset {
                    Dataset::Random { .. } => {
                        let f = format!("profiles.{}.dataset.random", p.name);
                        (f.clone(), format!("{f}.input_tokens"))
                    }
                    _ => {
                        let f = format!("profiles.{}.dataset.shared_prefix", p.name);
                        (f.clone(), f)
                    }
                };
                if u64::from(input_tokens) > limit {
                    return Err(self.err(
                        &input_field,
                        format!(
                            "{input_tokens} input tokens do not fit the context of {} ({flag}={limit}): \
                             every request would be refused",
                            c.name
                        ),
                    ));
                }
                if u64::from(input_tokens) + u64::from(output_tokens) > limit {
                    let text = self
                        .err(
                            &field,
                            format!(
                                "{input_tokens} input + {output_tokens} output tokens exceed the context of {} \
                                 ({flag}={limit}): replies will stop short of {output_tokens} tokens",
                                c.name
                            ),
                        )
                        .to_string();
                    if !warnings.contains(&text) {
                        warnings.push(text);
                    }
                }
            }
        }
        Ok(())
    }

    /// The options of each engine's and variant's `args` that the engine's
    /// parser would refuse (one it does not have, or a prefix of several):
    /// warned of, not refused, as the engine may be a later release than
    /// the one benchfleet knows. An external engine's args only describe it.
    fn engine_options(&self, engines: &[EngineDef], variants: &[VariantDef], warnings: &mut Vec<String>) {
        let started = || engines.iter().filter(|e| e.runtime != RuntimeKind::External);
        let mut warn = |field: String, kind: EngineKind, args: &[String]| {
            for problem in benchfleet_core::flags::refused(kind, args) {
                let text = self
                    .err(&field, format!("{problem}: the engine refuses it as it starts, unless its release has it"))
                    .to_string();
                if !warnings.contains(&text) {
                    warnings.push(text);
                }
            }
        };
        for e in started() {
            warn(format!("engines.{}.args", e.name), e.kind, &e.args);
        }
        for v in variants {
            for e in started().filter(|e| v.applies_to(&e.name)) {
                warn(format!("variants.{}.args", v.name), e.kind, &v.args);
            }
        }
    }

    /// Each configuration of `checked` against the job's GPUs: an engine
    /// asked to spread over more GPUs than a job gets fails as it starts,
    /// on a GPU as on the simulator, so the matrix is refused before any
    /// runs. The error names the engine's or variant's arguments that ask;
    /// for a combination of variants, how to try them apart.
    fn parallelism(
        &self,
        checked: &[EngineConfig],
        engines: &[EngineDef],
        variants: &[VariantDef],
        gpus_per_job: u32,
    ) -> Result<(), MatrixError> {
        // An external engine is already running: its args say how, and start nothing.
        for c in checked.iter().filter(|c| c.runtime != RuntimeKind::External) {
            let Some((flags, needed)) = parallel_gpus(c.kind, &c.args) else { continue };
            if (1..=u64::from(gpus_per_job)).contains(&needed) {
                continue;
            }
            // The last of the engine and its variants to set a parallel size.
            let asks = |args: &[String]| parallel_gpus(c.kind, args).is_some();
            let field = variants
                .iter()
                .rev()
                .find(|v| c.variants.contains(&v.name) && asks(&v.args))
                .map(|v| format!("variants.{}.args", v.name))
                .or_else(|| engines.iter().find(|e| e.name == c.engine).map(|e| format!("engines.{}.args", e.name)))
                .unwrap_or_else(|| "engines".to_owned());
            let hint = if c.variants.len() > 1 {
                "; the study combines variants of different groups: give these one `group` to try them as alternatives"
            } else {
                ""
            };
            let why = if needed == 0 {
                format!("{} sets a parallel size of 0 ({flags}): each must be at least 1", c.name)
            } else {
                format!(
                    "{} asks for {needed} GPUs ({flags}) but a job gets {gpus_per_job} (hardware.gpus_per_job)",
                    c.name
                )
            };
            return Err(self.err(&field, format!("{why}: the engine would fail as it starts{hint}")));
        }
        Ok(())
    }
}

/// An error in `field` of a matrix, located as parsing locates its own:
/// for what is found wrong outside the matrix (a dataset file it names).
pub fn field_error(file: &str, yaml: &str, field: &str, message: String) -> MatrixError {
    let path: Vec<&str> = field.split('.').collect();
    let line = locate(&text::without_comments(yaml), &path);
    MatrixError { file: file.to_owned(), line, field: field.to_owned(), message }
}

/// Every configuration the run may build: the grid's, or for greedy each
/// engine alone and with each variant.
fn checked_configs(
    raw: &RawMatrix,
    strategy: Strategy,
    grid: &[EngineConfig],
    engines: &[EngineDef],
    variants: &[VariantDef],
    profiles: &Profiles,
) -> Vec<EngineConfig> {
    let (list, only_with) = (&profiles.list, &profiles.only_with);
    match strategy {
        Strategy::Grid | Strategy::Fleet => grid.to_vec(),
        Strategy::Greedy => engines
            .iter()
            .flat_map(|e| {
                std::iter::once(config(&raw.model, e, &[], false, (list, only_with))).chain(
                    variants
                        .iter()
                        .filter(|v| v.applies_to(&e.name))
                        .map(|v| config(&raw.model, e, &[v], false, (list, only_with))),
                )
            })
            .collect(),
    }
}

/// The combinations of two or more variants a greedy study may build, as
/// far as they can change the GPUs an engine spreads over: at most one of
/// each group (the strategy never combines alternatives), of the variants
/// that set a parallel size (or SGLang's DP attention), in file order as
/// the study applies them. Each alone is in [`checked_configs`].
fn greedy_combinations(
    raw: &RawMatrix,
    engines: &[EngineDef],
    variants: &[VariantDef],
    profiles: &Profiles,
) -> Vec<EngineConfig> {
    /// Past this many such variants of an engine only pairs are built (their
    /// subsets would be too many to build at submission).
    const ALL_SUBSETS_UP_TO: usize = 12;
    let mut out = Vec::new();
    for e in engines.iter().filter(|e| e.runtime != RuntimeKind::External) {
        let spreading: Vec<&VariantDef> = variants
            .iter()
            .filter(|v| v.applies_to(&e.name))
            .filter(|v| parallel_gpus(e.kind, &v.args).is_some() || v.args.iter().any(|a| a == "--enable-dp-attention"))
            .collect();
        let n = spreading.len();
        let subsets: Vec<Vec<&VariantDef>> = if n <= ALL_SUBSETS_UP_TO {
            (0u32..1 << n).map(|mask| (0..n).filter(|i| mask & (1 << i) != 0).map(|i| spreading[i]).collect()).collect()
        } else {
            (0..n).flat_map(|i| (i + 1..n).map(|j| vec![spreading[i], spreading[j]]).collect::<Vec<_>>()).collect()
        };
        for set in subsets.into_iter().filter(|set| set.len() > 1) {
            let one_of_each_group = set
                .iter()
                .enumerate()
                .all(|(i, v)| v.group.as_ref().is_none_or(|g| !set[..i].iter().any(|w| w.group.as_ref() == Some(g))));
            if one_of_each_group {
                out.push(config(&raw.model, e, &set, false, (&profiles.list, &profiles.only_with)));
            }
        }
    }
    out
}

/// The GPUs an engine's arguments spread it over, with the flags that say
/// so, when any does: tensor times pipeline times data parallel (SGLang's
/// attention data parallelism shares the tensor-parallel GPUs). The last
/// value of a flag given twice wins, as with argparse.
fn parallel_gpus(kind: EngineKind, args: &[String]) -> Option<(String, u64)> {
    let sizes: &[&[&str]] = match kind {
        EngineKind::Vllm => &[
            &["--tensor-parallel-size", "-tp"],
            &["--pipeline-parallel-size", "-pp"],
            &["--data-parallel-size", "-dp"],
        ],
        // SGLang's long names and aliases, and the prefixes its parser takes for them (`--pp` is
        // ambiguous there: it refuses it itself).
        EngineKind::Sglang => &[
            &["--tensor-parallel-size", "--tp-size", "--tp"],
            &["--pipeline-parallel-size", "--pp-size"],
            &["--data-parallel-size", "--dp-size", "--dp"],
        ],
    };
    let dp_attention = kind == EngineKind::Sglang && args.iter().any(|a| a == "--enable-dp-attention");
    let (mut gpus, mut said) = (1u64, Vec::new());
    for (i, names) in sizes.iter().enumerate() {
        let Some((flag, value)) = last_value(args, names) else { continue };
        let n = value.trim().parse::<u64>().ok()?;
        said.push(format!("{flag}={value}"));
        // A size of 0 is refused whichever GPUs it would share.
        if !(i == 2 && dp_attention) || n == 0 {
            gpus = gpus.saturating_mul(n);
        }
    }
    (!said.is_empty()).then(|| (said.join(" "), gpus))
}

/// The value of the last of `names` in `args` (`--flag value` or `--flag=value`).
fn last_value<'a>(args: &'a [String], names: &[&'static str]) -> Option<(&'static str, &'a str)> {
    let mut found = None;
    for (i, arg) in args.iter().enumerate() {
        for &flag in names {
            let value = match arg.strip_prefix(flag) {
                Some(rest) if rest.starts_with('=') => Some(&rest[1..]),
                Some("") => args.get(i + 1).map(String::as_str),
                _ => None,
            };
            if let Some(v) = value {
                found = Some((flag, v));
            }
        }
    }
    found
}

/// The context length a configuration's flags set (the last one wins, as
/// in the engines' own parsers), with the flag: vLLM's `--max-model-len`,
/// SGLang's `--context-length`. `1k` is 1,000 and `1K` 1,024, as vLLM reads
/// them; a value neither engine would read as a number is left to the engine.
fn context_limit(c: &EngineConfig) -> Option<(&'static str, u64)> {
    let flags: &[&'static str] = match c.kind {
        EngineKind::Vllm => &["--max-model-len"],
        EngineKind::Sglang => &["--context-length"],
    };
    let (flag, value) = last_value(&c.args, flags)?;
    benchfleet_core::flags::human_count(value).ok().filter(|&n| n > 0).map(|n| (flag, n))
}

/// A share written as a fraction from 0 to 1 (`0.01`) or a percentage
/// (`1%`).
fn fraction(
    err: &dyn Fn(&str, String) -> MatrixError,
    field: &str,
    v: &serde_yaml_ng::Value,
) -> Result<f64, MatrixError> {
    let share = match v {
        serde_yaml_ng::Value::Number(n) => n.as_f64(),
        serde_yaml_ng::Value::String(text) => {
            text.trim().strip_suffix('%').and_then(|p| p.trim().parse::<f64>().ok()).map(|p| p / 100.0)
        }
        _ => None,
    };
    match share {
        Some(f) if (0.0..1.0).contains(&f) => Ok(f),
        _ => Err(err(
            field,
            format!(
                "must be a fraction from 0 to 1 (0.01) or a percentage (1%), got {}",
                serde_yaml_ng::to_string(v).unwrap_or_default().trim()
            ),
        )),
    }
}

/// A name of an engine, a variant or a profile: it becomes part of
/// configuration names (`vllm+fp8`), file names and report headings.
fn check_name(err: &dyn Fn(&str, String) -> MatrixError, field: &str, name: &str) -> Result<(), MatrixError> {
    let ok = name.len() <= 64
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        return Ok(());
    }
    Err(err(
        field,
        format!(
            "the name '{}' may hold only letters, digits, '-', '_' and '.', begin with a letter or digit, \
             and be at most 64 characters",
            name.escape_debug()
        ),
    ))
}

/// Text that reaches an engine, a report or a log as it is: no control
/// characters (line breaks, tabs, escapes).
fn plain_text(err: &dyn Fn(&str, String) -> MatrixError, field: &str, text: &str) -> Result<(), MatrixError> {
    match text.char_indices().find(|(_, c)| c.is_control()) {
        None => Ok(()),
        Some((at, c)) => Err(err(
            field,
            format!(
                "holds the control character U+{:04X} at position {} ('{}'); line breaks, tabs and escapes \
                 are not allowed",
                u32::from(c),
                text[..at].chars().count() + 1,
                text.escape_debug()
            ),
        )),
    }
}

/// Engine arguments: each is passed to the engine as one argument (never
/// through a shell), and none may hold a control character.
fn check_args(err: &dyn Fn(&str, String) -> MatrixError, field: &str, args: &[String]) -> Result<(), MatrixError> {
    for (i, arg) in args.iter().enumerate() {
        plain_text(err, field, arg).map_err(|mut e| {
            e.message = format!("argument {}: {}", i + 1, e.message);
            e
        })?;
        if arg.is_empty() {
            return Err(err(field, format!("argument {} is empty", i + 1)));
        }
    }
    Ok(())
}

impl Matrix {
    /// The configuration of `engine` with the named variants applied, in the
    /// file's order whatever the order of `chosen`, so that one set of
    /// variants always makes one configuration with one name.
    /// The jobs of a grid: each configuration on each profile it runs,
    /// each repeat; a search profile counts its most probes (see
    /// `searches`).
    pub fn grid_jobs(&self) -> usize {
        let weight = |p: &Profile| p.search.as_ref().map_or(1, |s| 2 + s.steps as usize);
        let runs: usize = self
            .configs
            .iter()
            .map(|c| self.profiles.iter().filter(|p| c.runs(&p.name)).map(weight).sum::<usize>())
            .sum();
        runs * self.repeats as usize
    }

    /// The search profiles.
    pub fn searches(&self) -> impl Iterator<Item = (&Profile, &Search)> {
        self.profiles.iter().filter_map(|p| p.search.as_ref().map(|s| (p, s)))
    }

    pub fn config_with(&self, engine: &EngineDef, chosen: &[&str]) -> EngineConfig {
        let set: Vec<&VariantDef> = self.variants.iter().filter(|v| chosen.contains(&v.name.as_str())).collect();
        config(&self.model, engine, &set, self.allow_warm_cache, (&self.profiles, &self.only_with))
    }
}

/// An engine with a set of variants applied: their args after the engine's,
/// the last variant that names a model serving it.
fn config(
    model: &str,
    engine: &EngineDef,
    set: &[&VariantDef],
    allow_warm_cache: bool,
    (all, only_with): (&[Profile], &[(String, Vec<String>)]),
) -> EngineConfig {
    let mut model = model.to_owned();
    let mut args = engine.args.clone();
    let mut name = engine.name.clone();
    let mut profiles = engine.profiles.clone();
    for v in set {
        if let Some(m) = &v.model {
            model = m.clone();
        }
        args.extend(v.args.iter().cloned());
        name.push('+');
        name.push_str(&v.name);
        if let Some(limit) = &v.profiles {
            profiles = Some(match profiles {
                None => limit.clone(),
                Some(mine) => mine.into_iter().filter(|p| limit.contains(p)).collect(),
            });
        }
    }
    // A profile that needs variants this set lacks is not run.
    let lacks = |p: &str| {
        only_with.iter().any(|(name, needed)| name == p && needed.iter().any(|n| !set.iter().any(|v| &v.name == n)))
    };
    if all.iter().any(|p| lacks(&p.name)) {
        let runs = profiles.unwrap_or_else(|| all.iter().map(|p| p.name.clone()).collect());
        profiles = Some(runs.into_iter().filter(|p| !lacks(p)).collect());
    }
    EngineConfig {
        name,
        engine: engine.name.clone(),
        kind: engine.kind,
        variants: set.iter().map(|v| v.name.clone()).collect(),
        model,
        image: engine.image.clone(),
        args,
        runtime: engine.runtime,
        url: engine.url.clone(),
        allow_warm_cache,
        profiles,
    }
}

/// Why configurations and profiles cannot be a fleet check (the field to
/// fix and the words), if they cannot: it runs exactly one configuration,
/// at fixed loads. The parser and `benchfleet fleet check` of a grid matrix
/// share it.
pub fn fleet_refusal(configs: &[EngineConfig], profiles: &[Profile]) -> Option<(String, String)> {
    if configs.len() != 1 {
        let names: Vec<&str> = configs.iter().map(|c| c.name.as_str()).collect();
        return Some((
            "strategy".to_owned(),
            format!(
                "a fleet check runs one engine configuration on every host; this matrix makes {} ({}): keep one \
                 engine and no variants",
                configs.len(),
                names.join(", ")
            ),
        ));
    }
    profiles.iter().find(|p| p.search.is_some()).map(|p| {
        (
            format!("profiles.{}.search", p.name),
            "a fleet check compares every host at one load; give this profile a fixed rate or concurrency".to_owned(),
        )
    })
}

/// Parses the YAML into the raw shape, with the text's comments blanked
/// (for locating fields). Duplicate keys are an error: the YAML crates
/// silently keep the last one when deserializing into a map.
fn parse_raw(file: &str, yaml: &str, strict: bool) -> Result<(RawMatrix, serde_yaml_ng::Value, String), MatrixError> {
    let plain = text::without_comments(yaml);
    if strict {
        text::check(file, &plain)?;
    }
    text::walk(file, yaml, &plain)?;
    let value =
        serde_yaml_ng::from_str::<serde_yaml_ng::Value>(yaml).map_err(|e| text::from_yaml(file, &plain, &e, false))?;
    let top = |message: String| MatrixError { file: file.to_owned(), line: None, field: String::new(), message };
    match &value {
        serde_yaml_ng::Value::Null => {
            return Err(top("is empty: it holds no YAML, only comments or blank lines".to_owned()));
        }
        serde_yaml_ng::Value::Mapping(_) => {}
        other => {
            let what = match other {
                serde_yaml_ng::Value::Sequence(_) => "a sequence",
                serde_yaml_ng::Value::Tagged(_) => "a tagged value",
                _ => "a single value",
            };
            return Err(top(format!("must be a mapping of fields (name, model, engines, profiles, ...), not {what}")));
        }
    }
    let raw = serde_yaml_ng::from_str::<RawMatrix>(yaml).map_err(|e| text::from_yaml(file, &plain, &e, false))?;
    Ok((raw, value, plain))
}

/// The keys of a top-level mapping in file order (the typed maps are sorted).
fn key_order(value: &serde_yaml_ng::Value, section: &str) -> Vec<String> {
    value
        .get(section)
        .and_then(|v| v.as_mapping())
        .map(|m| m.keys().filter_map(|k| k.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

/// Finds the line (from 1) of a dotted field path in the YAML text, in block
/// or flow style, by finding each key in turn after the previous one. Used
/// for errors found after parsing, when the parser's positions are gone.
fn locate(yaml: &str, path: &[&str]) -> Option<usize> {
    let mut at = 0;
    for key in path {
        at += find_key(&yaml[at..], key)?;
    }
    Some(yaml[..at].matches('\n').count() + 1)
}

/// The line of `key`'s second appearance as a key of the mapping the
/// parser found it twice in: it places a duplicate at the mapping's start
/// (`at`, line and column from 1). A flow mapping, or one not found that
/// way, gives the second place `key` stands as a key after that start.
pub(crate) fn second_key_line(yaml: &str, key: &str, at: Option<(usize, usize)>) -> Option<usize> {
    let (line, column) = at.unwrap_or((1, 1));
    if let Some(found) = second_in_block(yaml, key, (line, column)) {
        return Some(found);
    }
    let from = yaml.split_inclusive('\n').take(line.saturating_sub(1)).map(str::len).sum::<usize>();
    let first = from + find_key(&yaml[from..], key)?;
    let second = first + find_key(&yaml[first..], key)?;
    Some(yaml[..second].matches('\n').count() + 1)
}

/// In the block mapping whose first key stands at `(line, column)`: the line
/// of `key`'s second appearance among its own keys (those at its column, on
/// the lines before one indented less), not those of mappings inside it.
fn second_in_block(yaml: &str, key: &str, (line, column): (usize, usize)) -> Option<usize> {
    let col = column.checked_sub(1)?;
    let mut seen = 0;
    for (n, text) in yaml.lines().enumerate().skip(line.checked_sub(1)?) {
        let trimmed = text.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = text.len() - trimmed.len();
        // The first line's key may follow a sequence's `- `.
        if n + 1 > line && indent != col {
            if indent < col {
                return None;
            }
            continue;
        }
        let at_key = text.get(col..)?;
        if matches!(find_key(at_key, key), Some(end) if end == key.len() || end == key.len() + 1) {
            seen += 1;
            if seen == 2 {
                return Some(n + 1);
            }
        }
    }
    None
}

/// Offset just past `key:` (optionally quoted) where it stands as a key.
fn find_key(text: &str, key: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = text[from..].find(key) {
        let start = from + found;
        let end = start + key.len();
        let before = text[..start].chars().next_back();
        let quoted = matches!(before, Some('"' | '\''));
        let key_start = if quoted { start - 1 } else { start };
        let boundary = text[..key_start].chars().next_back().is_none_or(|c| matches!(c, ' ' | '\n' | '{' | ',' | '\t'));
        let rest = &text[end..];
        let rest = if quoted { rest.strip_prefix(['"', '\'']).unwrap_or("") } else { rest };
        if boundary && rest.trim_start_matches(' ').starts_with(':') {
            return Some(end);
        }
        from = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TraceFormat;

    const GOOD: &str = "\
name: demo
model: Qwen/Qwen3.5-9B
hardware: { gpu: H200, gpus_per_job: 1 }
repeats: 2
engines:
  vllm: { image: vllm/vllm-openai:v0.17.1, args: [--max-model-len=8192] }
  sglang: { args: [--context-length=8192] }
variants:
  prefix-caching: { args: [--enable-prefix-caching] }
  fp8: { model: Qwen/Qwen3.5-9B-FP8 }
profiles:
  throughput:
    dataset: { random: { input_tokens: 1024, output_tokens: 128, seed: 42 } }
    rate: 20
    requests: 100
  chat: { dataset: { sharegpt: sharegpt.json }, rate: inf, requests: 10 }
";

    fn hash(path: &str) -> Option<String> {
        (path == "sharegpt.json").then(|| "ab".repeat(32))
    }

    const FLEET: &str = "\
name: fleet
model: Qwen/Qwen3.5-9B
strategy: fleet
engines:
  vllm: { args: [--max-model-len=8192] }
profiles:
  chat: { dataset: { random: { input_tokens: 64, output_tokens: 16 } }, max_concurrency: 8, requests: 100 }
";

    #[test]
    fn a_fleet_check_runs_one_configuration_three_times_by_default() {
        let m = parse("f.yaml", FLEET, &hash).expect("valid");
        assert_eq!((m.strategy, m.repeats, m.configs.len()), (Strategy::Fleet, 3, 1));
        assert_eq!(m.fleet, Some(FleetSpec::default()));
        let tuned = format!("{FLEET}repeats: 5\nfleet: {{ per: gpu, warn_pct: 2, fail_pct: 5, z: 4, drift_pct: 3 }}\n");
        let m = parse("f.yaml", &tuned, &hash).expect("valid");
        let f = m.fleet.expect("fleet");
        assert_eq!((m.repeats, f.per, f.thresholds.fail_pct, f.thresholds.drift_pct), (5, Per::Gpu, 5.0, 3.0));
        let listed = format!("{FLEET}fleet: {{ hosts: 'gpu[01-08],!gpu03' }}\n");
        let f = parse("f.yaml", &listed, &hash).expect("valid").fleet.expect("fleet");
        assert_eq!(f.hosts.as_deref(), Some("gpu[01-08],!gpu03"));
    }

    #[test]
    fn a_fleet_check_says_what_it_cannot_run() {
        let two = FLEET.replace("  vllm: { args: [--max-model-len=8192] }\n", "  vllm: {}\n  sglang: {}\n");
        let e = parse("f.yaml", &two, &hash).expect_err("two configurations").to_string();
        assert!(
            e.contains("strategy: a fleet check runs one engine configuration on every host; this matrix makes 2"),
            "{e}"
        );
        for (extra, said) in [
            ("fleet: { warn_pct: 8 }\n", "fleet.fail_pct: must be at least warn_pct (8), got 7"),
            ("fleet: { per: rack }\n", "fleet.per: must be host or gpu, got 'rack'"),
            ("fleet: { z: -1 }\n", "fleet.z: must be a number above 0, got -1"),
            ("fleet: { zz: 1 }\n", "fleet"),
            (
                "fleet: { hosts: 'gpu[3-1]' }\n",
                "fleet.hosts: host list 'gpu[3-1]': 'gpu[3-1]': '[3-1]': the range runs backwards",
            ),
        ] {
            let e = parse("f.yaml", &format!("{FLEET}{extra}"), &hash).expect_err(extra).to_string();
            assert!(e.contains(said), "{extra}: {e}");
        }
        let grid = FLEET.replace("strategy: fleet\n", "") + "fleet: { per: gpu }\n";
        let e = parse("f.yaml", &grid, &hash).expect_err("fleet without the strategy").to_string();
        assert!(e.contains("fleet: is a fleet check's section: set strategy: fleet"), "{e}");
    }

    fn check_err(yaml: &str, expected: &str) {
        let e = parse("m.yaml", yaml, &hash).expect_err("the matrix should be rejected");
        assert_eq!(e.to_string(), expected);
    }

    #[test]
    fn a_list_of_rates_or_caps_is_a_sweep_of_profiles() {
        let sweep = GOOD.replace("    rate: 20\n", "    rate: [1, 4, 8, 16.5, inf]\n");
        let m = parse("m.yaml", &format!("{sweep}primary_profile: throughput-r8\n"), &hash).expect("valid");
        let names: Vec<&str> = m.profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["throughput-r1", "throughput-r4", "throughput-r8", "throughput-r16.5", "throughput-rinf", "chat"]
        );
        let rates: Vec<Option<f64>> = m.profiles.iter().map(|p| p.rate).collect();
        assert_eq!(rates, [Some(1.0), Some(4.0), Some(8.0), Some(16.5), None, None]);
        assert!(m.profiles[..5].iter().all(|p| p.requests == 100 && p.dataset == m.profiles[0].dataset));
        assert_eq!(m.primary_profile, "throughput-r8");
        let of: Vec<Option<&str>> = m.profiles.iter().map(|p| p.sweep_of.as_deref()).collect();
        assert_eq!(
            of,
            [Some("throughput"); 5].into_iter().chain([None]).collect::<Vec<_>>(),
            "each point names its sweep"
        );

        // Caps, and both at once: every pair.
        let both = GOOD.replace("    rate: 20\n", "    rate: [2, 4]\n    max_concurrency: [16, 64]\n");
        let m = parse("m.yaml", &both, &hash).expect("valid");
        let names: Vec<&str> = m.profiles.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["throughput-r2-c16", "throughput-r2-c64", "throughput-r4-c16", "throughput-r4-c64", "chat"]);
        assert_eq!((m.profiles[1].rate, m.profiles[1].max_concurrency), (Some(2.0), Some(64)));
        // A one-element list is still a sweep point, named as one.
        let one = GOOD.replace("    rate: 20\n", "    rate: [20]\n");
        assert_eq!(parse("m.yaml", &one, &hash).expect("valid").profiles[0].name, "throughput-r20");
    }

    #[test]
    fn an_engine_spread_over_more_gpus_than_a_job_gets_is_refused() {
        let two = GOOD.replace("gpus_per_job: 1", "gpus_per_job: 2");
        let tp = |flags: &str| two.replace("  fp8: {", &format!("  tp: {{ args: [{flags}] }}\n  fp8: {{"));
        // Within the job's GPUs, in either form; SGLang's attention data parallelism shares them.
        for flags in ["--tensor-parallel-size=2", "-tp, '2'"] {
            parse("m.yaml", &tp(flags), &hash).expect("two GPUs a job");
        }
        let sglang = two.replace(
            "[--context-length=8192]",
            "[--context-length=8192, --tp, '2', --dp-size=2, --enable-dp-attention]",
        );
        parse("m.yaml", &sglang, &hash).expect("SGLang's DP attention on its two TP GPUs");
        check_err(
            &tp("--tensor-parallel-size=2, --pipeline-parallel-size=2"),
            "m.yaml:10: variants.tp.args: vllm+tp asks for 4 GPUs (--tensor-parallel-size=2 \
             --pipeline-parallel-size=2) but a job gets 2 (hardware.gpus_per_job): the engine would fail as it starts",
        );
        check_err(
            &tp("-tp, '2', -dp, '0'"),
            "m.yaml:10: variants.tp.args: vllm+tp sets a parallel size of 0 (-tp=2 -dp=0): each must be at least 1: \
             the engine would fail as it starts",
        );
        check_err(
            &sglang.replace(", --enable-dp-attention", ""),
            "m.yaml:7: engines.sglang.args: sglang asks for 4 GPUs (--tp=2 --dp-size=2) but a job gets 2 \
             (hardware.gpus_per_job): the engine would fail as it starts",
        );
        // An external engine started itself: its args only describe it.
        let external = two.replace(
            "  sglang: { args: [--context-length=8192] }",
            "  sglang: { runtime: external, url: 'http://10.0.0.5:30000', args: [--context-length=8192, --tp=8] }",
        );
        let m = parse("m.yaml", &external, &hash).expect("an external engine on its own GPUs");
        assert_eq!(m.engines[1].runtime, RuntimeKind::External);
        // The greedy strategy tries each variant alone on each engine: each is checked.
        let greedy = format!("{}strategy: greedy\nprimary_profile: throughput\n", tp("--tensor-parallel-size=8"));
        check_err(
            &greedy,
            "m.yaml:10: variants.tp.args: vllm+tp asks for 8 GPUs (--tensor-parallel-size=8) but a job gets 2 \
             (hardware.gpus_per_job): the engine would fail as it starts",
        );
        // And combines those that help: two layouts that each fit do not together.
        let layouts = |tp_group: &str, pp_group: &str| {
            two.replace(
                "  fp8: {",
                &format!(
                    "  tp: {{ args: [-tp=2], engines: [vllm]{tp_group} }}\n  \
                     pp: {{ args: [--pipeline-parallel-size, '2'], engines: [vllm]{pp_group} }}\n  fp8: {{"
                ),
            ) + "strategy: greedy\nprimary_profile: throughput\n"
        };
        check_err(
            &layouts("", ""),
            "m.yaml:11: variants.pp.args: vllm+tp+pp asks for 4 GPUs (-tp=2 --pipeline-parallel-size=2) but a job \
             gets 2 (hardware.gpus_per_job): the engine would fail as it starts; the study combines variants of \
             different groups: give these one `group` to try them as alternatives",
        );
        parse("m.yaml", &layouts(", group: layout", ", group: layout"), &hash)
            .expect("alternatives are never combined");
        // A grid combines them too, and as alternatives does not.
        let grid = |g: &str| layouts(g, g).replace("strategy: greedy\n", "");
        assert_eq!(parse("m.yaml", &grid(""), &hash).expect_err("combined").field, "variants.pp.args");
        parse("m.yaml", &grid(", group: layout"), &hash).expect("a grid runs alternatives apart");
        // A size set twice takes the last, as the engine's parser does.
        let again =
            layouts("", "").replace("[--pipeline-parallel-size, '2']", "[-tp=1, --pipeline-parallel-size, '2']");
        parse("m.yaml", &again, &hash).expect("tp 1 x pp 2 on two GPUs");
    }

    #[test]
    fn engines_variants_and_profiles_limit_which_profiles_a_configuration_runs() {
        let yaml = "\
name: limits
model: m
engines:
  vllm: { runtime: process, args: [--max-model-len=8192] }
  sglang: { runtime: process, args: [--context-length=8192], profiles: [short] }
variants:
  long-ctx: { args: [--max-model-len=65536], engines: [vllm] }
  mtp: { args: [--mtp], profiles: [short, rates] }
profiles:
  short: { dataset: { random: { input_tokens: 128, output_tokens: 16 } }, requests: 10 }
  long: { dataset: { random: { input_tokens: 40000, output_tokens: 16 } }, requests: 10, only_with: [long-ctx] }
  rates: { dataset: { random: { input_tokens: 128, output_tokens: 16 } }, rate: [1, 2], requests: 10 }
";
        let m = parse("m.yaml", yaml, &hash).expect("valid: the long profile only runs where its context fits");
        let runs: Vec<(String, Vec<String>)> = m
            .configs
            .iter()
            .map(|c| (c.name.clone(), m.profiles.iter().filter(|p| c.runs(&p.name)).map(|p| p.name.clone()).collect()))
            .collect();
        let want = |c: &str, ps: &[&str]| (c.to_owned(), ps.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>());
        assert_eq!(
            runs,
            [
                want("vllm", &["short", "rates-r1", "rates-r2"]),
                want("vllm+long-ctx", &["short", "long", "rates-r1", "rates-r2"]),
                want("vllm+mtp", &["short", "rates-r1", "rates-r2"]),
                want("vllm+long-ctx+mtp", &["short", "rates-r1", "rates-r2"]),
                want("sglang", &["short"]),
                want("sglang+mtp", &["short"]),
            ]
        );
        assert_eq!(m.grid_jobs(), 3 + 4 + 3 + 3 + 1 + 1);

        // Without the limit the long profile would not fit the baseline.
        let unlimited = yaml.replace(", only_with: [long-ctx]", "");
        let e = parse("m.yaml", &unlimited, &hash).expect_err("too long for vllm");
        assert!(e.to_string().contains("40000 input tokens do not fit the context of vllm"), "{e}");

        // Names are checked; nothing left is left out, and said.
        check_err(
            &yaml.replace("profiles: [short, rates]", "profiles: [short, fast]"),
            "m.yaml:8: variants.mtp.profiles: no profile named 'fast'; profiles are: short, long, rates-r1, rates-r2",
        );
        check_err(
            &yaml.replace("only_with: [long-ctx]", "only_with: [huge]"),
            "m.yaml:11: profiles.long.only_with: no variant named 'huge'; variants are: long-ctx, mtp",
        );
        check_err(
            &yaml.replace("profiles: [short, rates]", "profiles: []"),
            "m.yaml:8: variants.mtp.profiles: names no profile; leave it out to run every profile",
        );
        let disjoint = yaml.replace("profiles: [short, rates]", "profiles: [rates]");
        let m = parse("m.yaml", &disjoint, &hash).expect("valid");
        assert!(!m.configs.iter().any(|c| c.name == "sglang+mtp"));
        assert!(m.warnings.iter().any(|w| w.starts_with("sglang+mtp runs no profile")), "{:?}", m.warnings);

        // Greedy decides on the primary profile: everything it tries runs it.
        let greedy = format!("{yaml}strategy: greedy\nprimary_profile: rates-r1\n");
        check_err(
            &greedy,
            "m.yaml:5: engines.sglang.profiles: leaves out the primary profile 'rates-r1', on which the greedy strategy decides",
        );
        check_err(
            &format!("{yaml}strategy: greedy\nprimary_profile: long\n"),
            "m.yaml:11: profiles.long.only_with: the primary profile 'long' must run on every configuration: the greedy strategy decides on it",
        );
    }

    #[test]
    fn a_profile_s_goodput_slos_are_checked() {
        let with = |g: &str| GOOD.replace("    rate: 20\n", &format!("    rate: 20\n    goodput: {g}\n"));
        let m = parse("m.yaml", &with("{ ttft_ms: 200, tpot_ms: 50 }"), &hash).expect("valid");
        let slo = m.profiles[0].goodput.expect("goodput");
        assert_eq!(slo.words(), ["ttft:200", "tpot:50"]);
        check_err(
            &with("{ ttft_ms: -1 }"),
            "m.yaml:15: profiles.throughput.goodput.ttft_ms: must be ms, at least 0, got -1",
        );
        check_err(&with("{}"), "m.yaml:15: profiles.throughput.goodput: gives no SLO: set ttft_ms, tpot_ms or e2el_ms");
        let e = parse("m.yaml", &with("{ ttfb_ms: 3 }"), &hash).expect_err("unknown");
        assert!(e.to_string().contains("unknown field `ttfb_ms`"), "{e}");
    }

    #[test]
    fn a_bad_sweep_is_refused_at_its_field() {
        let with = |rate: &str| GOOD.replace("    rate: 20\n", &format!("    {rate}\n"));
        check_err(
            &with("rate: []"),
            "m.yaml:14: profiles.throughput.rate: an empty sweep: give one value or a list of them",
        );
        check_err(&with("rate: [1, 2, 1]"), "m.yaml:14: profiles.throughput.rate: the sweep gives the rate 1 twice");
        check_err(
            &with("rate: [1, -2]"),
            "m.yaml:14: profiles.throughput.rate: must be a positive number of requests per second, got -2",
        );
        check_err(
            &with("max_concurrency: [8, 0]"),
            "m.yaml:14: profiles.throughput.max_concurrency: must be at least 1, got 0",
        );
        let many = format!("rate: [{}]", (1..=65).map(|i| i.to_string()).collect::<Vec<_>>().join(", "));
        check_err(&with(&many), "m.yaml:14: profiles.throughput.rate: a sweep of 65 values; at most 64");
        check_err(
            &format!("{}primary_profile: throughput\n", with("rate: [1, 2]")),
            "m.yaml:17: primary_profile: 'throughput' is a sweep; name one of its profiles: throughput-r1, throughput-r2",
        );
        // A point may not take another profile's name.
        let clash = with("rate: [1, 2]").replace("  chat: {", "  throughput-r2: {");
        check_err(
            &clash,
            "m.yaml:16: profiles.throughput-r2: the sweep of profile 'throughput' makes a profile of this name too",
        );
        check_err(
            &with("rate: [1, 2]\n    mode: synchronous"),
            "m.yaml:15: profiles.throughput.mode: sets the rate and the concurrency: give mode, or rate and max_concurrency, not both",
        );
    }

    #[test]
    fn expands_every_engine_and_variant_combination() {
        let m = parse("m.yaml", GOOD, &hash).expect("valid matrix");
        let names: Vec<&str> = m.configs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "vllm",
                "vllm+prefix-caching",
                "vllm+fp8",
                "vllm+prefix-caching+fp8",
                "sglang",
                "sglang+prefix-caching",
                "sglang+fp8",
                "sglang+prefix-caching+fp8"
            ]
        );
        let both = &m.configs[3];
        assert_eq!(both.model, "Qwen/Qwen3.5-9B-FP8");
        assert_eq!(both.args, ["--max-model-len=8192", "--enable-prefix-caching"]);
        assert_eq!(m.repeats, 2);
        assert_eq!(m.profiles.len(), 2);
        assert_eq!(m.profiles[0].rate, Some(20.0));
        assert_eq!(m.profiles[1].rate, None);
        assert_eq!(m.primary_profile, "throughput");
    }

    #[test]
    fn unknown_field_is_named_with_its_line() {
        check_err(
            &GOOD.replace("rate: 20", "rte: 20"),
            "m.yaml:14: profiles.throughput: unknown field `rte`, expected one of `dataset`, `rate`, `arrival`, `requests`, `max_concurrency`, `endpoint`, `seed`, `lag_limit_ms`, `rate_tolerance`, `mode`, `warmup`, `cooldown`, `max_duration`, `ignore_eos`, `extra_body`, `only_with`, `goodput`, `search`",
        );
    }

    #[test]
    fn negative_rate_is_named_with_its_line() {
        check_err(
            &GOOD.replace("rate: 20", "rate: -5"),
            "m.yaml:14: profiles.throughput.rate: must be a positive number of requests per second, got -5",
        );
    }

    #[test]
    fn flow_style_fields_are_located_too() {
        check_err(
            &GOOD.replace("requests: 10 }", "requests: 0 }"),
            "m.yaml:16: profiles.chat.requests: must be from 1 to 1000000 (split more into repeats or profiles), got 0",
        );
    }

    #[test]
    fn missing_profiles_are_rejected() {
        let no_profiles = GOOD.split("profiles:").next().unwrap_or_default().to_owned();
        check_err(&no_profiles, "m.yaml:1: missing field `profiles`");
        check_err(&format!("{no_profiles}profiles: {{}}\n"), "m.yaml:11: profiles: at least one profile is required");
        check_err(
            &format!("{GOOD}primary_profile: nope\n"),
            "m.yaml:17: primary_profile: no profile named 'nope'; profiles are: throughput, chat",
        );
    }

    #[test]
    fn missing_dataset_file_is_named() {
        check_err(
            &GOOD.replace("sharegpt.json", "missing.json"),
            "m.yaml:16: profiles.chat.dataset.sharegpt: cannot read the ShareGPT file 'missing.json' (paths are relative to the matrix file)",
        );
    }

    #[test]
    fn duplicate_keys_are_an_error() {
        let e = parse("m.yaml", &format!("{GOOD}repeats: 3\n"), &hash).expect_err("duplicate");
        assert!(e.to_string().contains("the key 'repeats' appears twice"), "{e}");
        assert_eq!(e.line, Some(17));
    }

    #[test]
    fn a_price_per_gpu_hour_is_read_and_checked() {
        let m = parse("m.yaml", &format!("{GOOD}cost: {{ gpu_hour: 3.5 }}\n"), &hash).expect("parses");
        assert_eq!(m.cost, Some(benchfleet_core::cost::Price { gpu_hour: 3.5, currency: "USD".into() }));
        let m = parse("m.yaml", &format!("{GOOD}cost: {{ gpu_hour: 2, currency: EUR }}\n"), &hash).expect("parses");
        assert_eq!(m.cost.map(|c| c.currency), Some("EUR".into()));
        assert_eq!(parse("m.yaml", GOOD, &hash).expect("parses").cost, None);
        check_err(
            &format!("{GOOD}cost: {{ gpu_hour: 0 }}\n"),
            "m.yaml:17: cost.gpu_hour: must be a price above 0, got 0",
        );
        check_err(
            &format!("{GOOD}cost: {{ gpu_hour: 1, currency: 'US$' }}\n"),
            "m.yaml:17: cost.currency: must be a currency code such as USD, got 'US$'",
        );
    }

    /// The duplicate is named where it appears the second time in its own
    /// mapping, not where the same key first appears in another one.
    #[test]
    fn a_duplicate_key_is_named_at_its_second_place_in_its_own_mapping() {
        let twice = |yaml: &str| {
            let e = parse("m.yaml", yaml, &hash).expect_err("duplicate");
            assert!(e.message.contains("appears twice in one mapping"), "{e}");
            e.line
        };
        // `image` stands in each engine; the second engine has two.
        let nested = "engines:\n  a:\n    image: x\n    kind: vllm\n  b:\n    kind: vllm\n    model: m\n    image: y\n    flags: {}\n    image: z\n";
        assert_eq!(twice(nested), Some(10));
        // Inside the mapping, a deeper one's key of the same name is not its own.
        let deeper = "a:\n  b:\n    c: 1\n  x:\n    c: 2\n  c: 3\n  c: 4\n";
        assert_eq!(twice(deeper), Some(7));
        // A sequence item's mapping; and a flow mapping.
        assert_eq!(twice("items:\n  - name: a\n    x: 1\n    name: b\n"), Some(4));
        assert_eq!(twice("a: {k: 1}\nb: {c: 1,\n  k: 2, k: 3}\n"), Some(3));
    }

    #[test]
    fn other_range_checks() {
        check_err(&GOOD.replace("repeats: 2", "repeats: 0"), "m.yaml:4: repeats: must be from 1 to 100, got 0");
        check_err(
            &GOOD.replace("input_tokens: 1024", "input_tokens: -1"),
            "m.yaml:13: profiles.throughput.dataset.random.input_tokens: must be from 1 to 1048576, got -1",
        );
        check_err(
            &GOOD.replace("  sglang: {", "  tgi: {"),
            "m.yaml:7: engines.tgi: cannot tell the engine from its name; set kind: vllm or sglang",
        );
        check_err(
            &format!("{GOOD}objective: speed\n"),
            "m.yaml:17: objective: unknown objective 'speed'; expected total_token_throughput, output_throughput, mean_latency or capacity",
        );
        check_err(
            &format!("{GOOD}strategy: random\n"),
            "m.yaml:17: strategy: unknown strategy 'random'; expected grid, greedy or fleet",
        );
        check_err(
            &format!("{GOOD}acceptance: {{ min_effect: lots }}\n"),
            "m.yaml:17: acceptance.min_effect: must be a fraction from 0 to 1 (0.01) or a percentage (1%), got lots",
        );
        check_err(
            &format!("{GOOD}acceptance: {{ min_effect: 150% }}\n"),
            "m.yaml:17: acceptance.min_effect: must be a fraction from 0 to 1 (0.01) or a percentage (1%), got 150%",
        );
    }

    #[test]
    fn the_minimum_effect_is_a_fraction_or_a_percentage() {
        let effect = |extra: &str| parse("m.yaml", &format!("{GOOD}{extra}"), &hash).expect("valid").min_effect;
        assert_eq!(effect(""), DEFAULT_MIN_EFFECT);
        assert_eq!(effect("acceptance: { min_effect: 2.5% }\n"), 0.025);
        assert_eq!(effect("acceptance: { min_effect: 0.03, min_success_rate: 0.9 }\n"), 0.03);
        assert_eq!(effect("acceptance: { min_effect: 0 }\n"), 0.0);
    }

    #[test]
    fn confirm_repeats_asks_more_repeats_of_a_greedy_run_near_its_minimum_effect() {
        let greedy = GOOD.replace("repeats: 2", "repeats: 1") + "strategy: greedy\n";
        let confirm = |yaml: &str| parse("m.yaml", yaml, &hash).map(|m| m.confirm_repeats);
        assert_eq!(confirm(&greedy).expect("valid"), None);
        assert_eq!(confirm(&format!("{greedy}acceptance: {{ confirm_repeats: 3 }}\n")).expect("valid"), Some(3));
        check_err(
            &format!("{greedy}acceptance: {{ confirm_repeats: 1 }}\n"),
            "m.yaml:18: acceptance.confirm_repeats: must be from 2 to 100, got 1",
        );
        check_err(
            &format!("{greedy}acceptance: {{ confirm_repeats: 101 }}\n"),
            "m.yaml:18: acceptance.confirm_repeats: must be from 2 to 100, got 101",
        );
        check_err(
            &format!("{GOOD}strategy: greedy\nacceptance: {{ confirm_repeats: 2 }}\n"),
            "m.yaml:18: acceptance.confirm_repeats: 2 is not more than repeats (2): a confirmation runs more repeats",
        );
        check_err(
            &format!("{GOOD}acceptance: {{ confirm_repeats: 2 }}\n"),
            "m.yaml:17: acceptance.confirm_repeats: only the greedy strategy confirms its decisions: set strategy: \
             greedy, or remove it",
        );
        check_err(
            &format!("{greedy}acceptance: {{ confirm_repeats: 3, min_effect: 0 }}\n"),
            "m.yaml:18: acceptance.confirm_repeats: confirms a gain under twice acceptance.min_effect, which is 0: \
             set a minimum effect",
        );
        let capacity = include_str!("../../../examples/capacity.yaml").replace("strategy: grid", "strategy: greedy");
        let e = parse("capacity.yaml", &format!("{capacity}acceptance: {{ confirm_repeats: 3 }}\n"), &|_| {
            Some(String::new())
        })
        .expect_err("a search confirms by its probes");
        assert!(e.to_string().contains("the primary profile searches"), "{e}");
    }

    #[test]
    fn greedy_builds_configurations_on_demand_in_file_order() {
        let m = parse("m.yaml", &format!("{GOOD}strategy: greedy\n"), &hash).expect("valid matrix");
        assert_eq!(m.strategy, Strategy::Greedy);
        assert!(m.configs.is_empty());
        let both = m.config_with(&m.engines[0], &["fp8", "prefix-caching"]);
        assert_eq!(both.name, "vllm+prefix-caching+fp8");
        assert_eq!(both.model, "Qwen/Qwen3.5-9B-FP8");
        assert_eq!(both.args, ["--max-model-len=8192", "--enable-prefix-caching"]);
        // The same as the grid builds for the same set.
        let grid = parse("m.yaml", GOOD, &hash).expect("valid matrix");
        assert_eq!(grid.configs[3], both);
    }

    #[test]
    fn an_option_the_engine_would_refuse_is_warned_of_where_it_is_written() {
        // GOOD's prefix caching applies to SGLang too, which has no such flag (its radix cache is on).
        let m = parse("m.yaml", GOOD, &hash).expect("warned, not refused");
        assert_eq!(
            m.warnings,
            ["m.yaml:9: variants.prefix-caching.args: sglang 0.5.9 has no option --enable-prefix-caching: the engine \
              refuses it as it starts, unless its release has it"]
        );
        let only_vllm = GOOD.replace("[--enable-prefix-caching] }", "[--enable-prefix-caching], engines: [vllm] }");
        assert!(parse("m.yaml", &only_vllm, &hash).expect("valid").warnings.is_empty());
        // A typo, and an abbreviation SGLang's parser cannot resolve; vLLM's own spellings are its.
        let typo = only_vllm
            .replace(
                "[--max-model-len=8192]",
                "[--max_model_len=8192, -O3, --max-num-seq, '8', --enable-prefix-cashing]",
            )
            .replace("[--context-length=8192]", "[--context-length=8192, --pp, '1', --sim-speedup=4]");
        let m = parse("m.yaml", &typo, &hash).expect("warned, not refused");
        assert_eq!(m.warnings.len(), 2, "{:?}", m.warnings);
        assert!(
            m.warnings[0]
                .starts_with("m.yaml:6: engines.vllm.args: vllm 0.17.1 has no option --enable-prefix-cashing:")
        );
        assert!(m.warnings[1].starts_with("m.yaml:7: engines.sglang.args: --pp could be any of --pp-size,"));
        // An external engine started itself: its args only describe it.
        let external = only_vllm.replace(
            "  sglang: { args: [--context-length=8192] }",
            "  sglang: { runtime: external, url: 'http://10.0.0.5:30000', args: [--context-length=8192, --made-up] }",
        );
        assert!(parse("m.yaml", &external, &hash).expect("valid").warnings.is_empty());
    }

    /// Every example matrix is one a new submission may be: the checks a
    /// change adds hold for the files the README and the studies point to.
    #[test]
    fn every_example_matrix_is_valid() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let mut checked = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("examples/") {
            let path = entry.expect("an entry").path();
            if path.extension().is_some_and(|e| e == "yaml") {
                let name = path.file_name().expect("a name").to_string_lossy().into_owned();
                let yaml = std::fs::read_to_string(&path).expect("readable");
                let m = parse(&name, &yaml, &|_| Some(String::new())).unwrap_or_else(|e| panic!("{e}"));
                assert!(m.warnings.is_empty(), "{name}: {:?}", m.warnings);
                checked.push(name);
            }
        }
        assert!(checked.len() >= 6, "{checked:?}");
    }

    #[test]
    fn the_greedy_example_is_valid() {
        let yaml = include_str!("../../../examples/greedy.yaml");
        let m = parse("greedy.yaml", yaml, &|_| Some(String::new())).expect("valid matrix");
        assert_eq!((m.strategy, m.engines.len(), m.variants.len()), (Strategy::Greedy, 2, 3));
    }

    #[test]
    fn a_search_profile_is_read_with_its_bounds_and_slos_and_ranks_by_capacity() {
        let yaml = include_str!("../../../examples/capacity.yaml");
        let m = parse("capacity.yaml", yaml, &|_| Some(String::new())).expect("valid matrix");
        assert_eq!(m.objective, "capacity", "the default when the primary profile searches");
        let (p, s) = m.searches().next().expect("a search");
        assert_eq!((p.name.as_str(), p.rate, p.arrival), ("chat", None, Arrival::Poisson));
        assert_eq!((s.over, s.lo, s.hi, s.steps, s.goodput), (Over::Rate, 4.0, 32.0, 3, None));
        let keys: Vec<String> = s.slo.iter().map(|b| format!("{} {}", b.key(), b.ms)).collect();
        assert_eq!(keys, ["ttft_p99_ms 1500", "tpot_p99_ms 50"], "in the file's order");
        assert_eq!(m.grid_jobs(), 2 * (2 + 3), "each search counts its most probes");

        // A concurrency at a fixed rate, judged on goodput.
        let yaml = "name: c\nmodel: m\nhardware: { gpu: H100 }\nengines:\n  vllm: {}\nprofiles:\n  p:\n    \
                    dataset: { random: { input_tokens: 8, output_tokens: 8 } }\n    requests: 100\n    rate: 50\n    \
                    goodput: { ttft_ms: 200 }\n    search: { max_concurrency: [1, 256], slo: { goodput: 100% } }\n  \
                    q: { dataset: { random: { input_tokens: 8, output_tokens: 8 } }, requests: 10 }\n\
                    primary_profile: q\n";
        let m = parse("c.yaml", yaml, &hash).expect("valid");
        let (p, s) = m.searches().next().expect("a search");
        assert_eq!((p.rate, s.over, s.steps, s.goodput), (Some(50.0), Over::Concurrency, 5, Some(1.0)));
        assert_eq!(m.objective, "total_token_throughput", "the primary profile does not search");
        check_err(
            &yaml.replace("primary_profile: q\n", "primary_profile: q\nobjective: capacity\n"),
            "m.yaml:15: objective: capacity ranks by the load a search found, but the primary profile 'q' does not \
             search; give it search: or make a search profile primary",
        );
    }

    #[test]
    fn a_profile_may_set_its_own_lag_limit_and_rate_tolerance() {
        let yaml = GOOD.replace("rate: 20", "rate: 20\n    lag_limit_ms: 20\n    rate_tolerance: 2.5%");
        let m = parse("m.yaml", &yaml, &hash).expect("valid");
        assert_eq!((m.profiles[0].lag_limit_ms, m.profiles[0].rate_tolerance), (Some(20.0), Some(0.025)));
        assert_eq!((m.profiles[1].lag_limit_ms, m.profiles[1].rate_tolerance), (None, None));
    }

    #[test]
    fn alternatives_are_applied_one_at_a_time_and_variants_stay_on_their_engines() {
        let yaml = GOOD.replace(
            "variants:\n  prefix-caching: { args: [--enable-prefix-caching] }\n  fp8: { model: Qwen/Qwen3.5-9B-FP8 }\n",
            "variants:\n  prefix-caching: { args: [--enable-prefix-caching] }\n  \
             seqs-512: { args: [--max-num-seqs=512], group: max-num-seqs, engines: [vllm] }\n  \
             seqs-1024: { args: [--max-num-seqs=1024], group: max-num-seqs, engines: [vllm] }\n",
        );
        let m = parse("m.yaml", &yaml, &hash).expect("valid matrix");
        let names: Vec<&str> = m.configs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "vllm",
                "vllm+prefix-caching",
                "vllm+seqs-512",
                "vllm+seqs-1024",
                "vllm+prefix-caching+seqs-512",
                "vllm+prefix-caching+seqs-1024",
                "sglang",
                "sglang+prefix-caching",
            ]
        );
        assert!(m.configs.iter().all(|c| c.args.iter().filter(|a| a.starts_with("--max-num-seqs")).count() <= 1));
        let bad = yaml.replace("engines: [vllm] }\n  seqs-1024", "engines: [vlm] }\n  seqs-1024");
        check_err(&bad, "m.yaml:10: variants.seqs-512.engines: no engine named 'vlm'; engines are: vllm, sglang");
        let none = yaml.replace("engines: [vllm] }\n  seqs-1024", "engines: [] }\n  seqs-1024");
        let e = parse("m.yaml", &none, &hash).expect_err("an empty list");
        assert!(e.to_string().contains("names no engine"), "{e}");
    }

    #[test]
    fn what_loadgen_can_do_a_profile_can_say() {
        let yaml = GOOD.replace(
            "    rate: 20\n",
            "    mode: synchronous\n    warmup: 10s\n    cooldown: 5\n    max_duration: 2m\n    ignore_eos: true\n    \
             extra_body: { temperature: 0, stop: [x] }\n",
        );
        let m = parse("m.yaml", &yaml, &hash).expect("valid");
        let p = &m.profiles[0];
        assert_eq!((p.rate, p.max_concurrency), (None, Some(1)));
        assert_eq!((p.warmup, p.cooldown), (Some(Window::Seconds(10.0)), Some(Window::Requests(5))));
        assert_eq!((p.max_duration_s, p.ignore_eos), (Some(120.0), true));
        assert_eq!(p.extra_body.as_deref(), Some(r#"{"stop":["x"],"temperature":0}"#));
        let yaml = GOOD.replace(
            "dataset: { random: { input_tokens: 1024, output_tokens: 128, seed: 42 } }",
            "dataset: { shared_prefix: { groups: 4, prefix_tokens: 512, suffix_tokens: 64, output_tokens: 16, seed: 3 } }",
        );
        let m = parse("m.yaml", &yaml, &hash).expect("valid");
        assert_eq!(
            m.profiles[0].dataset,
            Dataset::SharedPrefix { groups: 4, prefix_tokens: 512, suffix_tokens: 64, output_tokens: 16, seed: 3 }
        );
        assert_eq!(m.profiles[0].dataset.input_tokens(), Some(576));
    }

    #[test]
    fn a_stored_matrix_is_read_back_without_the_admission_limits() {
        let older = GOOD
            .replace("gpu: H200", "gpu: A100")
            .replace("repeats: 2", "repeats: 500")
            .replace("prefix-caching: {", "prefix+caching: {");
        let e = parse("m.yaml", &older, &hash).expect_err("a new submission is refused");
        assert!(e.to_string().contains("repeats: must be from 1 to 100"), "{e}");
        let m = reparse("m.yaml", &older, &hash).expect("a stored one still reads");
        assert_eq!((m.gpu.as_deref(), m.repeats, m.variants[0].name.as_str()), (Some("A100"), 500, "prefix+caching"));
        // What it means is unchanged: the same configurations.
        assert_eq!(m.configs.len(), parse("m.yaml", GOOD, &hash).expect("valid").configs.len());
    }

    #[test]
    fn a_trace_is_read_with_its_format_and_speed_and_its_schedule_kept_its_own() {
        let trace = |dataset: &str, more: &str| {
            GOOD.replace(
                "  chat: { dataset: { sharegpt: sharegpt.json }, rate: inf, requests: 10 }",
                &format!("  replay: {{ dataset: {{ trace: {dataset} }}, requests: 10{more} }}"),
            )
        };
        let hash = |path: &str| (path == "t.jsonl").then(|| "cd".repeat(32));
        let m = parse("m.yaml", &trace("{ path: t.jsonl }", ", max_concurrency: 64"), &hash).expect("valid");
        let p = m.profiles.iter().find(|p| p.name == "replay").expect("profile");
        assert_eq!(
            p.dataset,
            Dataset::Trace {
                file: "t.jsonl".into(),
                sha256: "cd".repeat(32),
                format: TraceFormat::Mooncake,
                speed: 1.0
            }
        );
        assert_eq!((p.rate, p.max_concurrency), (None, Some(64)));
        let m = parse("m.yaml", &trace("{ path: t.jsonl, format: jsonl, speed: 2.5 }", ""), &hash).expect("valid");
        assert!(matches!(
            m.profiles.iter().find(|p| p.name == "replay").map(|p| &p.dataset),
            Some(Dataset::Trace { format: TraceFormat::Jsonl, speed: 2.5, .. })
        ));
        let files = referenced_files("m.yaml", &trace("{ path: t.jsonl }", "")).expect("parses");
        assert_eq!(
            files,
            [FileRef { path: "t.jsonl".to_owned(), field: "profiles.replay.dataset.trace.path".to_owned() }]
        );
        for (dataset, more, said) in [
            ("{ path: t.jsonl }", ", rate: 5", "profiles.replay.rate: a trace sends on its own schedule"),
            ("{ path: t.jsonl }", ", mode: throughput", "profiles.replay.mode: a trace sends on its own schedule"),
            ("{ path: t.jsonl }", ", arrival: poisson", "profiles.replay.arrival: a trace sends"),
            (
                "{ path: t.jsonl, format: csv }",
                "",
                "profiles.replay.dataset.trace.format: unknown trace format 'csv'; expected mooncake or jsonl",
            ),
            (
                "{ path: t.jsonl, speed: 0 }",
                "",
                "profiles.replay.dataset.trace.speed: must be above 0 (2.0 replays twice as fast as recorded), got 0",
            ),
            (
                "{ path: gone.jsonl }",
                "",
                "profiles.replay.dataset.trace.path: cannot read the trace 'gone.jsonl' (paths are relative to the matrix file)",
            ),
            ("{ path: t.jsonl, sped: 2 }", "", "unknown field `sped`"),
            (
                "{ path: t.jsonl }",
                ", search: { rate: [1, 8], slo: { p99_ttft_ms: 500 } }",
                "profiles.replay.search.rate: a trace sends on its own schedule",
            ),
        ] {
            let e = parse("m.yaml", &trace(dataset, more), &hash).expect_err(said).to_string();
            assert!(e.contains(said), "{dataset}{more}: {e}");
        }
    }

    #[test]
    fn lists_referenced_files() {
        let files = referenced_files("m.yaml", GOOD).expect("parses");
        assert_eq!(
            files,
            [FileRef { path: "sharegpt.json".to_owned(), field: "profiles.chat.dataset.sharegpt".to_owned() }]
        );
    }
}
