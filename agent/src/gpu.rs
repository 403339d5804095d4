//! The GPUs an agent offers. `GpuProbe` is the seam: the simulated probe
//! serves local mode and tests; the NVML probe (`crate::nvml`) is the one for
//! real hosts. Both take the readings the telemetry of a job samples
//! (`GpuProbe::sample`) and the energy counters read around its load run
//! (`GpuProbe::energy_mj`). Verdicts (which GPU may be used, and why not) are in
//! `crate::verdict`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use benchfleet_core::telemetry::GpuSample;
use serde::Serialize;

/// One GPU: its inventory as NVML reports it, and whether it may be
/// benchmarked on.
///
/// `None` means the GPU does not support the query (e.g. retired pages on a
/// GPU that remaps rows instead): not a fault. A query that failed for any
/// other reason is listed in `unreadable`, and makes the GPU unusable.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    /// The product name, e.g. "NVIDIA H200".
    pub name: String,
    pub serial: Option<String>,
    pub memory_total_bytes: u64,
    pub memory_used_bytes: Option<u64>,
    /// The kernel driver's version, e.g. "550.54.15" (the same for every GPU
    /// of a host).
    pub driver_version: String,
    /// The CUDA version the driver supports, e.g. "12.4".
    pub cuda_driver_version: String,
    pub mig_enabled: Option<bool>,
    pub ecc_enabled: Option<bool>,
    /// Uncorrectable ECC errors since the last driver reload.
    pub ecc_uncorrectable_volatile: Option<u64>,
    /// Uncorrectable ECC errors over the GPU's lifetime.
    pub ecc_uncorrectable_aggregate: Option<u64>,
    /// Corrected (single-bit) ECC errors since the last driver reload: no
    /// harm to a result, but a count that rises during a job is memory
    /// wearing out before it fails.
    pub ecc_corrected_volatile: Option<u64>,
    /// Pages waiting to be retired at the next reset (GPUs before Ampere).
    pub retired_pages_pending: Option<bool>,
    /// Row remapping state (Ampere and later).
    pub remapped_rows: Option<RemappedRows>,
    /// Why the clocks are held down, as `THROTTLE_REASONS` keys.
    pub throttle_reasons: Option<Vec<String>>,
    pub sm_clock_mhz: Option<u32>,
    pub sm_clock_max_mhz: Option<u32>,
    pub memory_clock_mhz: Option<u32>,
    pub memory_clock_max_mhz: Option<u32>,
    /// The power limit the driver enforces, and the board's default one.
    pub power_limit_w: Option<u32>,
    pub power_limit_default_w: Option<u32>,
    pub temperature_c: Option<u32>,
    pub pcie_gen: Option<u32>,
    pub pcie_gen_max: Option<u32>,
    pub pcie_width: Option<u32>,
    pub pcie_width_max: Option<u32>,
    pub persistence_mode: Option<bool>,
    /// Processes holding GPU memory when the GPU was probed. Before an engine
    /// starts, every one of them is foreign: the agent has none of its own.
    pub processes: Option<Vec<GpuProcess>>,
    /// Queries that failed, as "what: why".
    pub unreadable: Vec<String>,
    /// Why the GPU must not be used; empty when it may.
    pub reasons: Vec<String>,
}

/// Row remapping counters of one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RemappedRows {
    pub corrected: u32,
    pub uncorrected: u32,
    /// A remapping waits for a GPU reset.
    pub pending: bool,
    /// A remapping failed: the GPU needs service.
    pub failed: bool,
}

/// A process that holds memory on a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// None where NVML cannot tell (e.g. inside a container without the
    /// host's process namespace).
    pub used_memory_bytes: Option<u64>,
}

/// NVML's clocks-throttle reason bits and their keys, shared with the
/// telemetry summary (`benchfleet_core::gpu`).
pub use benchfleet_core::gpu::{THROTTLE_REASONS, throttle_reason_keys};

impl GpuInfo {
    pub fn usable(&self) -> bool {
        self.reasons.is_empty()
    }

    /// What identifies the hardware and software a result was measured on:
    /// stored with every result, so two results can be told comparable.
    pub fn fingerprint(&self) -> String {
        fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
            v.as_ref().map_or_else(|| "?".to_owned(), T::to_string)
        }
        format!(
            "{} uuid={} serial={} memory_mib={} driver={} cuda={} sm_max_mhz={} mem_max_mhz={} power_limit_w={} \
             pcie=gen{}x{} ecc={} mig={}",
            self.name,
            self.uuid,
            opt(&self.serial),
            self.memory_total_bytes >> 20,
            self.driver_version,
            self.cuda_driver_version,
            opt(&self.sm_clock_max_mhz),
            opt(&self.memory_clock_max_mhz),
            opt(&self.power_limit_w),
            opt(&self.pcie_gen_max),
            opt(&self.pcie_width_max),
            opt(&self.ecc_enabled.map(on_off)),
            opt(&self.mig_enabled.map(on_off)),
        )
    }
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

/// An XID event: the NVIDIA driver's report of a GPU error (NVML's "critical
/// XID error" event), as a probe received it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct XidEvent {
    /// Its place in the probe's log: the events after a mark are those with
    /// a greater `seq`.
    pub seq: u64,
    /// The GPU it happened on.
    pub uuid: String,
    /// The XID number, e.g. 79 (the GPU fell off the bus); `UNKNOWN_XID` when
    /// the driver could not tell which.
    pub xid: u64,
    /// When the probe received it, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

/// NVML's XID number for an XID error it cannot name.
pub const UNKNOWN_XID: u64 = 999;

/// Reads the host's GPU inventory and verdicts.
pub trait GpuProbe: Send + Sync {
    /// Every GPU of the host, with `reasons` filled by the probe's policy.
    fn probe(&self) -> anyhow::Result<Vec<GpuInfo>>;

    /// The position of the probe's XID log now: `xid_events_after` with it
    /// returns the events received from now on. Reading it never blocks on
    /// the GPUs, so async code may call it.
    fn xid_mark(&self) -> u64 {
        0
    }

    /// The XID events received after `mark`, oldest first, less those the
    /// probe's policy ignores. A probe that watches no XID events (the
    /// simulated one) has none.
    fn xid_events_after(&self, _mark: u64) -> Vec<XidEvent> {
        Vec::new()
    }

    /// The XID events received after `mark` that the probe's policy
    /// ignores: they do not invalidate an attempt, but are noted beside it.
    fn xid_events_ignored_after(&self, _mark: u64) -> Vec<XidEvent> {
        Vec::new()
    }

    /// One reading of each of the GPUs named by UUID (clocks, power,
    /// temperature, utilization, memory, throttle reasons), for a job's
    /// telemetry. Blocks on the GPUs: call it off the async threads.
    fn sample(&self, uuids: &[String]) -> anyhow::Result<Vec<GpuSample>> {
        let _ = uuids;
        anyhow::bail!("this GPU probe takes no readings")
    }

    /// The engine on these GPUs has `running` requests in flight, as its
    /// `/metrics` last said: only simulated GPUs, which have no load of their
    /// own, take it (a simulated GPU is as busy as its simulated engine).
    fn engine_load(&self, _uuids: &[String], _running: f64) {}

    /// Each GPU's total energy counter, millijoules since its driver loaded,
    /// in the order of `uuids`, for a job's energy: `None` for a GPU that
    /// keeps none (or whose counter could not be read), never a guess. A
    /// probe without counters gives `None` for every GPU. Blocks on the
    /// GPUs: call it off the async threads.
    fn energy_mj(&self, uuids: &[String]) -> anyhow::Result<Vec<Option<u64>>> {
        Ok(vec![None; uuids.len()])
    }
}

/// GPUs that do not exist, for local mode and tests: `count` GPUs of one
/// model, all usable. Their readings follow their engine's load
/// (`GpuProbe::engine_load`): idle at 345 MHz and 75 W; busy near their
/// maximum clock, with power (up to about 606 W), heat and utilization
/// rising with the requests in flight; the engine's memory held once it
/// runs. Each keeps an energy counter from the probe's creation: its
/// modelled power integrated over wall time.
#[derive(Clone, Debug)]
pub struct SimGpuProbe {
    /// "H100" or "H200".
    pub model: String,
    pub count: u32,
    /// Makes UUIDs unique per simulated host.
    pub host: String,
    /// Each GPU's load and energy counter.
    state: Arc<Mutex<SimState>>,
    /// How fast each GPU runs, by index: a slow one (`--sim-speed`) holds
    /// its clock down in proportion, as a power cap would.
    pub speed: SimSpeed,
}

/// The speed of simulated GPUs against the model: the host's factor, and
/// any GPU's own (`--sim-speed`, `--sim-speed-gpu INDEX=FACTOR`), so a
/// slow host or GPU can be staged.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimSpeed {
    pub host: Option<f64>,
    pub gpus: std::collections::BTreeMap<u32, f64>,
}

impl SimSpeed {
    /// The factor of the GPU at `index` (1: as modelled).
    pub fn of(&self, index: u32) -> f64 {
        self.gpus.get(&index).copied().or(self.host).unwrap_or(1.0)
    }

    /// The factor of an engine on these GPUs: its slowest GPU's.
    pub fn of_uuids(&self, uuids: &[String]) -> f64 {
        let indexes: Vec<u32> = uuids.iter().filter_map(|u| sim_index(u)).collect();
        if indexes.is_empty() {
            return self.host.unwrap_or(1.0);
        }
        indexes.into_iter().map(|i| self.of(i)).fold(f64::INFINITY, f64::min)
    }

    /// `INDEX=FACTOR`, as `--sim-speed-gpu` takes it.
    pub fn parse_gpu(text: &str) -> Result<(u32, f64), String> {
        let (index, factor) =
            text.split_once('=').ok_or_else(|| format!("'{text}': expected INDEX=FACTOR, e.g. 2=0.9"))?;
        let index = index.trim().parse().map_err(|_| format!("'{text}': '{index}' is not a GPU index"))?;
        Ok((index, Self::factor(factor)?))
    }

    /// A factor from 0.05 to 10.
    pub fn factor(text: &str) -> Result<f64, String> {
        text.trim()
            .parse::<f64>()
            .ok()
            .filter(|f| (0.05..=10.0).contains(f))
            .ok_or_else(|| format!("'{text}' is not a speed factor from 0.05 to 10 (1: as modelled)"))
    }
}

/// A simulated GPU's index, from its UUID (`GPU-sim-HOST-INDEX`).
fn sim_index(uuid: &str) -> Option<u32> {
    uuid.rsplit_once('-').and_then(|(_, i)| i.parse().ok())
}

/// What the simulated GPUs have been through.
#[derive(Debug)]
struct SimState {
    /// When the counters started: each GPU was idle from then until its
    /// engine first reported a load.
    since: Instant,
    /// By UUID, each GPU its engine or a reading has touched.
    gpus: HashMap<String, SimGpu>,
}

/// One simulated GPU.
#[derive(Clone, Copy, Debug)]
struct SimGpu {
    /// The requests its engine last reported in flight; `None` before its
    /// engine ran.
    running: Option<f64>,
    /// Its energy counter, mJ, as of `at`.
    energy_mj: f64,
    at: Instant,
}

impl SimState {
    /// A GPU, its counter brought up to `now` at the power its load drew
    /// since the last time it was touched.
    fn gpu(&mut self, uuid: &str, now: Instant) -> &mut SimGpu {
        let since = self.since;
        let g = self.gpus.entry(uuid.to_owned()).or_insert(SimGpu { running: None, energy_mj: 0.0, at: since });
        let seconds = now.saturating_duration_since(g.at).as_secs_f64();
        g.energy_mj += power_w(utilization(g.running)) * seconds * 1000.0;
        g.at = g.at.max(now);
        g
    }
}

/// A simulated GPU's utilization, percent, with `running` requests in flight.
fn utilization(running: Option<f64>) -> f64 {
    match running {
        Some(r) if r > 0.0 => (40.0 + 15.0 * r).min(100.0),
        _ => 0.0,
    }
}

/// A simulated GPU's power draw at a utilization: 75 W idle, up to 606.25 W.
fn power_w(utilization: f64) -> f64 {
    75.0 + 0.85 * 625.0 * utilization / 100.0
}

impl SimGpuProbe {
    /// `count` simulated GPUs of `model` on the simulated host `host`, idle
    /// and with their energy counters at 0.
    pub fn new(model: impl Into<String>, count: u32, host: impl Into<String>) -> SimGpuProbe {
        let state = SimState { since: Instant::now(), gpus: HashMap::new() };
        SimGpuProbe {
            model: model.into(),
            count,
            host: host.into(),
            state: Arc::new(Mutex::new(state)),
            speed: SimSpeed::default(),
        }
    }

    fn memory_bytes(&self) -> u64 {
        let memory_gib: u64 = if self.model.eq_ignore_ascii_case("H100") { 80 } else { 141 };
        memory_gib << 30
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails for a UUID that is not one of this probe's GPUs.
    fn check(&self, uuid: &str) -> anyhow::Result<()> {
        if !uuid.starts_with(&format!("GPU-sim-{}-", self.host)) {
            anyhow::bail!("no simulated GPU {uuid}");
        }
        Ok(())
    }

    /// `GpuProbe::engine_load` as of `now`.
    fn engine_load_at(&self, uuids: &[String], running: f64, now: Instant) {
        let mut state = self.state();
        for uuid in uuids {
            state.gpu(uuid, now).running = Some(running);
        }
    }

    /// `GpuProbe::energy_mj` as of `now`.
    fn energy_mj_at(&self, uuids: &[String], now: Instant) -> anyhow::Result<Vec<Option<u64>>> {
        let mut state = self.state();
        uuids
            .iter()
            .map(|uuid| {
                self.check(uuid)?;
                Ok(Some(state.gpu(uuid, now).energy_mj as u64))
            })
            .collect()
    }
}

impl GpuProbe for SimGpuProbe {
    fn probe(&self) -> anyhow::Result<Vec<GpuInfo>> {
        Ok((0..self.count)
            .map(|index| GpuInfo {
                index,
                uuid: format!("GPU-sim-{}-{index}", self.host),
                name: format!("NVIDIA {} (simulated)", self.model),
                memory_total_bytes: self.memory_bytes(),
                driver_version: "simulated".to_owned(),
                cuda_driver_version: "simulated".to_owned(),
                ..GpuInfo::default()
            })
            .collect())
    }

    fn sample(&self, uuids: &[String]) -> anyhow::Result<Vec<GpuSample>> {
        let state = self.state();
        let memory_clock_max = if self.model.eq_ignore_ascii_case("H100") { 2619 } else { 3201 };
        uuids
            .iter()
            .map(|uuid| {
                self.check(uuid)?;
                let running = state.gpus.get(uuid).and_then(|g| g.running);
                let utilization = utilization(running);
                let busy = utilization > 0.0;
                // A slow GPU is held down by its power cap while busy.
                let speed = sim_index(uuid).map_or(1.0, |i| self.speed.of(i)).min(1.0);
                let held = busy && speed < 1.0;
                Ok(GpuSample {
                    uuid: uuid.clone(),
                    sm_clock_mhz: Some(if busy {
                        ((1980 - (100.0 - utilization) as u32) as f64 * speed) as u32
                    } else {
                        345
                    }),
                    sm_clock_max_mhz: Some(1980),
                    memory_clock_mhz: Some(memory_clock_max),
                    memory_clock_max_mhz: Some(memory_clock_max),
                    power_w: Some(power_w(utilization)),
                    power_limit_w: Some(700.0),
                    temperature_c: Some(32 + (0.4 * utilization) as u32),
                    utilization_pct: Some(utilization as u32),
                    memory_utilization_pct: Some((0.6 * utilization) as u32),
                    // An engine holds nine tenths of the memory once it runs.
                    memory_used_bytes: Some(if running.is_some() { self.memory_bytes() / 10 * 9 } else { 0 }),
                    // NVML's SW power cap bit while held down, idle's when idle.
                    throttle_reasons: Some(if held {
                        0x4
                    } else if busy {
                        0
                    } else {
                        0x1
                    }),
                    // An H100 or H200 SXM's link, trained down to gen1 when idle.
                    pcie_gen: Some(if busy { 5 } else { 1 }),
                    pcie_width: Some(16),
                    pcie_gen_max: Some(5),
                    pcie_width_max: Some(16),
                })
            })
            .collect()
    }

    fn engine_load(&self, uuids: &[String], running: f64) {
        self.engine_load_at(uuids, running, Instant::now());
    }

    fn energy_mj(&self, uuids: &[String]) -> anyhow::Result<Vec<Option<u64>>> {
        self.energy_mj_at(uuids, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_simulated_gpu_holds_its_clock_down_under_a_power_cap() {
        let mut probe = SimGpuProbe::new("H200", 2, "h");
        probe.speed = SimSpeed { host: None, gpus: [(1, 0.88)].into() };
        let uuids = vec!["GPU-sim-h-0".to_owned(), "GPU-sim-h-1".to_owned()];
        probe.engine_load(&uuids, 8.0);
        let s = probe.sample(&uuids).expect("readings");
        assert_eq!((s[0].sm_clock_mhz, s[0].throttle_reasons), (Some(1980), Some(0)));
        assert_eq!((s[1].sm_clock_mhz, s[1].throttle_reasons), (Some(1742), Some(0x4)), "power capped");
        assert_eq!(probe.speed.of_uuids(&uuids), 0.88, "an engine on both runs at the slower one's speed");
        assert_eq!(probe.speed.of_uuids(&uuids[..1]), 1.0);
    }

    #[test]
    fn sim_speed_flags_are_checked() {
        assert_eq!(SimSpeed::parse_gpu("2=0.9"), Ok((2, 0.9)));
        for bad in ["2", "x=0.9", "2=0", "2=fast", "2=11"] {
            assert!(SimSpeed::parse_gpu(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn simulated_gpus_follow_their_engine_s_load() {
        let probe = SimGpuProbe::new("H200", 2, "h");
        let uuids: Vec<String> = probe.probe().expect("inventory").into_iter().map(|g| g.uuid).collect();
        let idle = probe.sample(&uuids).expect("readings");
        assert_eq!(idle.len(), 2);
        assert_eq!(
            (idle[0].sm_clock_mhz, idle[0].utilization_pct, idle[0].memory_used_bytes),
            (Some(345), Some(0), Some(0))
        );
        probe.engine_load(&uuids[..1], 4.0);
        let busy = probe.sample(&uuids).expect("readings");
        assert_eq!(
            (busy[0].sm_clock_mhz, busy[0].utilization_pct, busy[0].throttle_reasons),
            (Some(1980), Some(100), Some(0))
        );
        assert!(busy[0].power_w > idle[0].power_w && busy[0].temperature_c > idle[0].temperature_c);
        assert_eq!(busy[0].memory_used_bytes, Some((141u64 << 30) / 10 * 9));
        assert_eq!(busy[1], idle[1], "the other GPU's engine is not running");
        assert!(probe.sample(&["GPU-elsewhere".to_owned()]).is_err());
    }

    #[test]
    fn a_simulated_gpu_s_energy_counter_runs_faster_under_load() {
        let probe = SimGpuProbe::new("H200", 2, "h");
        let uuids: Vec<String> = probe.probe().expect("inventory").into_iter().map(|g| g.uuid).collect();
        let t0 = probe.state().since;
        let at = |s: u64| t0 + std::time::Duration::from_secs(s);
        let mj = |s: u64| probe.energy_mj_at(&uuids, at(s)).expect("counters");
        // Idle for 10 s: 75 W each.
        assert_eq!(mj(10), [Some(750_000), Some(750_000)]);
        // The first GPU's engine then runs 4 requests for 10 s: fully busy.
        probe.engine_load_at(&uuids[..1], 4.0, at(10));
        let busy = mj(20);
        assert_eq!(busy, [Some(750_000 + 6_062_500), Some(1_500_000)]);
        // Its engine goes idle again: back to 75 W.
        probe.engine_load_at(&uuids[..1], 0.0, at(20));
        assert_eq!(mj(30)[0], Some(750_000 + 6_062_500 + 750_000));
        // Read in the past, a counter never goes back.
        assert_eq!(mj(25)[0], Some(750_000 + 6_062_500 + 750_000));
        assert!(probe.energy_mj(&["GPU-elsewhere".to_owned()]).is_err());
    }

    #[test]
    fn fingerprint_names_what_makes_results_comparable() {
        let gpu = GpuInfo {
            name: "NVIDIA H200".into(),
            uuid: "GPU-1".into(),
            serial: Some("1650".into()),
            memory_total_bytes: 143_771 << 20,
            driver_version: "550.54.15".into(),
            cuda_driver_version: "12.4".into(),
            sm_clock_max_mhz: Some(1980),
            memory_clock_max_mhz: Some(3201),
            power_limit_w: Some(700),
            pcie_gen_max: Some(5),
            pcie_width_max: Some(16),
            ecc_enabled: Some(true),
            mig_enabled: Some(false),
            ..GpuInfo::default()
        };
        assert_eq!(
            gpu.fingerprint(),
            "NVIDIA H200 uuid=GPU-1 serial=1650 memory_mib=143771 driver=550.54.15 cuda=12.4 sm_max_mhz=1980 \
             mem_max_mhz=3201 power_limit_w=700 pcie=gen5x16 ecc=on mig=off"
        );
        let unknown = GpuInfo { name: "NVIDIA H100".into(), ..GpuInfo::default() };
        assert!(unknown.fingerprint().contains("serial=? "), "{}", unknown.fingerprint());
    }
}
