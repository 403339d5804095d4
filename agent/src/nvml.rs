//! The GPU probe of real hosts: reads every GPU's inventory through NVML
//! (nvml-wrapper, which loads `libnvidia-ml.so.1` at run time, so the agent
//! builds and starts on hosts without NVIDIA software) and judges it with the
//! agent's `Policy`; it also takes the readings of a job's telemetry
//! (`GpuProbe::sample`) and the GPUs' energy counters
//! (`GpuProbe::energy_mj`). A thread of its own watches the GPUs' XID events
//! for as long as the probe lives, into a log the async side reads without
//! waiting.

use std::ffi::{OsStr, c_uint};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper::event::EventSet;
use serde::Serialize;
use tracing::{debug, warn};

use crate::gpu::{GpuInfo, GpuProbe, GpuProcess, GpuSample, RemappedRows, UNKNOWN_XID, XidEvent, throttle_reason_keys};
use crate::verdict::{Policy, apply};

/// The library NVML lives in when no other is named.
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// Why NVML could not be used at all (per-GPU failures are reasons instead).
#[derive(Debug, thiserror::Error)]
pub enum NvmlProbeError {
    #[error(
        "no NVIDIA driver found ({lib}): {detail}; install the NVIDIA driver on this host, or run with --sim-gpus \
         MODELxCOUNT to simulate GPUs"
    )]
    NoDriver { lib: String, detail: String },
    #[error("the NVIDIA driver is not loaded ({lib}): load the nvidia kernel module; `nvidia-smi` tells why it failed")]
    DriverNotLoaded { lib: String },
    #[error("no permission to use the NVIDIA driver ({lib}): run the agent as a user who may open /dev/nvidia*")]
    NoPermission { lib: String },
    #[error("cannot start NVML ({lib}): {source}")]
    Init { lib: String, source: NvmlError },
    #[error("cannot list the GPUs through NVML: {0}")]
    List(NvmlError),
    #[error("cannot start the thread that watches the GPUs' XID events: {0}")]
    XidWatcher(std::io::Error),
}

/// Reads the GPUs through NVML; `probe` judges them with `policy`. From its
/// creation until it is dropped, it also records the GPUs' XID events.
pub struct NvmlProbe {
    /// Shared with the XID watcher's thread, which waits on NVML events.
    nvml: Arc<Nvml>,
    pub policy: Policy,
    xid: XidWatcher,
}

impl std::fmt::Debug for NvmlProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlProbe").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl NvmlProbe {
    /// Loads NVML from `lib` (default: the driver's `libnvidia-ml.so.1`,
    /// found by the dynamic loader) and initializes it.
    /// Returns once the XID watcher has registered for every GPU's events
    /// that it can: XID events from then on are recorded.
    pub fn new(lib: Option<&Path>, policy: Policy) -> Result<NvmlProbe, NvmlProbeError> {
        let path: PathBuf = lib.map_or_else(|| PathBuf::from(DEFAULT_LIB), Path::to_path_buf);
        let name = path.display().to_string();
        let nvml = Nvml::builder().lib_path(OsStr::new(path.as_os_str())).init().map_err(|e| match e {
            NvmlError::LibloadingError(detail) => NvmlProbeError::NoDriver { lib: name, detail: detail.to_string() },
            NvmlError::FailedToLoadSymbol(detail) => NvmlProbeError::NoDriver { lib: name, detail },
            NvmlError::DriverNotLoaded => NvmlProbeError::DriverNotLoaded { lib: name },
            NvmlError::NoPermission => NvmlProbeError::NoPermission { lib: name },
            source => NvmlProbeError::Init { lib: name, source },
        })?;
        let nvml = Arc::new(nvml);
        let xid = XidWatcher::start(Arc::clone(&nvml)).map_err(NvmlProbeError::XidWatcher)?;
        Ok(NvmlProbe { nvml, policy, xid })
    }

    /// The GPUs whose XID events are not watched, and why: not supported, or
    /// registration failed. Their attempts are checked for ECC errors only.
    pub fn xid_unwatched(&self) -> &[UnwatchedGpu] {
        &self.xid.unwatched
    }

    /// Every GPU's inventory, without verdicts.
    pub fn inventory(&self) -> Result<Vec<GpuInfo>, NvmlProbeError> {
        let count = self.nvml.device_count().map_err(NvmlProbeError::List)?;
        let mut host_unreadable = Vec::new();
        let driver_version =
            read(&mut host_unreadable, "the driver version", self.nvml.sys_driver_version()).unwrap_or_default();
        let cuda_driver_version = read(&mut host_unreadable, "the CUDA version", self.nvml.sys_cuda_driver_version())
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10))
            .unwrap_or_default();
        Ok((0..count)
            .map(|index| {
                let mut gpu = match self.nvml.device_by_index(index) {
                    Ok(device) => self.read_device(&device),
                    Err(e) => GpuInfo { unreadable: vec![format!("the GPU: {e}")], ..GpuInfo::default() },
                };
                gpu.index = index;
                gpu.driver_version.clone_from(&driver_version);
                gpu.cuda_driver_version.clone_from(&cuda_driver_version);
                gpu.unreadable.extend(host_unreadable.iter().cloned());
                gpu
            })
            .collect())
    }

    fn read_device(&self, device: &Device<'_>) -> GpuInfo {
        let mut bad = Vec::new();
        let u = &mut bad;
        let memory = read(u, "the memory size", device.memory_info());
        let ecc = |counter| device.total_ecc_errors(MemoryError::Uncorrected, counter);
        let processes = read(u, "the processes", device.running_compute_processes()).map(|mut compute| {
            // A process with a graphics context too is listed twice; the
            // graphics list is best effort (compute GPUs often lack it).
            compute.extend(device.running_graphics_processes().unwrap_or_default());
            let mut out: Vec<GpuProcess> = Vec::new();
            for p in compute {
                let used = match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                };
                match out.iter_mut().find(|o| o.pid == p.pid) {
                    Some(o) => o.used_memory_bytes = o.used_memory_bytes.max(used),
                    None => out.push(GpuProcess { pid: p.pid, used_memory_bytes: used }),
                }
            }
            out
        });
        GpuInfo {
            index: 0,
            uuid: read(u, "the UUID", device.uuid()).unwrap_or_default(),
            name: read(u, "the product name", device.name()).unwrap_or_default(),
            serial: read(u, "the serial number", device.serial()),
            memory_total_bytes: memory.as_ref().map_or(0, |m| m.total),
            memory_used_bytes: memory.map(|m| m.used),
            driver_version: String::new(),
            cuda_driver_version: String::new(),
            mig_enabled: read(u, "the MIG mode", device.mig_mode()).map(|m| m.current != 0),
            ecc_enabled: read(u, "the ECC mode", device.is_ecc_enabled()).map(|m| m.currently_enabled),
            ecc_uncorrectable_volatile: read(u, "the ECC error count", ecc(EccCounter::Volatile)),
            ecc_uncorrectable_aggregate: read(u, "the lifetime ECC error count", ecc(EccCounter::Aggregate)),
            ecc_corrected_volatile: read(
                u,
                "the corrected ECC error count",
                device.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile),
            ),
            retired_pages_pending: read(u, "the retired pages", device.are_pages_pending_retired()),
            remapped_rows: read(u, "the remapped rows", remapped_rows(&self.nvml, device)),
            throttle_reasons: read(u, "the throttle reasons", device.current_throttle_reasons())
                .map(|r| throttle_reason_keys(r.bits())),
            sm_clock_mhz: read(u, "the SM clock", device.clock_info(Clock::SM)),
            sm_clock_max_mhz: read(u, "the maximum SM clock", device.max_clock_info(Clock::SM)),
            memory_clock_mhz: read(u, "the memory clock", device.clock_info(Clock::Memory)),
            memory_clock_max_mhz: read(u, "the maximum memory clock", device.max_clock_info(Clock::Memory)),
            power_limit_w: read(u, "the power limit", device.enforced_power_limit()).map(|mw| mw / 1000),
            power_limit_default_w: read(u, "the default power limit", device.power_management_limit_default())
                .map(|mw| mw / 1000),
            temperature_c: read(u, "the temperature", device.temperature(TemperatureSensor::Gpu)),
            pcie_gen: read(u, "the PCIe generation", device.current_pcie_link_gen()),
            pcie_gen_max: read(u, "the maximum PCIe generation", device.max_pcie_link_gen()),
            pcie_width: read(u, "the PCIe width", device.current_pcie_link_width()),
            pcie_width_max: read(u, "the maximum PCIe width", device.max_pcie_link_width()),
            persistence_mode: read(u, "the persistence mode", device.is_in_persistent_mode()),
            processes,
            unreadable: bad,
            reasons: Vec::new(),
        }
    }
}

impl GpuProbe for NvmlProbe {
    fn probe(&self) -> anyhow::Result<Vec<GpuInfo>> {
        let mut gpus = self.inventory()?;
        apply(&mut gpus, &self.policy);
        Ok(gpus)
    }

    fn xid_mark(&self) -> u64 {
        self.xid.log().mark()
    }

    fn xid_events_after(&self, mark: u64) -> Vec<XidEvent> {
        self.xid.log().after(mark, |xid| !self.policy.ignore_xids.contains(&xid))
    }

    fn xid_events_ignored_after(&self, mark: u64) -> Vec<XidEvent> {
        self.xid.log().after(mark, |xid| self.policy.ignore_xids.contains(&xid))
    }

    /// One reading of each GPU by UUID; a GPU that cannot be found fails the
    /// reading, a query it does not answer leaves its value out.
    fn sample(&self, uuids: &[String]) -> anyhow::Result<Vec<GpuSample>> {
        uuids
            .iter()
            .map(|uuid| {
                let d = self.nvml.device_by_uuid(uuid.as_str()).map_err(|e| anyhow::anyhow!("GPU {uuid}: {e}"))?;
                let utilization = d.utilization_rates().ok();
                Ok(GpuSample {
                    uuid: uuid.clone(),
                    sm_clock_mhz: d.clock_info(Clock::SM).ok(),
                    sm_clock_max_mhz: d.max_clock_info(Clock::SM).ok(),
                    memory_clock_mhz: d.clock_info(Clock::Memory).ok(),
                    memory_clock_max_mhz: d.max_clock_info(Clock::Memory).ok(),
                    power_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                    power_limit_w: d.enforced_power_limit().ok().map(|mw| f64::from(mw) / 1000.0),
                    temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
                    utilization_pct: utilization.as_ref().map(|u| u.gpu),
                    memory_utilization_pct: utilization.as_ref().map(|u| u.memory),
                    memory_used_bytes: d.memory_info().ok().map(|m| m.used),
                    throttle_reasons: d.current_throttle_reasons().ok().map(|r| r.bits()),
                    pcie_gen: d.current_pcie_link_gen().ok(),
                    pcie_width: d.current_pcie_link_width().ok(),
                    pcie_gen_max: d.max_pcie_link_gen().ok(),
                    pcie_width_max: d.max_pcie_link_width().ok(),
                })
            })
            .collect()
    }

    /// Each GPU's total energy counter (`nvmlDeviceGetTotalEnergyConsumption`,
    /// Volta and later); a GPU that cannot be found fails the reading, one
    /// that keeps no counter or fails to give it reads `None`.
    fn energy_mj(&self, uuids: &[String]) -> anyhow::Result<Vec<Option<u64>>> {
        uuids
            .iter()
            .map(|uuid| {
                let d = self.nvml.device_by_uuid(uuid.as_str()).map_err(|e| anyhow::anyhow!("GPU {uuid}: {e}"))?;
                Ok(d.total_energy_consumption().inspect_err(|e| debug!(gpu = %uuid, "no energy counter: {e}")).ok())
            })
            .collect()
    }
}

/// A GPU whose XID events are not watched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnwatchedGpu {
    /// None: no GPU is watched (e.g. the GPUs could not be listed).
    pub index: Option<u32>,
    /// Empty when it could not be read.
    pub uuid: String,
    /// Why not, e.g. "not supported by this GPU".
    pub reason: String,
}

/// The XID events a watcher received, in order. It keeps the newest
/// `XidLog::PER_XID` of each GPU and XID number: a GPU that repeats an XID
/// without end neither grows it without end nor pushes out another GPU's
/// events or its own other XIDs (one the policy ignores included), so an
/// XID after a mark is still there, or a newer one of its kind is.
#[derive(Debug, Default)]
struct XidLog {
    /// The `seq` of the newest event; 0 before the first.
    last: u64,
    events: Vec<XidEvent>,
}

impl XidLog {
    const PER_XID: usize = 64;

    fn mark(&self) -> u64 {
        self.last
    }

    fn push(&mut self, uuid: String, xid: u64, at_unix_ms: u64) {
        self.last += 1;
        let same = |e: &&XidEvent| e.uuid == uuid && e.xid == xid;
        if self.events.iter().filter(same).count() >= Self::PER_XID
            && let Some(oldest) = self.events.iter().position(|e| same(&e))
        {
            self.events.remove(oldest);
        }
        self.events.push(XidEvent { seq: self.last, uuid, xid, at_unix_ms });
    }

    /// The events after `mark` whose XID number `keep` takes.
    fn after(&self, mark: u64, keep: impl Fn(u64) -> bool) -> Vec<XidEvent> {
        self.events.iter().filter(|e| e.seq > mark && keep(e.xid)).cloned().collect()
    }
}

/// The thread that waits for XID events (NVML's wait blocks) and the log it
/// fills. Dropping it stops the thread and waits for it, so the event set is
/// freed before NVML shuts down.
struct XidWatcher {
    log: Arc<Mutex<XidLog>>,
    unwatched: Vec<UnwatchedGpu>,
    /// Dropped to stop the thread: its receiver then reads "disconnected".
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl XidWatcher {
    /// How long one wait for an event lasts: the longest a dropped probe
    /// waits for the thread to notice.
    const WAIT: Duration = Duration::from_millis(200);
    /// The pause after a wait failed other than by timing out, so that a
    /// broken event set does not spin.
    const RETRY: Duration = Duration::from_secs(1);

    fn start(nvml: Arc<Nvml>) -> std::io::Result<XidWatcher> {
        let log = Arc::new(Mutex::new(XidLog::default()));
        let (stop, stopped) = mpsc::channel();
        let (ready, registered) = mpsc::sync_channel(1);
        let thread_log = Arc::clone(&log);
        let thread = std::thread::Builder::new().name("xid-watcher".to_owned()).spawn(move || {
            let (set, unwatched) = register_xid_events(&nvml);
            let _ = ready.send(unwatched);
            if let Some(set) = set {
                watch_xids(&nvml, &set, &thread_log, &stopped);
            }
        })?;
        // The thread answers once registration is done, whatever its outcome;
        // no answer means it died, and then nothing is watched.
        let unwatched = registered.recv().unwrap_or_else(|_| {
            vec![UnwatchedGpu { index: None, uuid: String::new(), reason: "the XID watcher stopped".to_owned() }]
        });
        for gpu in &unwatched {
            warn!(gpu = %gpu.uuid, index = ?gpu.index, "XID events not watched: {}", gpu.reason);
        }
        Ok(XidWatcher { log, unwatched, stop: Some(stop), thread: Some(thread) })
    }

    /// The log, briefly: every holder only copies or appends.
    fn log(&self) -> std::sync::MutexGuard<'_, XidLog> {
        // A thread that panicked while holding the lock left a log that is
        // still whole (each change is one push or one remove).
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for XidWatcher {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An event set holding every GPU that supports XID events, and the GPUs
/// left out with why. nvml-wrapper frees a set whose registration failed, so
/// a failed GPU is dropped and the set built again without it.
fn register_xid_events(nvml: &Nvml) -> (Option<EventSet<'_>>, Vec<UnwatchedGpu>) {
    let mut unwatched = Vec::new();
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            let reason = format!("cannot list the GPUs: {e}");
            return (None, vec![UnwatchedGpu { index: None, uuid: String::new(), reason }]);
        }
    };
    let mut candidates: Vec<(u32, String, Device<'_>)> = Vec::new();
    for index in 0..count {
        let mut skip = |uuid: String, reason: String| unwatched.push(UnwatchedGpu { index: Some(index), uuid, reason });
        let (device, uuid) = match nvml.device_by_index(index) {
            Ok(device) => match device.uuid() {
                Ok(uuid) => (device, uuid),
                Err(e) => {
                    skip(String::new(), format!("cannot read the UUID: {e}"));
                    continue;
                }
            },
            Err(e) => {
                skip(String::new(), format!("cannot open the GPU: {e}"));
                continue;
            }
        };
        match device.supported_event_types() {
            Ok(types) if types.contains(EventTypes::CRITICAL_XID_ERROR) => candidates.push((index, uuid, device)),
            Ok(_) | Err(NvmlError::NotSupported) => skip(uuid, "not supported by this GPU".to_owned()),
            Err(e) => skip(uuid, format!("cannot read the events it supports: {e}")),
        }
    }
    let set = 'build: loop {
        if candidates.is_empty() {
            break None;
        }
        let mut set = match nvml.create_event_set() {
            Ok(set) => set,
            Err(e) => {
                let reason = format!("cannot create an NVML event set: {e}");
                unwatched.extend(candidates.drain(..).map(|(index, uuid, _)| UnwatchedGpu {
                    index: Some(index),
                    uuid,
                    reason: reason.clone(),
                }));
                break None;
            }
        };
        for i in 0..candidates.len() {
            match candidates[i].2.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(registered) => set = registered,
                Err(e) => {
                    let (index, uuid, _) = candidates.remove(i);
                    let reason = format!("cannot register for XID events: {}", e.error);
                    unwatched.push(UnwatchedGpu { index: Some(index), uuid, reason });
                    continue 'build;
                }
            }
        }
        break Some(set);
    };
    unwatched.sort_by_key(|g| g.index);
    (set, unwatched)
}

/// Waits for XID events until `stop` disconnects, recording each in `log`.
fn watch_xids(nvml: &Nvml, set: &EventSet<'_>, log: &Mutex<XidLog>, stop: &mpsc::Receiver<()>) {
    let mut last_error = None;
    while matches!(stop.try_recv(), Err(TryRecvError::Empty)) {
        let wait_ms = u32::try_from(XidWatcher::WAIT.as_millis()).unwrap_or(u32::MAX);
        let event = match set.wait(wait_ms) {
            Ok(event) => event,
            Err(NvmlError::Timeout) => continue,
            Err(e) => {
                let message = e.to_string();
                if last_error.as_ref() != Some(&message) {
                    warn!("waiting for XID events failed: {message}; retrying");
                    last_error = Some(message);
                }
                match stop.recv_timeout(XidWatcher::RETRY) {
                    Err(RecvTimeoutError::Timeout) => continue,
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                }
            }
        };
        if !event.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
            continue;
        }
        let xid = match event.event_data {
            Some(XidError::Value(xid)) => xid,
            Some(XidError::Unknown) | None => UNKNOWN_XID,
        };
        let at_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let gpus = event_gpus(nvml, &event.device);
        warn!("XID {xid} on GPU {}", gpus.join(", "));
        let mut log = log.lock().unwrap_or_else(PoisonError::into_inner);
        for uuid in gpus {
            log.push(uuid, xid, at_unix_ms);
        }
    }
}

/// The GPU an event came from, by UUID. A GPU that fell off the bus may no
/// longer say its UUID; its index then names it, and failing that the event
/// is charged to every GPU that can be read, so that no attempt on the
/// failed one passes (an attempt on an unreadable GPU fails its check after
/// the job anyway).
fn event_gpus(nvml: &Nvml, device: &Device<'_>) -> Vec<String> {
    if let Ok(uuid) = device.uuid() {
        return vec![uuid];
    }
    if let Ok(uuid) = device.index().and_then(|i| nvml.device_by_index(i)).and_then(|d| d.uuid()) {
        return vec![uuid];
    }
    let count = nvml.device_count().unwrap_or(0);
    (0..count).filter_map(|i| nvml.device_by_index(i).and_then(|d| d.uuid()).ok()).collect()
}

/// A query's value; `None` when the GPU does not support it, and also when
/// it failed, which `unreadable` records: a GPU that cannot be checked is
/// not trusted.
fn read<T>(unreadable: &mut Vec<String>, what: &str, result: Result<T, NvmlError>) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(NvmlError::NotSupported) => None,
        Err(e) => {
            unreadable.push(format!("{what}: {e}"));
            None
        }
    }
}

/// Row remapping state: nvml-wrapper does not wrap `nvmlDeviceGetRemappedRows`,
/// so this is the agent's one call into NVML's C interface.
#[allow(unsafe_code)]
fn remapped_rows(nvml: &Nvml, device: &Device<'_>) -> Result<RemappedRows, NvmlError> {
    // Resolving the symbol through `nvml_sym` turns a driver without it into
    // an error, where the library's own wrapper method would panic.
    let sym = nvml_sym(nvml.lib().nvmlDeviceGetRemappedRows.as_ref())?;
    let (mut corrected, mut uncorrected, mut pending, mut failed): (c_uint, c_uint, c_uint, c_uint) = (0, 0, 0, 0);
    // SAFETY: `sym` is nvmlDeviceGetRemappedRows from the library `nvml` keeps
    // loaded (and initialized) for as long as `device` borrows it, with the C
    // signature nvml-wrapper-sys generated from nvml.h; the handle is a live
    // device of that library; the four out-pointers are valid, aligned and
    // unaliased `c_uint`s on this stack frame, written only during the call.
    let code =
        unsafe { sym(device.handle(), &raw mut corrected, &raw mut uncorrected, &raw mut pending, &raw mut failed) };
    nvml_try(code)?;
    Ok(RemappedRows { corrected, uncorrected, pending: pending != 0, failed: failed != 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_xid_log_returns_what_came_after_a_mark_of_the_xids_asked_for() {
        let mut log = XidLog::default();
        assert_eq!(log.mark(), 0);
        log.push("GPU-0".into(), 13, 1);
        let mark = log.mark();
        log.push("GPU-1".into(), 79, 2);
        log.push("GPU-0".into(), 43, 3);
        let seen = |mark, ignore: &[u64]| -> Vec<(String, u64)> {
            log.after(mark, |x| !ignore.contains(&x)).into_iter().map(|e| (e.uuid, e.xid)).collect()
        };
        assert_eq!(seen(0, &[]), [("GPU-0".into(), 13), ("GPU-1".into(), 79), ("GPU-0".into(), 43)]);
        assert_eq!(seen(mark, &[]), [("GPU-1".into(), 79), ("GPU-0".into(), 43)]);
        assert_eq!(seen(mark, &[43]), [("GPU-1".into(), 79)]);
        let ignored: Vec<u64> = log.after(mark, |x| x == 43).iter().map(|e| e.xid).collect();
        assert_eq!(ignored, [43], "the ignored ones, apart");
        assert!(seen(log.mark(), &[]).is_empty(), "nothing after the newest");
    }

    #[test]
    fn a_gpu_that_repeats_an_xid_keeps_its_newest_and_pushes_nothing_else_out() {
        let mut log = XidLog::default();
        log.push("GPU-1".into(), 79, 0);
        let mark = log.mark();
        log.push("GPU-0".into(), 48, 0);
        for i in 0..1000 {
            log.push("GPU-0".into(), 43, i);
        }
        assert_eq!(log.events.len(), XidLog::PER_XID + 2);
        let kept: Vec<(&str, u64)> = log.events.iter().take(2).map(|e| (e.uuid.as_str(), e.xid)).collect();
        assert_eq!(kept, [("GPU-1", 79), ("GPU-0", 48)]);
        let after = log.after(mark, |_| true);
        assert_eq!(after.len(), XidLog::PER_XID + 1);
        assert_eq!(after.last().map(|e| e.seq), Some(log.mark()), "the newest is kept");
        assert_eq!(
            log.after(mark, |x| x != 43).iter().map(|e| e.xid).collect::<Vec<_>>(),
            [48],
            "a flood of an ignored XID"
        );
    }

    #[test]
    fn a_host_without_the_driver_is_told_what_to_do() {
        let e = NvmlProbe::new(Some(Path::new("/nonexistent/libnvidia-ml.so.1")), Policy::default())
            .expect_err("no library there");
        assert!(e.to_string().starts_with("no NVIDIA driver found (/nonexistent/libnvidia-ml.so.1): "), "{e}");
        let default = NvmlProbeError::NoDriver { lib: DEFAULT_LIB.to_owned(), detail: "not found".to_owned() };
        assert_eq!(
            default.to_string(),
            "no NVIDIA driver found (libnvidia-ml.so.1): not found; install the NVIDIA driver on this host, or run \
             with --sim-gpus MODELxCOUNT to simulate GPUs"
        );
    }
}
