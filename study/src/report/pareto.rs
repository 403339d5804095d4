//! A sweep on serving's two axes: output tokens per second per GPU (what
//! the fleet gets) against output tokens per second per user (what each
//! user sees: 1000 / mean TPOT, the interactivity AIPerf, vLLM and
//! InferenceX plot). Each configuration's points of one sweep (its rates or
//! caps, or a search's probes) make its curve; the points no other point of
//! the sweep beats on both axes, on any configuration, are the Pareto set.
//! A point whose block is INVALID, below the acceptance's success rate, or
//! without a TPOT (one-token replies) is left out.

use serde::{Deserialize, Serialize};

use super::doc::{Configuration, ProfileInfo};
use benchfleet_core::pool;

/// One sweep's curves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParetoSweep {
    /// The swept profile (or the search).
    pub sweep: String,
    pub curves: Vec<ParetoCurve>,
}

/// One configuration's points of a sweep, by tokens per second per user.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParetoCurve {
    pub configuration: String,
    pub points: Vec<ParetoPoint>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParetoPoint {
    /// The sweep's point (`chat-r8`).
    pub profile: String,
    /// Output tokens per second per GPU.
    pub per_gpu: f64,
    /// Output tokens per second per user: 1000 / mean TPOT (ms).
    pub per_user: f64,
    /// No point of the sweep is at least as good on both axes and better on one.
    pub optimal: bool,
}

/// Every sweep of at least two points, in the profiles' order. `gpus`
/// gives a configuration's GPUs a job; `min_success_rate` the acceptance.
pub fn gather(
    profiles: &[ProfileInfo],
    configurations: &[Configuration],
    gpus: &dyn Fn(&str) -> u32,
    min_success_rate: f64,
) -> Vec<ParetoSweep> {
    let mut sweeps: Vec<&str> = Vec::new();
    for p in profiles {
        if let Some(s) = p.sweep_of.as_deref().or(p.probe_of.as_deref())
            && !sweeps.contains(&s)
        {
            sweeps.push(s);
        }
    }
    let mut out = Vec::new();
    for sweep in sweeps {
        let members: Vec<&ProfileInfo> =
            profiles.iter().filter(|p| p.sweep_of.as_deref().or(p.probe_of.as_deref()) == Some(sweep)).collect();
        let mut curves: Vec<ParetoCurve> = configurations
            .iter()
            .map(|c| {
                let per_gpu = f64::from(gpus(&c.name).max(1));
                let mut points: Vec<ParetoPoint> = members
                    .iter()
                    .filter_map(|p| {
                        let block = c.block(&p.name)?;
                        let s = pool(&block.summaries().collect::<Vec<_>>(), None)?;
                        let fine = s.invalid.is_none() && s.success_rate() >= min_success_rate && s.tpot_ms.mean > 0.0;
                        fine.then(|| ParetoPoint {
                            profile: p.name.clone(),
                            per_gpu: s.output_throughput / per_gpu,
                            per_user: 1000.0 / s.tpot_ms.mean,
                            optimal: false,
                        })
                    })
                    .collect();
                points.sort_by(|a, b| a.per_user.total_cmp(&b.per_user));
                ParetoCurve { configuration: c.name.clone(), points }
            })
            .filter(|c| !c.points.is_empty())
            .collect();
        let all: Vec<(f64, f64)> = curves.iter().flat_map(|c| &c.points).map(|p| (p.per_gpu, p.per_user)).collect();
        if all.len() < 2 {
            continue;
        }
        for p in curves.iter_mut().flat_map(|c| &mut c.points) {
            p.optimal =
                !all.iter().any(|&(g, u)| g >= p.per_gpu && u >= p.per_user && (g > p.per_gpu || u > p.per_user));
        }
        out.push(ParetoSweep { sweep: sweep.to_owned(), curves });
    }
    out
}

impl ParetoSweep {
    /// The Pareto set: (configuration, point), by tokens per second per user.
    pub fn optimal(&self) -> Vec<(&str, &ParetoPoint)> {
        let mut set: Vec<(&str, &ParetoPoint)> = self
            .curves
            .iter()
            .flat_map(|c| c.points.iter().filter(|p| p.optimal).map(move |p| (c.configuration.as_str(), p)))
            .collect();
        set.sort_by(|a, b| a.1.per_user.total_cmp(&b.1.per_user));
        set
    }
}
