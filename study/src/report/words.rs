//! Numbers and sentences as the reference reports word them.

use benchfleet_core::Summary;

use super::doc::Configuration;
use crate::greedy::{Measured, Objective, Verdict};

/// Why nothing is recommended, when the primary profile searches: `None`
/// otherwise (the acceptance says why).
pub fn no_capacity(doc: &super::doc::ReportDoc) -> Option<String> {
    let s = doc.searches.iter().find(|s| s.primary)?;
    Some(format!(
        "No configuration held the SLOs of the primary profile `{}` ({}) at any load it probed, from {} {}",
        s.profile,
        s.slo.join(", "),
        number(s.lo),
        s.unit
    ))
}

/// What a recommended command leaves out: the simulator's flags its configuration ran with, each
/// between `quote`s (a backtick in Markdown, nothing in plain text).
pub fn simulator_flags_left_out(flags: &[String], quote: &str) -> String {
    let flags: Vec<String> = flags.iter().map(|f| format!("{quote}{f}{quote}")).collect();
    format!("Run on the simulator with {}, which a real engine would refuse: left out above.", flags.join(", "))
}

/// A number without trailing zeros: `8`, `0.5`, `12.25`.
pub fn number(x: f64) -> String {
    if x.is_infinite() {
        return "inf".to_owned();
    }
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".to_owned() } else { s.to_owned() }
}

/// Two decimals with thousands separated: `4,636.35`.
pub fn grouped(x: f64) -> String {
    let s = format!("{:.2}", x.abs());
    let (int, frac) = s.split_once('.').unwrap_or((&s, "00"));
    let mut out = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    format!("{}{out}.{frac}", if x < 0.0 { "-" } else { "" })
}

/// The objective's headline as the references' tables show it, with the
/// change from `base` when given: `Total TPS: 10570.88 (+9.75%) Mean
/// TPOT(ms): 24.71`, `Mean latency: 1.65s/req (1.26x faster)`.
pub fn headline(objective: Objective, m: &Measured, base: Option<&Measured>) -> String {
    let change = base.map_or(String::new(), |b| {
        // The figures are the whole runs': say when the change is not theirs.
        let steady = if objective.in_steady_state(&[b, m]) { "steady state: " } else { "" };
        format!(" ({steady}{})", objective.change(b, m))
    });
    let s = &m.summary;
    match objective {
        Objective::MeanLatency => format!("Mean latency: {:.2}s/req{change}", s.latency_s.mean),
        Objective::TotalTokenThroughput | Objective::Capacity => {
            format!("Total TPS: {:.2}{change} Mean TPOT(ms): {:.2}", s.total_token_throughput, s.tpot_ms.mean)
        }
        Objective::OutputThroughput => {
            format!("Output TPS: {:.2}{change} Mean TPOT(ms): {:.2}", s.output_throughput, s.tpot_ms.mean)
        }
    }
}

/// A stage in a sentence, on the primary profile: each configuration's
/// value, then the best against the next: `vllm Total TPS = 9632.01, sglang
/// Total TPS = 4995.66. vllm higher by 4,636.35 tok/s (92.8%); Mean TPOT =
/// 25.89 ms vs 180.73 ms, lower by 154.84 ms (85.67%).` A latency objective
/// says how much faster, in TTFT and TPOT too. `None` for a stage of fewer
/// than two measured configurations.
pub fn stage_sentence(
    objective: Objective,
    configs: &[Configuration],
    measured: &[String],
    primary: &str,
    min_success_rate: f64,
) -> Option<String> {
    let mut valued: Vec<(&str, Measured, Vec<Summary>)> = measured
        .iter()
        .filter_map(|name| {
            let block = configs.iter().find(|c| &c.name == name)?.block(primary)?;
            let repeats: Vec<Summary> = block.summaries().cloned().collect();
            let pooled = Measured::pooled(&repeats.iter().collect::<Vec<_>>())?;
            Some((name.as_str(), pooled, repeats))
        })
        .collect();
    if valued.len() < 2 {
        return None;
    }
    // A throughput is ranked by the steady states where every configuration has one (closed
    // loops, as the stage decided), and said so; else by every whole run: like with like.
    let steady = valued.iter().all(|(_, m, _)| objective.steady_of(m).is_some());
    let v = |m: &Measured| match objective {
        _ if steady => objective.value(m),
        // A search's stage lists its runs' throughputs.
        Objective::Capacity => m.summary.total_token_throughput,
        _ => objective.whole_run(m),
    };
    let said = if steady { "steady-state " } else { "" };
    let listing: Vec<String> = valued
        .iter()
        .map(|(name, m, _)| match objective {
            Objective::MeanLatency => format!("{name} Mean latency = {:.2}s", m.summary.latency_s.mean),
            Objective::TotalTokenThroughput | Objective::Capacity => format!("{name} {said}Total TPS = {:.2}", v(m)),
            Objective::OutputThroughput => format!("{name} {said}Output TPS = {:.2}", v(m)),
        })
        .collect();
    // Only what could be adopted is ranked: an INVALID run, or one below
    // the acceptance, is listed and set aside.
    let mut listing = listing;
    for (i, (_, m, _)) in valued.iter().enumerate() {
        let s = &m.summary;
        if let Some(why) = &s.invalid {
            listing[i].push_str(&format!(" (INVALID: {why})"));
        } else if s.success_rate() < min_success_rate {
            listing[i].push_str(&format!(" ({}, not adopted)", s.success_said()));
        }
    }
    valued.retain(|(_, m, _)| m.summary.invalid.is_none() && m.summary.success_rate() >= min_success_rate);
    let score = |m: &Measured| if objective == Objective::MeanLatency { objective.score(m) } else { v(m) };
    valued.sort_by(|a, b| score(&b.1).total_cmp(&score(&a.1)));
    if valued.len() < 2 {
        return Some(format!("{}.", listing.join(", ")));
    }
    let (best, next) = (&valued[0], &valued[1]);
    let (b, n) = (&best.1.summary, &next.1.summary);
    let mut out = format!("{}. ", listing.join(", "));
    match objective {
        Objective::MeanLatency => {
            out.push_str(&format!(
                "{} faster by {:.2} s ({}). TTFT = {:.2} ms vs {:.2} ms, {}; TPOT = {:.2} ms vs {:.2} ms, {}",
                best.0,
                n.latency_s.mean - b.latency_s.mean,
                times(n.latency_s.mean, b.latency_s.mean),
                b.ttft_ms.mean,
                n.ttft_ms.mean,
                lower_by_times(b.ttft_ms.mean, n.ttft_ms.mean),
                b.tpot_ms.mean,
                n.tpot_ms.mean,
                lower_by_times(b.tpot_ms.mean, n.tpot_ms.mean),
            ));
        }
        _ => {
            let (vb, vn) = (v(&best.1), v(&next.1));
            let pct = if vn == 0.0 { 0.0 } else { (vb - vn) / vn * 100.0 };
            out.push_str(&format!(
                "{} higher by {} tok/s ({pct:.1}%); Mean TPOT = {:.2} ms vs {:.2} ms, {}",
                best.0,
                grouped(vb - vn),
                b.tpot_ms.mean,
                n.tpot_ms.mean,
                lower_by_pct(b.tpot_ms.mean, n.tpot_ms.mean),
            ));
        }
    }
    // Whether the two differ beyond noise, by the matrix's rule.
    let c = objective.compare(&next.2.iter().collect::<Vec<_>>(), &best.2.iter().collect::<Vec<_>>(), 0.0);
    if c.verdict == Verdict::WithinNoise {
        out.push_str(" (the difference is within noise)");
    }
    out.push('.');
    Some(out)
}

/// `3.10x faster` / `1.01x slower`: how `new` compares with `old`, lower
/// being better.
fn times(old: f64, new: f64) -> String {
    if new <= 0.0 || old <= 0.0 {
        return "n/a".to_owned();
    }
    if new <= old { format!("{:.2}x faster", old / new) } else { format!("{:.2}x slower", new / old) }
}

/// `lower by 57.60 ms (2.40x faster)` / `higher by 0.17 ms (1.00x slower)`.
fn lower_by_times(mine: f64, theirs: f64) -> String {
    let word = if mine <= theirs { "lower" } else { "higher" };
    format!("{word} by {:.2} ms ({})", (theirs - mine).abs(), times(theirs, mine))
}

/// `lower by 154.84 ms (85.67%)`, relative to the other's value.
fn lower_by_pct(mine: f64, theirs: f64) -> String {
    let word = if mine <= theirs { "lower" } else { "higher" };
    let pct = if theirs == 0.0 { 0.0 } else { (theirs - mine).abs() / theirs * 100.0 };
    format!("{word} by {:.2} ms ({pct:.2}%)", (theirs - mine).abs())
}

/// A job's telemetry in a line: the engine's load, KV cache, preemptions
/// and prefix cache over the job, then each GPU's clock, power, heat and
/// use, and what could not be read. `None` when nothing was taken.
pub fn telemetry(t: &benchfleet_core::telemetry::TelemetrySummary) -> Option<String> {
    let mut said = Vec::new();
    let one = |names: &[&str]| names.iter().find_map(|n| t.stats(n, ""));
    if let Some(s) = one(&["vllm:num_requests_running", "sglang:num_running_reqs"]) {
        said.push(format!("running at most {}", number(s.max)));
    }
    if let Some(s) = one(&["vllm:num_requests_waiting", "sglang:num_queue_reqs"]) {
        said.push(format!("waiting at most {}", number(s.max)));
    }
    if let Some(s) = one(&["vllm:kv_cache_usage_perc", "sglang:token_usage"]) {
        said.push(format!("KV cache up to {:.1}% full", s.max * 100.0));
    }
    if let Some(s) = one(&["vllm:num_preemptions_total", "sglang:num_retracted_requests_total"]) {
        said.push(format!("{} preempted", number((s.last - s.first).max(0.0))));
    }
    if let (Some(h), Some(q)) =
        (t.stats("vllm:prefix_cache_hits_total", ""), t.stats("vllm:prefix_cache_queries_total", ""))
        && q.last > q.first
    {
        said.push(format!("prefix cache hits {:.1}%", (h.last - h.first) / (q.last - q.first) * 100.0));
    } else if let Some(s) = t.stats("sglang:cache_hit_rate", "") {
        said.push(format!("prefix cache hits {:.1}%", s.mean * 100.0));
    }
    if t.engine_scrape_failures > 0 {
        let why = t.engine_scrape_error.as_deref().map_or(String::new(), |e| format!(" ({e})"));
        said.push(format!("{} of {} /metrics scrapes failed{why}", t.engine_scrape_failures, t.engine_scrapes));
    }
    for g in &t.gpus {
        let mut gpu = Vec::new();
        if let Some(s) = t.stats("gpu_sm_clock_mhz", &g.gpu) {
            gpu.push(format!("SM clock {}-{} MHz", number(s.min), number(s.max)));
        }
        if let Some(s) = t.stats("gpu_power_w", &g.gpu) {
            let limit = g.power_limit_w.map_or(String::new(), |l| format!(" of {}", number(l)));
            gpu.push(format!("power up to {}{limit} W", number(s.max.round())));
        }
        if let Some(s) = t.stats("gpu_temperature_c", &g.gpu) {
            gpu.push(format!("up to {} C", number(s.max)));
        }
        if let Some(s) = t.stats("gpu_utilization_pct", &g.gpu) {
            gpu.push(format!("{:.0}% busy", s.mean));
        }
        if !gpu.is_empty() {
            said.push(format!("GPU {}: {}", g.gpu, gpu.join(", ")));
        }
    }
    if t.gpu_sample_failures > 0 {
        let why = t.gpu_sample_error.as_deref().map_or(String::new(), |e| format!(" ({e})"));
        said.push(format!("{} of {} GPU readings failed{why}", t.gpu_sample_failures, t.gpu_samples));
    }
    (!said.is_empty()).then(|| said.join("; "))
}

/// Bytes as GiB: `71.3 GiB`.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

pub use benchfleet_core::utc;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_worded_as_the_references_do() {
        assert_eq!(number(8.0), "8");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(f64::INFINITY), "inf");
        assert_eq!(grouped(4636.354), "4,636.35");
        assert_eq!(grouped(999.0), "999.00");
        assert_eq!(grouped(1_234_567.0), "1,234,567.00");
        assert_eq!(grouped(-1234.5), "-1,234.50");
        assert_eq!(times(2.62, 8.13), "3.10x slower");
        assert_eq!(times(8.13, 2.62), "3.10x faster");
        assert_eq!(lower_by_pct(25.89, 180.73), "lower by 154.84 ms (85.67%)");
        assert_eq!(lower_by_times(41.12, 98.72), "lower by 57.60 ms (2.40x faster)");
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_796_154_056_000), "2026-12-01 19:40:56 UTC");
    }

    /// A closed loop of 1000 requests, 9 M tokens over `seconds`, whose steady window gave
    /// `steady` tok/s.
    fn closed(seconds: f64, steady: f64) -> Summary {
        Summary {
            successful: 1000,
            duration_s: seconds,
            total_input_tokens: 8_000_000,
            total_output_tokens: 1_000_000,
            total_token_throughput: 9_000_000.0 / seconds,
            max_concurrency: Some(64),
            steady_state: Some(benchfleet_core::metrics::steady::SteadyState {
                reached: true,
                start_s: 1.0,
                end_s: seconds - 1.0,
                requests: 800,
                total_token_throughput: steady,
                ..Default::default()
            }),
            ..Summary::default()
        }
    }

    #[test]
    fn a_headline_sets_pools_of_different_repeats_side_by_side_by_their_steady_states() {
        // A confirmation left the baseline at three repeats and the variant at one. Pooled as
        // the tuner ranks them, both keep a steady state: +10% there, and said so, beside the
        // whole runs' figures (+3%); not the variant's window against the baseline's runs.
        let base = [closed(1000.0, 10_000.0), closed(1000.0, 10_000.0), closed(1000.0, 10_000.0)];
        let variant = [closed(1000.0 / 1.03, 11_000.0)];
        let of = |s: &[Summary]| super::Measured::pooled(&s.iter().collect::<Vec<_>>()).expect("pooled");
        let (b, v) = (of(&base), of(&variant));
        let o = Objective::TotalTokenThroughput;
        assert_eq!(headline(o, &b, None), "Total TPS: 9000.00 Mean TPOT(ms): 0.00");
        assert_eq!(headline(o, &v, Some(&b)), "Total TPS: 9270.00 (steady state: +10.00%) Mean TPOT(ms): 0.00");
        // An open loop's runs: the whole runs', said plainly.
        let open = |s: Summary| Summary { offered_rate: Some(8.0), ..s };
        let (b, v) = (of(&base.map(open)), of(&variant.map(open)));
        assert_eq!(headline(o, &v, Some(&b)), "Total TPS: 9270.00 (+3.00%) Mean TPOT(ms): 0.00");
    }
}
