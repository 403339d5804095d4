//! The "Serving Benchmark Result" block, field for field as `vllm bench
//! serve` prints it and as the published reports quote it, and the load
//! generator's check of itself that follows it. A block whose GPU energy is
//! known (a report's, from the agents' counters) has an energy section
//! after the reference block's sections; loadgen's own block has none.

use std::fmt::Write as _;

use crate::cost::Cost;
use crate::metrics::sessions::Sessions;
use crate::metrics::steady::SteadyState;
use crate::metrics::{Distribution, Summary};
use crate::telemetry::Energy;

/// Renders the block, with its energy section when `energy` is known;
/// every line ends with a newline.
pub fn render_block(s: &Summary, energy: Option<&Energy>) -> String {
    render_block_with(s, &Sections { energy, ..Sections::default() })
}

/// What a report knows of a block besides its summary; each is a section
/// of its own after the reference block's, where known.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sections<'a> {
    pub energy: Option<&'a Energy>,
    pub cost: Option<&'a Cost>,
    /// The engine's prefix cache hit rate over the jobs, 0 to 1.
    pub prefix_cache_hit_rate: Option<f64>,
}

/// The block with the sections that are known.
pub fn render_block_with(s: &Summary, sections: &Sections<'_>) -> String {
    let Sections { energy, cost, prefix_cache_hit_rate } = *sections;
    let mut out = String::from("============ Serving Benchmark Result ============\n");
    let mut line = |label: &str, value: String| {
        let _ = writeln!(out, "{label:<40} {value}");
    };
    line("Successful requests:", s.successful.to_string());
    line("Maximum request concurrency:", s.max_concurrency.unwrap_or(s.peak_concurrent).to_string());
    line("Benchmark duration (s):", format!("{:.2}", s.duration_s));
    line("Total input tokens:", s.total_input_tokens.to_string());
    line("Total generated tokens:", s.total_output_tokens.to_string());
    line("Request throughput (req/s):", format!("{:.2}", s.request_throughput));
    if let Some(g) = &s.goodput {
        line("Request goodput (req/s):", format!("{:.2}", g.request_goodput));
    }
    line("Output token throughput (tok/s):", format!("{:.2}", s.output_throughput));
    line(
        "Peak output token throughput (tok/s):",
        s.peak_output_throughput.map_or_else(|| "not measurable (run under 1 s)".to_owned(), |p| format!("{p:.2}")),
    );
    line("Peak concurrent requests:", format!("{:.2}", s.peak_concurrent as f64));
    line("Total Token throughput (tok/s):", format!("{:.2}", s.total_token_throughput));
    section(&mut out, "----------------------Latency---------------------", "Latency(s):", " ", &s.latency_s);
    section(&mut out, "---------------Time to First Token----------------", "TTFT (ms):", "", &s.ttft_ms);
    section(&mut out, "-----Time per Output Token (excl. 1st token)------", "TPOT (ms):", "", &s.tpot_ms);
    section(&mut out, "---------------Inter-token Latency----------------", "ITL (ms):", "", &s.itl_ms);
    if let Some(e) = energy {
        energy_section(&mut out, e);
    }
    if let Some(c) = cost {
        cost_section(&mut out, c);
    }
    if let Some(rate) = prefix_cache_hit_rate {
        out.push_str("-------------------Prefix Cache-------------------\n");
        let _ = writeln!(out, "{:<40} {:.2}", "Prefix cache hit rate (%):", rate * 100.0);
    }
    if let Some(sessions) = &s.sessions {
        sessions_section(&mut out, sessions);
    }
    // One run's window (a block pooled from repeats has none: each repeat
    // has its own).
    if let Some(w) = s.steady_state_said() {
        steady_section(&mut out, w);
    }
    // After every field of the reference block, so readers of that block
    // still find each one where they expect it.
    if let Some(reason) = &s.invalid {
        let _ = writeln!(out, "RUN INVALID: {reason}");
    }
    out.push_str("==================================================\n");
    out
}

/// The self-check block: what the reference block leaves out or gets wrong
/// (failures by kind, per-token ITL, times from the schedule) and whether the
/// load generator kept its schedule.
pub fn render_self_check(s: &Summary) -> String {
    let mut out = String::from("=============== Load Generator Check =============\n");
    let mut line = |label: &str, value: String| {
        let _ = writeln!(out, "{label:<40} {value}");
    };
    let f = &s.failures;
    line("Failed requests:", s.failed.to_string());
    if s.failed > 0 {
        line("  http error/timeout/incomplete:", format!("{}/{}/{}", f.http_error, f.timeout, f.incomplete));
        line("  transport error/cancelled:", format!("{}/{}", f.transport_error, f.cancelled));
        line("  disconnected/malformed:", format!("{}/{}", f.disconnected, f.malformed));
        for r in &s.failure_reasons {
            line(&format!("  {} of them:", r.count), r.reason.clone());
        }
    }
    line("Success rate (%):", format!("{:.2}", s.success_rate() * 100.0));
    line("Warm-up and cool-down requests:", s.excluded.to_string());
    line("Offered rate (req/s):", s.offered_rate.map_or_else(|| "all at once".to_owned(), |r| format!("{r:.2}")));
    line("Achieved rate (req/s):", format!("{:.2}", s.achieved_rate));
    line("Requests that waited for a slot:", s.cap_waits.to_string());
    line("Mean dispatch lag (ms):", format!("{:.3}", s.dispatch_lag_ms.mean));
    line("P99 dispatch lag (ms):", format!("{:.3}", s.dispatch_lag_ms.p99));
    line("Client CPU time (s):", s.client_cpu_s.map_or_else(|| "unknown".to_owned(), |c| format!("{c:.2}")));
    line("New connections / mean connect (ms):", format!("{} / {:.2}", s.connect_ms.count, s.connect_ms.mean));
    line("Mean TTFT from scheduled (ms):", format!("{:.2}", s.ttft_from_scheduled_ms.mean));
    line("P99 TTFT from scheduled (ms):", format!("{:.2}", s.ttft_from_scheduled_ms.p99));
    line("Mean Latency from scheduled (s):", format!("{:.2}", s.latency_from_scheduled_s.mean));
    let d = &s.itl_per_token_ms;
    line("Mean ITL per token (ms):", format!("{:.2}", d.mean));
    line("Median ITL per token (ms):", format!("{:.2}", d.median));
    line("P99 ITL per token (ms):", format!("{:.2}", d.p99));
    if let Some(u) = &s.usage_check {
        line("Prompt tokens, server off / compared:", format!("{} / {}", u.prompts_off, u.prompts_compared));
        line("Output tokens, server off / compared:", format!("{} / {}", u.outputs_off, u.outputs_compared));
        if u.outputs_by_events > 0 {
            line("Output tokens, one an event:", u.outputs_by_events.to_string());
        }
        if let Some(said) = u.describe() {
            line("Token counts:", format!("DISAGREE: {said}"));
        }
    }
    if s.usage_below_events > 0 {
        line(
            "Usage below its events (replies):",
            format!("{} (fewer tokens counted than text events streamed: cannot be true)", s.usage_below_events),
        );
    }
    match &s.invalid {
        None => line("Run:", format!("VALID (p99 lag limit {:.2} ms)", s.lag_limit_ms)),
        Some(reason) => line("Run:", format!("INVALID: {reason}")),
    }
    out.push_str("==================================================\n");
    out
}

/// A multi-turn run's sessions: how many, their turns, and the first
/// turn's TTFT against the later turns' (whose conversation so far the
/// engine may have cached).
fn sessions_section(out: &mut String, s: &Sessions) {
    out.push_str("---------------------Sessions---------------------\n");
    let mut line = |label: &str, value: String| {
        let _ = writeln!(out, "{label:<40} {value}");
    };
    line("Sessions:", s.sessions.to_string());
    line("Turns per session:", format!("{:.2}", s.turns_per_session()));
    let ms = |v: Option<f64>| v.map_or_else(|| "none".to_owned(), |v| format!("{v:.2}"));
    line("Mean TTFT, first turns (ms):", ms(s.mean_ttft_ms(|t| t == 1)));
    line("Mean TTFT, later turns (ms):", ms(s.mean_ttft_ms(|t| t > 1)));
    if let Some(last) = s.by_turn.last().filter(|t| t.turn > 1) {
        line(&format!("Mean prompt tokens, turn {}:", last.turn), format!("{:.2}", last.mean_prompt_tokens));
    }
}

/// The steady state: its window, its figures, and whether they held still.
fn steady_section(out: &mut String, w: &SteadyState) {
    out.push_str("-------------------Steady State-------------------\n");
    let _ = writeln!(out, "{:<40} {}", "Steady state:", w.words());
    if w.reached {
        let lines = [
            ("Request throughput (req/s):", w.request_throughput),
            ("Output token throughput (tok/s):", w.output_throughput),
            ("Total Token throughput (tok/s):", w.total_token_throughput),
            ("Mean TTFT (ms):", w.mean_ttft_ms),
            ("P99 TTFT (ms):", w.p99_ttft_ms),
            ("Mean TPOT (ms):", w.mean_tpot_ms),
        ];
        for (label, value) in lines {
            let _ = writeln!(out, "{label:<40} {value:.2}");
        }
    }
}

/// The GPUs' energy over the load run: joules, mean power, and per output
/// token both ways.
fn energy_section(out: &mut String, e: &Energy) {
    out.push_str("-----------------------Energy---------------------\n");
    let lines = [
        ("GPU energy (J):", e.joules),
        ("Mean GPU power (W):", e.mean_power_w),
        ("Energy per output token (mJ):", e.mj_per_output_token),
        ("Output tokens per joule:", e.output_tokens_per_joule),
    ];
    for (label, value) in lines {
        let _ = writeln!(out, "{label:<40} {value:.2}");
    }
}

fn cost_section(out: &mut String, c: &Cost) {
    out.push_str("------------------------Cost----------------------\n");
    let _ = writeln!(out, "{:<40} {:.4}", "GPU hours:", c.gpu_hours);
    let shown = |v: Option<f64>| v.map_or_else(|| "N/A".to_owned(), |v| format!("{v:.4}"));
    let _ =
        writeln!(out, "{:<40} {}", format!("Cost per 1M input tokens ({}):", c.currency), shown(c.per_million_input));
    let _ =
        writeln!(out, "{:<40} {}", format!("Cost per 1M output tokens ({}):", c.currency), shown(c.per_million_output));
}

/// One titled section of mean, median, P95 and P99. The latency section's
/// values sit one column further right, as in the published block. A P95 or
/// P99 the run did not ask for reads "N/A", as published blocks of runs that
/// asked for other percentiles do; the other asked percentiles are in the
/// JSON summary and the summary CSV, not here, so the block stays the same
/// field for field.
fn section(out: &mut String, title: &str, unit: &str, extra_pad: &str, d: &Distribution) {
    out.push_str(title);
    out.push('\n');
    let shown = |p: f64| d.percentile(p).map_or_else(|| "N/A".to_owned(), |v| format!("{v:.2}"));
    let lines = [
        ("Mean", format!("{:.2}", d.mean)),
        ("Median", format!("{:.2}", d.median)),
        ("P95", shown(95.0)),
        ("P99", shown(99.0)),
    ];
    for (name, value) in lines {
        let label = format!("{name} {unit}");
        let _ = writeln!(out, "{label:<40} {extra_pad}{value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Percentile;

    /// The reference report's vLLM ShareGPT baseline, block for block.
    const REFERENCE: &str = "\
============ Serving Benchmark Result ============
Successful requests:                     1000
Maximum request concurrency:             512
Benchmark duration (s):                  70.72
Total input tokens:                      342058
Total generated tokens:                  281412
Request throughput (req/s):              14.14
Output token throughput (tok/s):         4347.55
Peak output token throughput (tok/s):    30810010.86
Peak concurrent requests:                512.00
Total Token throughput (tok/s):          9632.01
----------------------Latency---------------------
Mean Latency(s):                          30.19
Median Latency(s):                        27.48
P95 Latency(s):                           60.73
P99 Latency(s):                           65.37
---------------Time to First Token----------------
Mean TTFT (ms):                          4072.64
Median TTFT (ms):                        5786.23
P95 TTFT (ms):                           9276.23
P99 TTFT (ms):                           10204.44
-----Time per Output Token (excl. 1st token)------
Mean TPOT (ms):                          25.89
Median TPOT (ms):                        11.63
P95 TPOT (ms):                           119.58
P99 TPOT (ms):                           161.45
---------------Inter-token Latency----------------
Mean ITL (ms):                           11.46
Median ITL (ms):                         0.00
P95 ITL (ms):                            101.72
P99 ITL (ms):                            132.49
==================================================
";

    fn dist(mean: f64, median: f64, p95: f64, p99: f64) -> Distribution {
        Distribution { mean, median, p95, p99, count: 1000, percentiles: Vec::new() }
    }

    #[test]
    fn matches_the_published_block_exactly() {
        let s = Summary {
            successful: 1000,
            failed: 0,
            max_concurrency: Some(512),
            duration_s: 70.72,
            total_input_tokens: 342058,
            total_output_tokens: 281412,
            request_throughput: 14.14,
            output_throughput: 4347.55,
            peak_output_throughput: Some(30810010.86),
            peak_concurrent: 512,
            total_token_throughput: 9632.01,
            latency_s: dist(30.19, 27.48, 60.73, 65.37),
            ttft_ms: dist(4072.64, 5786.23, 9276.23, 10204.44),
            tpot_ms: dist(25.89, 11.63, 119.58, 161.45),
            itl_ms: dist(11.46, 0.0, 101.72, 132.49),
            ..Summary::default()
        };
        assert_eq!(render_block(&s, None), REFERENCE);
    }

    #[test]
    fn a_p95_not_asked_for_reads_n_a_as_published() {
        let asked = |d: Distribution| {
            let percentiles = [50.0, 99.0].map(|p| Percentile { p, value: d.percentile(p).unwrap_or_default() });
            Distribution { percentiles: percentiles.to_vec(), ..d }
        };
        let s = Summary {
            latency_s: asked(dist(24.0, 21.51, 48.0, 51.01)),
            ttft_ms: asked(dist(1604.23, 646.01, 5000.0, 5737.27)),
            ..Summary::default()
        };
        let block = render_block(&s, None);
        // Lines 297-298 and 124-125 of the Japanese H100 throughput report.
        for expected in [
            "P95 Latency(s):                           N/A\nP99 Latency(s):                           51.01\n",
            "P95 TTFT (ms):                           N/A\nP99 TTFT (ms):                           5737.27\n",
        ] {
            assert!(block.contains(expected), "{block}");
        }
        let without_p99 =
            Distribution { percentiles: vec![Percentile { p: 95.0, value: 1.0 }], ..dist(1.0, 1.0, 1.0, 1.0) };
        let block = render_block(&Summary { itl_ms: without_p99, ..Summary::default() }, None);
        assert!(
            block.contains(
                "P95 ITL (ms):                            1.00\nP99 ITL (ms):                            N/A\n"
            )
        );
    }

    #[test]
    fn a_run_under_the_peak_window_has_no_peak() {
        let block = render_block(&Summary { peak_output_throughput: None, ..Summary::default() }, None);
        assert!(block.contains("Peak output token throughput (tok/s):    not measurable (run under 1 s)"), "{block}");
    }

    #[test]
    fn an_invalid_run_says_so_inside_the_block() {
        let s = Summary { invalid: Some("p99 dispatch lag 9.00 ms exceeds 5.00 ms".into()), ..Summary::default() };
        let block = render_block(&s, None);
        let end = format!("RUN INVALID: p99 dispatch lag 9.00 ms exceeds 5.00 ms\n{}\n", "=".repeat(50));
        assert!(block.ends_with(&end), "{block}");
        assert!(render_self_check(&s).contains("INVALID: p99 dispatch lag"));
        assert!(render_self_check(&Summary::default()).contains("VALID"));
    }

    #[test]
    fn a_known_price_and_prefix_cache_are_sections_after_the_energy_one() {
        let price = crate::cost::Price { gpu_hour: 3.5, currency: "EUR".into() };
        let s = Summary { total_output_tokens: 2_000, ..Summary::default() };
        let cost = crate::cost::Cost::of(&price, 3600.0, 0, 2_000).expect("a cost");
        let block = render_block_with(
            &s,
            &Sections { cost: Some(&cost), prefix_cache_hit_rate: Some(0.4321), ..Sections::default() },
        );
        let section = "\
------------------------Cost----------------------
GPU hours:                               1.0000
Cost per 1M input tokens (EUR):          N/A
Cost per 1M output tokens (EUR):         1750.0000
-------------------Prefix Cache-------------------
Prefix cache hit rate (%):               43.21
==================================================
";
        assert!(block.ends_with(section), "{block}");
        assert_eq!(render_block_with(&s, &Sections::default()), render_block(&s, None));
    }

    #[test]
    fn known_energy_is_a_section_after_the_itl_one_and_before_the_verdict() {
        let s = Summary { invalid: Some("p99 dispatch lag 9.00 ms exceeds 5.00 ms".into()), ..Summary::default() };
        let energy = Energy::of(6_061.6, 10.0, 20_000).expect("figures");
        let block = render_block(&s, Some(&energy));
        let section = "\
P99 ITL (ms):                            0.00
-----------------------Energy---------------------
GPU energy (J):                          6061.60
Mean GPU power (W):                      606.16
Energy per output token (mJ):            303.08
Output tokens per joule:                 3.30
RUN INVALID: p99 dispatch lag 9.00 ms exceeds 5.00 ms
";
        assert!(block.contains(section), "{block}");
        assert!(block.lines().all(|l| !l.starts_with('-') || l.len() == 50), "{block}");
        // Unknown energy leaves the block as the reference prints it.
        assert!(!render_block(&s, None).contains("Energy"));
    }

    /// A closed loop's steady state and a multi-turn run's sessions, line
    /// for line, after every other section and before the verdict.
    #[test]
    fn the_sessions_and_steady_state_sections_read_line_for_line() {
        use crate::metrics::sessions::TurnFigures;
        let turn = |turn: u32, ttft: f64, prompt: f64| TurnFigures {
            turn,
            successful: 10,
            failed: 0,
            mean_ttft_ms: ttft,
            mean_prompt_tokens: prompt,
        };
        let s = Summary {
            max_concurrency: Some(8),
            steady_state: Some(SteadyState {
                reached: true,
                start_s: 0.25,
                end_s: 41.5,
                level: 8,
                held: 0.97,
                requests: 1_204,
                request_throughput: 29.18,
                output_throughput: 3_735.04,
                total_token_throughput: 33_615.4,
                mean_ttft_ms: 61.237,
                p99_ttft_ms: 140.5,
                mean_tpot_ms: 7.891,
                ttft_drift_pct: Some(-12.04),
                throughput_drift_pct: Some(1.2),
            }),
            sessions: Some(Sessions {
                sessions: 20,
                turns: 50,
                by_turn: vec![turn(1, 120.0, 400.0), turn(2, 60.0, 832.0), turn(3, 30.0, 1264.0)],
            }),
            invalid: Some("p99 dispatch lag 9.00 ms exceeds 5.00 ms".into()),
            ..Summary::default()
        };
        let block = render_block(&s, None);
        let sections = "\
---------------------Sessions---------------------
Sessions:                                20
Turns per session:                       2.50
Mean TTFT, first turns (ms):             120.00
Mean TTFT, later turns (ms):             45.00
Mean prompt tokens, turn 3:              1264.00
-------------------Steady State-------------------
Steady state:                            0.2-41.5 s, 8 or more in flight, drifting: mean TTFT -12.0% over the window
Request throughput (req/s):              29.18
Output token throughput (tok/s):         3735.04
Total Token throughput (tok/s):          33615.40
Mean TTFT (ms):                          61.24
P99 TTFT (ms):                           140.50
Mean TPOT (ms):                          7.89
RUN INVALID: p99 dispatch lag 9.00 ms exceeds 5.00 ms
==================================================
";
        assert!(block.ends_with(sections), "{block}");
        assert!(block.lines().all(|l| !l.starts_with('-') || l.len() == 50), "{block}");
    }

    #[test]
    fn without_a_cap_the_observed_peak_is_the_maximum_concurrency() {
        let s = Summary { peak_concurrent: 31, ..Summary::default() };
        assert!(render_block(&s, None).contains("Maximum request concurrency:             31\n"));
    }
}
