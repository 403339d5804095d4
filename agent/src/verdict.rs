//! Which GPUs may be benchmarked on: the policy (thresholds from the agent's
//! config file) and the pure functions that turn an inventory into reasons.
//! Every reason is a sentence an operator reads in `benchfleet agents` and
//! `benchfleet-agent verify`, so each names the value that failed.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::gpu::{GpuInfo, THROTTLE_REASONS, UNKNOWN_XID, XidEvent};
use benchfleet_core::gpu::model_matches;

/// The thresholds a GPU must meet; the `[gpu]` table of the agent's config
/// file (see `deploy/agent.example.toml`). The defaults suit a benchmark host: a
/// clean, idle, full-speed GPU.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// The models a GPU may be, matched on the product name's words: one
    /// of them must match. By default the H100 and H200 families benchfleet
    /// is made for; `["H200"]` for hosts meant for one model, `[]` for any
    /// GPU. A string is a list of one.
    #[serde(deserialize_with = "one_or_many")]
    pub require_model: Vec<String>,
    /// Uncorrectable ECC errors since the driver loaded.
    pub max_ecc_uncorrectable: u64,
    /// Uncorrectable ECC errors over the GPU's life; unset: not checked
    /// (old errors whose rows were remapped do no harm).
    pub max_ecc_uncorrectable_aggregate: Option<u64>,
    pub require_ecc: bool,
    pub allow_mig: bool,
    pub allow_retired_pages_pending: bool,
    pub allow_row_remapping_pending: bool,
    /// Current over maximum PCIe link width: 1.0 wants the full x16.
    pub min_pcie_width_fraction: f64,
    /// Current over maximum PCIe generation. 0 by default: an idle GPU lowers
    /// its link generation to save power, so this reads low before a run.
    pub min_pcie_gen_fraction: f64,
    /// Memory that processes other than the agent's engine may hold on a GPU.
    pub max_foreign_memory_mib: u64,
    /// Throttle reasons that do not disqualify (keys of `THROTTLE_REASONS`).
    pub allowed_throttle_reasons: Vec<String>,
    pub max_temperature_c: Option<u32>,
    /// Enforced over default power limit: a capped GPU benchmarks slower.
    pub min_power_limit_fraction: f64,
    pub require_persistence_mode: bool,
    /// XID numbers that do not invalidate an attempt. Empty by default: an
    /// XID during a job, whatever its cause, casts doubt on its numbers.
    pub ignore_xids: Vec<u64>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            require_model: DEFAULT_MODELS.map(str::to_owned).to_vec(),
            max_ecc_uncorrectable: 0,
            max_ecc_uncorrectable_aggregate: None,
            require_ecc: true,
            allow_mig: false,
            allow_retired_pages_pending: false,
            allow_row_remapping_pending: false,
            min_pcie_width_fraction: 1.0,
            min_pcie_gen_fraction: 0.0,
            max_foreign_memory_mib: 1024,
            allowed_throttle_reasons: [
                "gpu_idle",
                "applications_clocks_setting",
                "sync_boost",
                "display_clock_setting",
            ]
            .map(str::to_owned)
            .to_vec(),
            max_temperature_c: Some(85),
            min_power_limit_fraction: 1.0,
            require_persistence_mode: false,
            ignore_xids: Vec::new(),
        }
    }
}

/// The GPU families a host may have when its policy names none.
pub const DEFAULT_MODELS: [&str; 2] = ["H100", "H200"];

/// `"H200"` or `["H100", "H200"]`.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(model) => vec![model],
        OneOrMany::Many(models) => models,
    })
}

/// `"H200"` or `"H100, H200"`: the models of a `--require` flag.
pub fn models_of(list: &str) -> Vec<String> {
    list.split(',').map(|m| m.trim().to_owned()).filter(|m| !m.is_empty()).collect()
}

/// A config file whose GPU policy cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read the agent config {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the agent config {} is not valid: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("the agent config {}: [gpu] {key}: {message}", path.display())]
    Invalid { path: PathBuf, key: &'static str, message: String },
}

impl Policy {
    /// Reads the `[gpu]` table of an agent config file; the defaults where
    /// the file has none. Other tables belong to other parts of the agent.
    pub fn from_file(path: &Path) -> Result<Policy, PolicyError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| PolicyError::Read { path: path.to_owned(), source })?;
        Policy::from_toml(&text, path)
    }

    /// Parses the `[gpu]` table of an agent config file's text; `path` names
    /// it in errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<Policy, PolicyError> {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            gpu: Policy,
        }
        let file: File =
            toml::from_str(text).map_err(|e| PolicyError::Parse { path: path.to_owned(), message: e.to_string() })?;
        file.gpu.validate().map_err(|(key, message)| PolicyError::Invalid { path: path.to_owned(), key, message })?;
        Ok(file.gpu)
    }

    fn validate(&self) -> Result<(), (&'static str, String)> {
        for (key, value) in [
            ("min_pcie_width_fraction", self.min_pcie_width_fraction),
            ("min_pcie_gen_fraction", self.min_pcie_gen_fraction),
            ("min_power_limit_fraction", self.min_power_limit_fraction),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err((key, format!("{value} is not a fraction between 0 and 1")));
            }
        }
        if let Some(unknown) =
            self.allowed_throttle_reasons.iter().find(|r| !THROTTLE_REASONS.iter().any(|(_, key, _)| key == r))
        {
            let known: Vec<&str> = THROTTLE_REASONS.iter().map(|(_, key, _)| *key).collect();
            return Err((
                "allowed_throttle_reasons",
                format!("unknown reason `{unknown}`; known: {}", known.join(", ")),
            ));
        }
        if self.require_model.iter().any(|m| m.trim().is_empty()) {
            return Err((
                "require_model",
                "holds an empty name; name models such as \"H200\", or give [] to accept any GPU".to_owned(),
            ));
        }
        Ok(())
    }
}

/// Fills every GPU's `reasons` from the policy.
pub fn apply(gpus: &mut [GpuInfo], policy: &Policy) {
    for gpu in gpus {
        gpu.reasons = reasons(gpu, policy);
    }
}

/// Why a GPU must not be used under `policy`; empty when it may.
pub fn reasons(gpu: &GpuInfo, policy: &Policy) -> Vec<String> {
    let mut out = Vec::new();
    let models = &policy.require_model;
    if !models.is_empty() && !models.iter().any(|m| model_matches(&gpu.name, m)) {
        out.push(format!("not an {}: {}", models.join(" or "), gpu.name));
    }
    if gpu.mig_enabled == Some(true) && !policy.allow_mig {
        out.push("MIG enabled".to_owned());
    }
    if gpu.ecc_enabled == Some(false) && policy.require_ecc {
        out.push("ECC disabled".to_owned());
    }
    if let Some(n) = gpu.ecc_uncorrectable_volatile
        && n > policy.max_ecc_uncorrectable
    {
        out.push(format!("ECC uncorrectable errors: {n}"));
    }
    if let (Some(n), Some(max)) = (gpu.ecc_uncorrectable_aggregate, policy.max_ecc_uncorrectable_aggregate)
        && n > max
    {
        out.push(format!("ECC uncorrectable errors over the GPU's life: {n}"));
    }
    if gpu.retired_pages_pending == Some(true) && !policy.allow_retired_pages_pending {
        out.push("retired pages pending: reset the GPU".to_owned());
    }
    if let Some(rows) = &gpu.remapped_rows {
        if rows.failed {
            out.push("row remapping failed: the GPU needs service".to_owned());
        }
        if rows.pending && !policy.allow_row_remapping_pending {
            out.push("row remapping pending: reset the GPU".to_owned());
        }
    }
    if let (Some(width), Some(max)) = (gpu.pcie_width, gpu.pcie_width_max)
        && below(width, max, policy.min_pcie_width_fraction)
    {
        out.push(format!("PCIe x{width} of x{max}"));
    }
    if let (Some(generation), Some(max)) = (gpu.pcie_gen, gpu.pcie_gen_max)
        && below(generation, max, policy.min_pcie_gen_fraction)
    {
        out.push(format!("PCIe gen{generation} of gen{max}"));
    }
    if let Some(processes) = gpu.processes.as_deref()
        && !processes.is_empty()
    {
        let unknown = processes.iter().filter(|p| p.used_memory_bytes.is_none()).count();
        let bytes: u64 = processes.iter().filter_map(|p| p.used_memory_bytes).sum();
        if unknown > 0 || bytes > policy.max_foreign_memory_mib << 20 {
            let n = processes.len();
            let (noun, verb) = if n == 1 { ("process", "uses") } else { ("processes", "use") };
            let amount = if unknown > 0 { "an unknown amount of memory".to_owned() } else { size(bytes) };
            out.push(format!("{n} foreign {noun} {verb} {amount}"));
        }
    }
    if let Some(keys) = &gpu.throttle_reasons {
        let throttled: Vec<&str> = keys
            .iter()
            .filter(|k| !policy.allowed_throttle_reasons.contains(k))
            .map(|k| THROTTLE_REASONS.iter().find(|(_, key, _)| key == k).map_or(k.as_str(), |(_, _, label)| label))
            .collect();
        if !throttled.is_empty() {
            out.push(format!("throttled: {}", throttled.join(", ")));
        }
    }
    if let (Some(t), Some(max)) = (gpu.temperature_c, policy.max_temperature_c)
        && t > max
    {
        out.push(format!("temperature {t} C above {max} C"));
    }
    if let (Some(limit), Some(default)) = (gpu.power_limit_w, gpu.power_limit_default_w)
        && below(limit, default, policy.min_power_limit_fraction)
    {
        out.push(format!("power limit {limit} W of {default} W"));
    }
    if gpu.persistence_mode == Some(false) && policy.require_persistence_mode {
        out.push("persistence mode off".to_owned());
    }
    out.extend(gpu.unreadable.iter().map(|what| format!("cannot read {what}")));
    out
}

fn below(value: u32, max: u32, min_fraction: f64) -> bool {
    f64::from(value) < f64::from(max) * min_fraction
}

/// GPU errors that appeared between two probes of the same GPUs, as the
/// reason an attempt is invalid: results measured on a failing GPU are not
/// results. Only the GPUs named by `uuids` (the attempt's) are compared.
pub fn new_errors(before: &[GpuInfo], after: &[GpuInfo], uuids: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (uuid, b, a) in read_twice(before, after, uuids) {
        let grew = |b: Option<u64>, a: Option<u64>| match (b, a) {
            (Some(b), Some(a)) if a > b => a - b,
            _ => 0,
        };
        // Volatile counts reset with the driver; the aggregate one catches
        // errors a driver reload during the attempt would hide.
        let n = grew(b.ecc_uncorrectable_volatile, a.ecc_uncorrectable_volatile)
            .max(grew(b.ecc_uncorrectable_aggregate, a.ecc_uncorrectable_aggregate));
        if n > 0 {
            out.push(format!("new uncorrectable ECC errors on GPU {uuid}: {n}"));
        }
    }
    out
}

/// Each GPU of `uuids` read both `before` and `after` a job.
fn read_twice<'a>(
    before: &'a [GpuInfo],
    after: &'a [GpuInfo],
    uuids: &'a [String],
) -> impl Iterator<Item = (&'a String, &'a GpuInfo, &'a GpuInfo)> {
    uuids.iter().filter_map(move |uuid| {
        let read = |gpus: &'a [GpuInfo]| gpus.iter().find(|g| &g.uuid == uuid);
        Some((uuid, read(before)?, read(after)?))
    })
}

/// What changed on the GPUs of `uuids` between `before` and `after` without
/// making the attempt invalid: rows remapped (for correctable or
/// uncorrectable errors), a remap left pending or failed, corrected ECC
/// errors, pages waiting to be retired. A fleet check shows them beside its verdicts.
pub fn hardware_changes(before: &[GpuInfo], after: &[GpuInfo], uuids: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (uuid, b, a) in read_twice(before, after, uuids) {
        if let (Some(rb), Some(ra)) = (b.remapped_rows, a.remapped_rows) {
            for (what, n) in [
                ("correctable", ra.corrected.saturating_sub(rb.corrected)),
                ("uncorrectable", ra.uncorrected.saturating_sub(rb.uncorrected)),
            ] {
                if n > 0 {
                    let rows = if n == 1 { "row" } else { "rows" };
                    out.push(format!("GPU {uuid}: {n} {rows} remapped for {what} errors during the job"));
                }
            }
            if ra.pending && !rb.pending {
                out.push(format!("GPU {uuid}: a row remap is pending (applied at the next GPU reset)"));
            }
            if ra.failed && !rb.failed {
                out.push(format!("GPU {uuid}: a row remap failed during the job (the GPU needs service)"));
            }
        }
        // Volatile: a driver reload during the job resets it, and then
        // nothing is said.
        if let (Some(cb), Some(ca)) = (b.ecc_corrected_volatile, a.ecc_corrected_volatile)
            && ca > cb
        {
            let n = ca - cb;
            let errors = if n == 1 { "error" } else { "errors" };
            out.push(format!("GPU {uuid}: {n} corrected ECC {errors} during the job"));
        }
        if a.retired_pages_pending == Some(true) && b.retired_pages_pending != Some(true) {
            out.push(format!("GPU {uuid}: pages wait to be retired (at the next GPU reset)"));
        }
    }
    out
}

/// Why an attempt is invalid because of XID events during it: one reason per
/// GPU of `uuids` (the attempt's) and XID number, in order of first
/// occurrence, e.g. "XID 79 on GPU GPU-1" or "XID 13 on GPU GPU-1 (3 times)".
/// `events` are those received during the attempt, less the ignored ones.
pub fn new_xids(events: &[XidEvent], uuids: &[String]) -> Vec<String> {
    uuids
        .iter()
        .flat_map(|uuid| {
            xid_counts(events, uuid)
                .into_iter()
                .map(move |(xid, n)| format!("{} on GPU {uuid}{}", xid_name(xid), times(n)))
        })
        .collect()
}

/// The XID events of one GPU as reasons it is not usable, for `verify`'s
/// watch, e.g. "XID 79 during the watch".
pub fn watched_xids(events: &[XidEvent], uuid: &str) -> Vec<String> {
    xid_counts(events, uuid)
        .into_iter()
        .map(|(xid, n)| format!("{} during the watch{}", xid_name(xid), times(n)))
        .collect()
}

/// Each XID number seen on `uuid`, in order of first occurrence, and how
/// often: a GPU in trouble often repeats one XID many times.
fn xid_counts(events: &[XidEvent], uuid: &str) -> Vec<(u64, usize)> {
    let mut counts: Vec<(u64, usize)> = Vec::new();
    for e in events.iter().filter(|e| e.uuid == uuid) {
        match counts.iter_mut().find(|(xid, _)| *xid == e.xid) {
            Some((_, n)) => *n += 1,
            None => counts.push((e.xid, 1)),
        }
    }
    counts
}

fn xid_name(xid: u64) -> String {
    if xid == UNKNOWN_XID { "an unknown XID".to_owned() } else { format!("XID {xid}") }
}

fn times(n: usize) -> String {
    if n == 1 { String::new() } else { format!(" ({n} times)") }
}

/// A byte count as an operator reads it: "12 GiB", "1.5 GiB", "512 MiB".
pub fn size(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    if bytes >= GIB {
        let gib = bytes as f64 / GIB as f64;
        if bytes.is_multiple_of(GIB) { format!("{} GiB", bytes / GIB) } else { format!("{gib:.1} GiB") }
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{GpuProcess, RemappedRows};

    /// A healthy, idle H200 as NVML reports it.
    fn h200() -> GpuInfo {
        GpuInfo {
            index: 0,
            uuid: "GPU-0".into(),
            name: "NVIDIA H200".into(),
            serial: Some("1650924060000".into()),
            memory_total_bytes: 143_771 << 20,
            memory_used_bytes: Some(0),
            driver_version: "550.54.15".into(),
            cuda_driver_version: "12.4".into(),
            mig_enabled: Some(false),
            ecc_enabled: Some(true),
            ecc_uncorrectable_volatile: Some(0),
            ecc_uncorrectable_aggregate: Some(0),
            ecc_corrected_volatile: Some(0),
            retired_pages_pending: None,
            remapped_rows: Some(RemappedRows::default()),
            throttle_reasons: Some(vec!["gpu_idle".into()]),
            sm_clock_mhz: Some(345),
            sm_clock_max_mhz: Some(1980),
            memory_clock_mhz: Some(3201),
            memory_clock_max_mhz: Some(3201),
            power_limit_w: Some(700),
            power_limit_default_w: Some(700),
            temperature_c: Some(31),
            pcie_gen: Some(1),
            pcie_gen_max: Some(5),
            pcie_width: Some(16),
            pcie_width_max: Some(16),
            persistence_mode: Some(true),
            processes: Some(Vec::new()),
            unreadable: Vec::new(),
            reasons: Vec::new(),
        }
    }

    /// The reasons of an H200 changed by `change`, under `policy`.
    fn check_with(policy: &Policy, change: impl FnOnce(&mut GpuInfo), expected: &[&str]) {
        let mut gpu = h200();
        change(&mut gpu);
        assert_eq!(reasons(&gpu, policy), expected, "for {gpu:#?}");
    }

    fn check(change: impl FnOnce(&mut GpuInfo), expected: &[&str]) {
        check_with(&Policy::default(), change, expected);
    }

    #[test]
    fn a_healthy_idle_gpu_is_usable() {
        check(|_| {}, &[]);
        // Queries a GPU does not support are no reason.
        check(|g| *g = GpuInfo { name: g.name.clone(), ..GpuInfo::default() }, &[]);
    }

    #[test]
    fn model() {
        let h200 = Policy { require_model: vec!["H200".into()], ..Policy::default() };
        check_with(&h200, |_| {}, &[]);
        check_with(&h200, |g| g.name = "NVIDIA A100-SXM4-80GB".into(), &["not an H200: NVIDIA A100-SXM4-80GB"]);
        check_with(&h200, |g| g.name = "NVIDIA GH200 480GB".into(), &["not an H200: NVIDIA GH200 480GB"]);
        // By default the H100 and H200 families, nothing else.
        let default = Policy::default();
        check_with(&default, |g| g.name = "NVIDIA H100 80GB HBM3".into(), &[]);
        check_with(
            &default,
            |g| g.name = "NVIDIA A100-SXM4-80GB".into(),
            &["not an H100 or H200: NVIDIA A100-SXM4-80GB"],
        );
        // An empty list takes any GPU.
        let any = Policy { require_model: Vec::new(), ..Policy::default() };
        check_with(&any, |g| g.name = "NVIDIA A100-SXM4-80GB".into(), &[]);
    }

    #[test]
    fn ecc() {
        check(|g| g.ecc_uncorrectable_volatile = Some(3), &["ECC uncorrectable errors: 3"]);
        check(|g| g.ecc_uncorrectable_aggregate = Some(12), &[]);
        let strict = Policy { max_ecc_uncorrectable: 5, max_ecc_uncorrectable_aggregate: Some(0), ..Policy::default() };
        check_with(&strict, |g| g.ecc_uncorrectable_volatile = Some(5), &[]);
        check_with(
            &strict,
            |g| g.ecc_uncorrectable_aggregate = Some(2),
            &["ECC uncorrectable errors over the GPU's life: 2"],
        );
        check(|g| g.ecc_enabled = Some(false), &["ECC disabled"]);
        check_with(&Policy { require_ecc: false, ..Policy::default() }, |g| g.ecc_enabled = Some(false), &[]);
    }

    #[test]
    fn mig() {
        check(|g| g.mig_enabled = Some(true), &["MIG enabled"]);
        check_with(&Policy { allow_mig: true, ..Policy::default() }, |g| g.mig_enabled = Some(true), &[]);
    }

    #[test]
    fn retired_pages_and_remapped_rows() {
        check(|g| g.retired_pages_pending = Some(true), &["retired pages pending: reset the GPU"]);
        check(
            |g| g.remapped_rows = Some(RemappedRows { corrected: 2, uncorrected: 1, ..RemappedRows::default() }),
            &[],
        );
        check(
            |g| g.remapped_rows = Some(RemappedRows { pending: true, ..RemappedRows::default() }),
            &["row remapping pending: reset the GPU"],
        );
        check(
            |g| g.remapped_rows = Some(RemappedRows { failed: true, ..RemappedRows::default() }),
            &["row remapping failed: the GPU needs service"],
        );
        let lenient =
            Policy { allow_retired_pages_pending: true, allow_row_remapping_pending: true, ..Policy::default() };
        check_with(
            &lenient,
            |g| {
                g.retired_pages_pending = Some(true);
                g.remapped_rows = Some(RemappedRows { pending: true, ..RemappedRows::default() });
            },
            &[],
        );
    }

    #[test]
    fn pcie() {
        check(|g| g.pcie_width = Some(8), &["PCIe x8 of x16"]);
        check_with(&Policy { min_pcie_width_fraction: 0.5, ..Policy::default() }, |g| g.pcie_width = Some(8), &[]);
        // An idle GPU's link runs at gen1: not a fault by default.
        check(|g| g.pcie_gen = Some(1), &[]);
        check_with(
            &Policy { min_pcie_gen_fraction: 1.0, ..Policy::default() },
            |g| g.pcie_gen = Some(4),
            &["PCIe gen4 of gen5"],
        );
    }

    #[test]
    fn foreign_processes() {
        let p = |mib: Option<u64>| GpuProcess { pid: 4242, used_memory_bytes: mib.map(|m| m << 20) };
        check(|g| g.processes = Some(vec![p(Some(512))]), &[]);
        check(|g| g.processes = Some(vec![p(Some(2048))]), &["1 foreign process uses 2 GiB"]);
        check(|g| g.processes = Some(vec![p(Some(6144)), p(Some(6144))]), &["2 foreign processes use 12 GiB"]);
        check(|g| g.processes = Some(vec![p(Some(1536)), p(Some(0))]), &["2 foreign processes use 1.5 GiB"]);
        check(|g| g.processes = Some(vec![p(None)]), &["1 foreign process uses an unknown amount of memory"]);
        let none_allowed = Policy { max_foreign_memory_mib: 0, ..Policy::default() };
        check_with(&none_allowed, |g| g.processes = Some(vec![p(Some(300))]), &["1 foreign process uses 300 MiB"]);
    }

    #[test]
    fn throttling() {
        check(|g| g.throttle_reasons = Some(vec!["hw_slowdown".into()]), &["throttled: HW slowdown"]);
        check(
            |g| {
                g.throttle_reasons =
                    Some(vec!["gpu_idle".into(), "sw_thermal_slowdown".into(), "unknown_0x1000".into()])
            },
            &["throttled: SW thermal slowdown, unknown_0x1000"],
        );
        let allow = Policy { allowed_throttle_reasons: vec!["hw_slowdown".into()], ..Policy::default() };
        check_with(&allow, |g| g.throttle_reasons = Some(vec!["hw_slowdown".into()]), &[]);
    }

    #[test]
    fn temperature_power_persistence() {
        check(|g| g.temperature_c = Some(91), &["temperature 91 C above 85 C"]);
        check_with(&Policy { max_temperature_c: None, ..Policy::default() }, |g| g.temperature_c = Some(91), &[]);
        check(|g| g.power_limit_w = Some(500), &["power limit 500 W of 700 W"]);
        check(|g| g.persistence_mode = Some(false), &[]);
        check_with(
            &Policy { require_persistence_mode: true, ..Policy::default() },
            |g| g.persistence_mode = Some(false),
            &["persistence mode off"],
        );
    }

    #[test]
    fn unreadable_queries_and_several_reasons_are_all_listed() {
        check(
            |g| {
                g.mig_enabled = Some(true);
                g.ecc_uncorrectable_volatile = Some(1);
                g.unreadable = vec!["the clocks: Unknown Error".into()];
            },
            &["MIG enabled", "ECC uncorrectable errors: 1", "cannot read the clocks: Unknown Error"],
        );
    }

    #[test]
    fn policy_from_config_files() {
        let path = Path::new("agent.toml");
        let ok = |text: &str| Policy::from_toml(text, path).expect("valid config");
        let err = |text: &str| Policy::from_toml(text, path).expect_err("invalid config").to_string();
        assert_eq!(ok(""), Policy::default());
        assert_eq!(ok("[docker]\nsocket = \"x\"\n"), Policy::default(), "other tables are other modules' business");
        let p = ok("[gpu]\nrequire_model = \"H200\"\nallow_mig = true\nmax_foreign_memory_mib = 0\n");
        assert_eq!(
            (p.require_model.as_slice(), p.allow_mig, p.max_foreign_memory_mib),
            (&["H200".to_owned()][..], true, 0)
        );
        assert_eq!(ok("[gpu]\nrequire_model = [\"H100 NVL\", \"H200\"]\n").require_model, ["H100 NVL", "H200"]);
        assert!(ok("[gpu]\nrequire_model = []\n").require_model.is_empty());
        assert_eq!(
            ok("[gpu]\nallowed_throttle_reasons = []\n").allowed_throttle_reasons,
            Vec::<String>::new(),
            "an empty list allows no throttling at all"
        );
        for (text, expected) in [
            ("[gpu]\nalow_mig = true\n", "unknown field `alow_mig`"),
            ("[gpu]\nmax_ecc_uncorrectable = -1\n", "max_ecc_uncorrectable"),
            ("[gpu]\nmin_pcie_width_fraction = 2.0\n", "[gpu] min_pcie_width_fraction: 2 is not a fraction"),
            ("[gpu]\nallowed_throttle_reasons = [\"idle\"]\n", "unknown reason `idle`; known: gpu_idle,"),
            ("[gpu]\nrequire_model = \" \"\n", "[gpu] require_model: holds an empty name"),
        ] {
            let message = err(text);
            assert!(message.starts_with("the agent config agent.toml"), "{message}");
            assert!(message.contains(expected), "{text:?}: {message}");
        }
    }

    #[test]
    fn new_errors_during_an_attempt_invalidate_it() {
        let before = vec![h200(), GpuInfo { uuid: "GPU-1".into(), ..h200() }];
        let mut after = before.clone();
        after[1].ecc_uncorrectable_volatile = Some(2);
        let uuids = |u: &[&str]| u.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            new_errors(&before, &after, &uuids(&["GPU-0", "GPU-1"])),
            ["new uncorrectable ECC errors on GPU GPU-1: 2"]
        );
        assert!(new_errors(&before, &after, &uuids(&["GPU-0"])).is_empty(), "another attempt's GPU");
        // A driver reload resets the volatile count; the aggregate one still grew.
        after[1].ecc_uncorrectable_volatile = Some(0);
        after[1].ecc_uncorrectable_aggregate = Some(1);
        assert_eq!(new_errors(&before, &after, &uuids(&["GPU-1"])), ["new uncorrectable ECC errors on GPU GPU-1: 1"]);
        assert!(new_errors(&before, &before, &uuids(&["GPU-0", "GPU-1"])).is_empty());
    }

    #[test]
    fn corrected_ecc_errors_during_an_attempt_are_noted_not_held_against_it() {
        let before = vec![GpuInfo { ecc_corrected_volatile: Some(40), ..h200() }];
        let mut after = before.clone();
        let uuids = ["GPU-0".to_owned()];
        assert!(hardware_changes(&before, &after, &uuids).is_empty(), "none new");
        after[0].ecc_corrected_volatile = Some(41);
        assert_eq!(hardware_changes(&before, &after, &uuids), ["GPU GPU-0: 1 corrected ECC error during the job"]);
        after[0].ecc_corrected_volatile = Some(52);
        assert_eq!(hardware_changes(&before, &after, &uuids), ["GPU GPU-0: 12 corrected ECC errors during the job"]);
        assert!(new_errors(&before, &after, &uuids).is_empty(), "corrected errors do not invalidate");
        // A driver reload reset the count: nothing can be said.
        after[0].ecc_corrected_volatile = Some(3);
        assert!(hardware_changes(&before, &after, &uuids).is_empty());
        // A GPU that does not count them.
        after[0].ecc_corrected_volatile = None;
        assert!(hardware_changes(&before, &after, &uuids).is_empty());
    }

    fn xid(seq: u64, uuid: &str, xid: u64) -> XidEvent {
        XidEvent { seq, uuid: uuid.to_owned(), xid, at_unix_ms: 0 }
    }

    #[test]
    fn xid_events_during_an_attempt_invalidate_it() {
        let uuids = |u: &[&str]| u.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let check = |events: &[XidEvent], on: &[&str], expected: &[&str]| {
            assert_eq!(new_xids(events, &uuids(on)), expected, "{events:?} on {on:?}");
        };
        check(&[], &["GPU-0"], &[]);
        check(&[xid(1, "GPU-1", 79)], &["GPU-0", "GPU-1"], &["XID 79 on GPU GPU-1"]);
        check(&[xid(1, "GPU-1", 79)], &["GPU-0"], &[]);
        check(
            &[xid(1, "GPU-1", 13), xid(2, "GPU-0", 48), xid(3, "GPU-1", 13), xid(4, "GPU-1", 31), xid(5, "GPU-1", 13)],
            &["GPU-0", "GPU-1"],
            &["XID 48 on GPU GPU-0", "XID 13 on GPU GPU-1 (3 times)", "XID 31 on GPU GPU-1"],
        );
        check(&[xid(1, "GPU-0", UNKNOWN_XID)], &["GPU-0"], &["an unknown XID on GPU GPU-0"]);
    }

    #[test]
    fn xid_events_of_a_watch_are_a_gpus_reasons() {
        let events = [xid(1, "GPU-0", 79), xid(2, "GPU-1", 94), xid(3, "GPU-1", 94)];
        assert_eq!(watched_xids(&events, "GPU-0"), ["XID 79 during the watch"]);
        assert_eq!(watched_xids(&events, "GPU-1"), ["XID 94 during the watch (2 times)"]);
        assert!(watched_xids(&events, "GPU-2").is_empty());
    }

    #[test]
    fn ignored_xids_come_from_the_config_file() {
        let path = Path::new("agent.toml");
        assert!(Policy::default().ignore_xids.is_empty(), "every XID counts by default");
        let p = Policy::from_toml("[gpu]\nignore_xids = [43, 45]\n", path).expect("valid config");
        assert_eq!(p.ignore_xids, [43, 45]);
        let e = Policy::from_toml("[gpu]\nignore_xids = [\"43\"]\n", path).expect_err("not a number");
        assert!(e.to_string().contains("ignore_xids"), "{e}");
    }

    #[test]
    fn sizes() {
        for (bytes, expected) in
            [(0, "0 MiB"), (512 << 20, "512 MiB"), (1 << 30, "1 GiB"), (12 << 30, "12 GiB"), (1536 << 20, "1.5 GiB")]
        {
            assert_eq!(size(bytes), expected);
        }
    }
}
