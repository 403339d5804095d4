//! `benchfleet-agent verify`: the GPU inventory and verdicts of a host, as a
//! table an operator reads on a new host, or as JSON for automation; with
//! `--watch-xid-ms`, also the XID events of a watch ("does this GPU throw
//! XIDs while idle?").

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use comfy_table::{Table, presets};
use serde::Serialize;

use crate::gpu::{GpuInfo, GpuProbe, XidEvent};
use crate::nvml::{NvmlProbe, UnwatchedGpu};
use crate::verdict::{size, watched_xids};

/// What `verify --json` prints.
#[derive(Debug, Serialize)]
pub struct VerifyReport<'a> {
    /// Every GPU is usable (and there is at least one).
    pub usable: bool,
    pub gpus: Vec<GpuVerdict<'a>>,
    /// Only with `--watch-xid-ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xid_watch: Option<&'a XidWatch>,
}

/// What a watch of the GPUs' XID events saw.
#[derive(Debug, Serialize)]
pub struct XidWatch {
    pub started_unix_ms: u64,
    pub watched_ms: u64,
    /// Oldest first, less the XIDs the policy ignores.
    pub events: Vec<XidEvent>,
    /// The GPUs whose XID events could not be watched, and why.
    pub unwatched: Vec<UnwatchedGpu>,
}

/// Watches the probe's XID events for `window` (the probe watches from its
/// creation; only what happens during the window is reported).
pub fn watch_xids(probe: &NvmlProbe, window: Duration) -> XidWatch {
    let started_unix_ms = unix_ms(SystemTime::now());
    let mark = probe.xid_mark();
    std::thread::sleep(window);
    XidWatch {
        started_unix_ms,
        watched_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
        events: probe.xid_events_after(mark),
        unwatched: probe.xid_unwatched().to_vec(),
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl XidWatch {
    /// Adds each GPU's XIDs of the watch to its reasons: a GPU that threw one
    /// is not usable.
    pub fn judge(&self, gpus: &mut [GpuInfo]) {
        for gpu in gpus {
            gpu.reasons.extend(watched_xids(&self.events, &gpu.uuid));
        }
    }

    /// The watch as lines below the table: each event, and the GPUs not
    /// watched (those did not fail; they could not be checked this way).
    pub fn text(&self, gpus: &[GpuInfo]) -> String {
        let name = |uuid: &str| match gpus.iter().find(|g| g.uuid == uuid) {
            Some(g) => format!("GPU {} ({uuid})", g.index),
            None => format!("GPU {uuid}"),
        };
        let mut out = match self.events.len() {
            0 => format!("XID events in {} ms: none\n", self.watched_ms),
            n => format!("XID events in {} ms: {n}\n", self.watched_ms),
        };
        for e in &self.events {
            let into = e.at_unix_ms.saturating_sub(self.started_unix_ms);
            out.push_str(&format!("  XID {} on {}, {into} ms into the watch\n", e.xid, name(&e.uuid)));
        }
        for g in &self.unwatched {
            let gpu = match g.index {
                None => "any GPU".to_owned(),
                Some(index) if g.uuid.is_empty() => format!("GPU {index}"),
                Some(_) => name(&g.uuid),
            };
            out.push_str(&format!("XID events not watched on {gpu}: {}\n", g.reason));
        }
        out
    }
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
    pub fn new(gpus: &'a [GpuInfo], xid_watch: Option<&'a XidWatch>) -> Self {
        VerifyReport {
            xid_watch,
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
            "{}, {} unc. ({} lifetime), {} corr.",
            on_off(g.ecc_enabled),
            n64(g.ecc_uncorrectable_volatile),
            n64(g.ecc_uncorrectable_aggregate),
            n64(g.ecc_corrected_volatile)
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

    #[test]
    fn a_watch_lists_its_xids_and_the_gpus_it_could_not_watch() {
        let gpus: Vec<GpuInfo> =
            (0..2).map(|index| GpuInfo { index, uuid: format!("GPU-{index}"), ..GpuInfo::default() }).collect();
        let unwatched =
            |index, uuid: &str, reason: &str| UnwatchedGpu { index, uuid: uuid.into(), reason: reason.into() };
        let watch = XidWatch {
            started_unix_ms: 1_000,
            watched_ms: 500,
            events: vec![XidEvent { seq: 4, uuid: "GPU-1".into(), xid: 79, at_unix_ms: 1_120 }],
            unwatched: vec![
                unwatched(Some(0), "GPU-0", "not supported by this GPU"),
                unwatched(Some(2), "", "cannot open the GPU: Unknown Error"),
                unwatched(None, "", "cannot list the GPUs: Unknown Error"),
            ],
        };
        assert_eq!(
            watch.text(&gpus),
            "XID events in 500 ms: 1\n  XID 79 on GPU 1 (GPU-1), 120 ms into the watch\n\
             XID events not watched on GPU 0 (GPU-0): not supported by this GPU\n\
             XID events not watched on GPU 2: cannot open the GPU: Unknown Error\n\
             XID events not watched on any GPU: cannot list the GPUs: Unknown Error\n"
        );
        let mut judged = gpus.clone();
        watch.judge(&mut judged);
        assert_eq!(
            (judged[0].usable(), judged[1].reasons.as_slice()),
            (true, ["XID 79 during the watch".to_owned()].as_slice())
        );
        let quiet = XidWatch { events: Vec::new(), unwatched: Vec::new(), ..watch };
        assert_eq!(quiet.text(&gpus), "XID events in 500 ms: none\n");
    }
}
