//! The GPUs an agent offers. `GpuProbe` is the seam: the simulated probe
//! serves local mode and tests; the NVML probe (through nvml-wrapper) is the
//! one for real hosts.

/// One GPU and whether it may be benchmarked on.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    /// The product name, e.g. "NVIDIA H200".
    pub name: String,
    pub memory_total_bytes: u64,
    /// Why the GPU must not be used; empty when it may.
    pub reasons: Vec<String>,
}

impl GpuInfo {
    pub fn usable(&self) -> bool {
        self.reasons.is_empty()
    }
}

/// Reads the host's GPU inventory and verdicts.
pub trait GpuProbe: Send + Sync {
    fn probe(&self) -> anyhow::Result<Vec<GpuInfo>>;
}

/// GPUs that do not exist, for local mode and tests: `count` GPUs of one
/// model, all usable.
#[derive(Clone, Debug)]
pub struct SimGpuProbe {
    /// "H100" or "H200".
    pub model: String,
    pub count: u32,
    /// Makes UUIDs unique per simulated host.
    pub host: String,
}

impl GpuProbe for SimGpuProbe {
    fn probe(&self) -> anyhow::Result<Vec<GpuInfo>> {
        let memory_gib: u64 = if self.model.eq_ignore_ascii_case("H100") { 80 } else { 141 };
        Ok((0..self.count)
            .map(|index| GpuInfo {
                index,
                uuid: format!("GPU-sim-{}-{index}", self.host),
                name: format!("NVIDIA {} (simulated)", self.model),
                memory_total_bytes: memory_gib << 30,
                reasons: Vec::new(),
            })
            .collect())
    }
}
