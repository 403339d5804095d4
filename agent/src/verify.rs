//! `benchfleet-agent verify`: the GPU inventory and verdicts of a host, as a
//! table an operator reads on a new host, or as JSON for automation.

use comfy_table::{Table, presets};
use serde::Serialize;

use crate::gpu::GpuInfo;
use crate::verdict::size;

/// What `verify --json` prints.
#[derive(Debug, Serialize)]
pub struct VerifyReport<'a> {
    /// Every GPU is usable (and there is at least one).
    pub usable: bool,
    pub gpus: Vec<GpuVerdict<'a>>,
}

/// One GPU in `verify --json`: its inventory, verdict and fingerprint.
#[derive(Debug, Serialize)]
pub struct GpuVerdict<'a> {
    #[serde(flatten)]
    pub gpu: &'a GpuInfo,
    pub usable: bool,
    pub fingerprint: String,
}

impl<'a> VerifyReport<'a> {
    pub fn new(gpus: &'a [GpuInfo]) -> Self {
        VerifyReport {
            usable: all_usable(gpus),
            gpus: gpus
                .iter()
                .map(|gpu| GpuVerdict { gpu, usable: gpu.usable(), fingerprint: gpu.fingerprint() })
                .collect(),
        }
    }
}

/// A host with no GPU is not usable either: it would never be given work.
pub fn all_usable(gpus: &[GpuInfo]) -> bool {
    !gpus.is_empty() && gpus.iter().all(GpuInfo::usable)
}

/// The inventory as a table, with the host's driver above it and a count of
/// usable GPUs below it.
pub fn table(gpus: &[GpuInfo]) -> String {
    let Some(first) = gpus.first() else {
        return "no GPUs found: check `nvidia-smi` and that the GPUs are visible to this agent\n".to_owned();
    };
    let mut table = Table::new();
    table.load_style(presets::ASCII_MARKDOWN).set_header([
        "#",
        "GPU",
        "memory",
        "ECC",
        "MIG",
        "PCIe",
        "clocks (MHz)",
        "power",
        "temp",
        "processes",
        "verdict",
    ]);
    for g in gpus {
        let on_off = |b: Option<bool>| b.map_or("-", |b| if b { "on" } else { "off" });
        let n = |v: Option<u32>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        let n64 = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        let memory = match g.memory_used_bytes {
            Some(used) => format!("{} ({} used)", size(g.memory_total_bytes), size(used)),
            None => size(g.memory_total_bytes),
        };
        let ecc = format!(
            "{}, {} unc. ({} lifetime)",
            on_off(g.ecc_enabled),
            n64(g.ecc_uncorrectable_volatile),
            n64(g.ecc_uncorrectable_aggregate)
        );
        let pcie = format!("gen{}/{} x{}/{}", n(g.pcie_gen), n(g.pcie_gen_max), n(g.pcie_width), n(g.pcie_width_max));
        let clocks = format!(
            "SM {}/{}, mem {}/{}",
            n(g.sm_clock_mhz),
            n(g.sm_clock_max_mhz),
            n(g.memory_clock_mhz),
            n(g.memory_clock_max_mhz)
        );
        let processes = match g.processes.as_deref() {
            None => "-".to_owned(),
            Some(ps) => ps
                .iter()
                .map(|p| format!("{} ({})", p.pid, p.used_memory_bytes.map_or_else(|| "?".to_owned(), size)))
                .collect::<Vec<_>>()
                .join(", "),
        };
        let verdict = if g.usable() { "usable".to_owned() } else { format!("NOT usable: {}", g.reasons.join("; ")) };
        table.add_row([
            g.index.to_string(),
            format!("{} {}", g.name, g.uuid),
            memory,
            ecc,
            on_off(g.mig_enabled).to_owned(),
            pcie,
            clocks,
            g.power_limit_w.map_or_else(|| "-".to_owned(), |w| format!("{w} W")),
            g.temperature_c.map_or_else(|| "-".to_owned(), |t| format!("{t} C")),
            processes,
            verdict,
        ]);
    }
    let usable = gpus.iter().filter(|g| g.usable()).count();
    format!(
        "driver {}, CUDA {}\n{table}\n{usable} of {} GPUs usable\n",
        first.driver_version,
        first.cuda_driver_version,
        gpus.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_every_gpu_and_why_one_is_not_usable() {
        let good = GpuInfo {
            index: 0,
            uuid: "GPU-0".into(),
            name: "NVIDIA H200".into(),
            memory_total_bytes: 141 << 30,
            driver_version: "550.54.15".into(),
            cuda_driver_version: "12.4".into(),
            ..GpuInfo::default()
        };
        let bad = GpuInfo { index: 1, uuid: "GPU-1".into(), reasons: vec!["MIG enabled".into()], ..good.clone() };
        let text = table(&[good.clone(), bad.clone()]);
        assert!(text.starts_with("driver 550.54.15, CUDA 12.4\n"), "{text}");
        assert!(text.contains("NVIDIA H200 GPU-0"), "{text}");
        assert!(text.contains("NOT usable: MIG enabled"), "{text}");
        assert!(text.ends_with("1 of 2 GPUs usable\n"), "{text}");
        assert!(!all_usable(&[good.clone(), bad]));
        assert!(all_usable(&[good]));
        assert!(!all_usable(&[]), "a host without GPUs is not usable");
        assert!(table(&[]).starts_with("no GPUs found"));
    }
}
