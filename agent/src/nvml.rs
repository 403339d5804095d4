//! The GPU probe of real hosts: reads every GPU's inventory through NVML
//! (nvml-wrapper, which loads `libnvidia-ml.so.1` at run time, so the agent
//! builds and starts on hosts without NVIDIA software) and judges it with the
//! agent's `Policy`.

use std::ffi::{OsStr, c_uint};
use std::path::{Path, PathBuf};

use nvml_wrapper::Device;
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};

use crate::gpu::{GpuInfo, GpuProbe, GpuProcess, RemappedRows, throttle_reason_keys};
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
}

/// Reads the GPUs through NVML; `probe` judges them with `policy`.
pub struct NvmlProbe {
    nvml: Nvml,
    pub policy: Policy,
}

impl std::fmt::Debug for NvmlProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlProbe").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl NvmlProbe {
    /// Loads NVML from `lib` (default: the driver's `libnvidia-ml.so.1`,
    /// found by the dynamic loader) and initializes it.
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
        Ok(NvmlProbe { nvml, policy })
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
