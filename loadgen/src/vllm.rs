//! `vllm bench serve` compatibility: its result file (`--save-result`), in
//! its schema, from our records and summary, so that a script written for
//! vLLM's JSON reads ours. Which of its flags loadgen takes, and how, is in
//! `docs/loadgen.md`.

use benchfleet_core::record::RequestRecord;
use serde_json::{Map, Value, json};

use crate::LoadResult;

/// What the result file says of the run besides its numbers.
#[derive(Clone, Debug, Default)]
pub struct ResultMeta {
    /// `openai` (completions) or `openai-chat`.
    pub backend: String,
    pub label: Option<String>,
    pub model_id: String,
    pub tokenizer_id: String,
    pub num_prompts: usize,
    /// `None`: all at once (`inf`).
    pub request_rate: Option<f64>,
    pub max_concurrency: Option<usize>,
    /// The percentiles of each metric, e.g. [99.0].
    pub percentiles: Vec<f64>,
    /// Which metrics get mean, median, std and percentiles: of ttft, tpot,
    /// itl, e2el.
    pub metrics: Vec<String>,
    /// `YYYYMMDD-HHMMSS`, as vLLM writes it.
    pub date: String,
}

/// `YYYYMMDD-HHMMSS` of a Unix time, UTC (vLLM writes its local time).
pub fn date_of(unix_s: i64) -> String {
    let (days, secs) = (unix_s.div_euclid(86_400), unix_s.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (the proleptic Gregorian
    // calendar), by eras of 400 years.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}{month:02}{day:02}-{:02}{:02}{:02}", secs / 3600, secs % 3600 / 60, secs % 60)
}

/// vLLM's name of a percentile: `99`, `99.9`.
fn p_word(p: f64) -> String {
    if p.fract() == 0.0 { format!("{}", p as i64) } else { format!("{p}") }
}

/// numpy's percentile (linear between the closest ranks), of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

/// Mean, median, population standard deviation and percentiles, ms, as vLLM
/// computes them (0 for no samples).
fn stats(mut samples: Vec<f64>, percentiles: &[f64]) -> (f64, f64, f64, Vec<(f64, f64)>) {
    samples.sort_by(f64::total_cmp);
    let n = samples.len() as f64;
    let mean = if samples.is_empty() { 0.0 } else { samples.iter().sum::<f64>() / n };
    let std =
        if samples.is_empty() { 0.0 } else { (samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt() };
    let median = percentile(&samples, 50.0);
    (mean, median, std, percentiles.iter().map(|&p| (p, percentile(&samples, p))).collect())
}

fn ms(ns: i64) -> f64 {
    ns as f64 / 1e6
}

/// The samples of a metric over the measured successful requests, ms.
fn samples(metric: &str, ok: &[&RequestRecord]) -> Vec<f64> {
    match metric {
        "ttft" => ok.iter().filter_map(|r| r.ttft_ns()).map(ms).collect(),
        "tpot" => ok.iter().filter_map(|r| r.tpot_ns()).map(|t| t / 1e6).collect(),
        "itl" => ok.iter().flat_map(|r| r.chunks.pairs().map(|(a, b)| ms(b.at_ns - a.at_ns))).collect(),
        _ => ok.iter().map(|r| ms(r.latency_ns())).collect(),
    }
}

/// The run as `vllm bench serve --save-result` writes it.
pub fn result_json(result: &LoadResult, meta: &ResultMeta) -> Value {
    let s = &result.summary;
    let measured: Vec<&RequestRecord> =
        result.records.iter().filter(|r| r.phase == benchfleet_core::record::Phase::Measured).collect();
    let ok: Vec<&RequestRecord> = measured.iter().copied().filter(|r| r.outcome.is_ok()).collect();
    let mut out = Map::new();
    let mut put = |k: &str, v: Value| {
        out.insert(k.to_owned(), v);
    };
    put("date", json!(meta.date));
    put("endpoint_type", json!(meta.backend));
    put("backend", json!(meta.backend));
    put("label", json!(meta.label));
    put("model_id", json!(meta.model_id));
    put("tokenizer_id", json!(meta.tokenizer_id));
    put("num_prompts", json!(meta.num_prompts));
    put("request_rate", meta.request_rate.map_or_else(|| json!("inf"), |r| json!(r)));
    put("burstiness", json!(1.0));
    put("max_concurrency", json!(meta.max_concurrency));
    put("duration", json!(s.duration_s));
    put("completed", json!(s.successful));
    put("failed", json!(s.failed));
    put("total_input_tokens", json!(s.total_input_tokens));
    put("total_output_tokens", json!(s.total_output_tokens));
    put("request_throughput", json!(s.request_throughput));
    put("request_goodput", s.goodput.map_or(Value::Null, |g| json!(g.request_goodput)));
    put("output_throughput", json!(s.output_throughput));
    put("total_token_throughput", json!(s.total_token_throughput));
    put("max_output_tokens_per_s", json!(s.peak_output_throughput));
    put("max_concurrent_requests", json!(s.peak_concurrent));
    // Per request, in send order; a failed one has 0 output and no times.
    put("input_lens", json!(measured.iter().map(|r| r.prompt_tokens).collect::<Vec<_>>()));
    put(
        "output_lens",
        json!(measured.iter().map(|r| if r.outcome.is_ok() { r.output_tokens } else { 0 }).collect::<Vec<_>>()),
    );
    put(
        "ttfts",
        json!(
            measured
                .iter()
                .map(|r| if r.outcome.is_ok() { r.ttft_ns().map_or(0.0, |t| t as f64 / 1e9) } else { 0.0 })
                .collect::<Vec<_>>()
        ),
    );
    put(
        "itls",
        json!(
            measured
                .iter()
                .map(|r| r.chunks.pairs().map(|(a, b)| (b.at_ns - a.at_ns) as f64 / 1e9).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        ),
    );
    put("errors", json!(measured.iter().map(|r| r.error.clone().unwrap_or_default()).collect::<Vec<_>>()));
    for metric in &meta.metrics {
        let (mean, median, std, ps) = stats(samples(metric, &ok), &meta.percentiles);
        put(&format!("mean_{metric}_ms"), json!(mean));
        put(&format!("median_{metric}_ms"), json!(median));
        put(&format!("std_{metric}_ms"), json!(std));
        for (p, v) in ps {
            put(&format!("p{}_{metric}_ms", p_word(p)), json!(v));
        }
    }
    Value::Object(out)
}

/// vLLM's default file name: `openai-20.0qps-Qwen3.5-9B-20261201-120000.json`
/// (`openai-concurrency8-...` with a cap).
pub fn default_filename(meta: &ResultMeta) -> String {
    let model = meta.model_id.rsplit('/').next().unwrap_or(&meta.model_id);
    let rate = meta.request_rate.map_or_else(|| "inf".to_owned(), |r| format!("{r:.1}"));
    let cap = meta.max_concurrency.map(|n| format!("concurrency{n}-")).unwrap_or_default();
    let label = meta.label.as_deref().unwrap_or(&meta.backend);
    format!("{label}-{cap}{rate}qps-{model}-{}.json", meta.date)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_vllm_s_format() {
        assert_eq!(date_of(0), "19700101-000000");
        assert_eq!(date_of(951_782_400), "20000229-000000");
        assert_eq!(date_of(1_796_124_645), "20261201-113045");
    }

    #[test]
    fn percentiles_and_spread_are_numpy_s() {
        let (mean, median, std, ps) = stats(vec![4.0, 1.0, 3.0, 2.0], &[99.0, 50.0, 25.0]);
        assert_eq!((mean, median), (2.5, 2.5));
        assert!((std - 1.118_033_988_749_895).abs() < 1e-12);
        for ((p, got), (q, want)) in ps.iter().zip([(99.0, 3.97), (50.0, 2.5), (25.0, 1.75)]) {
            assert!(*p == q && (got - want).abs() < 1e-9, "p{p}: {got} against {want}");
        }
        assert_eq!((p_word(99.0), p_word(99.9)), ("99".to_owned(), "99.9".to_owned()));
        assert_eq!(stats(Vec::new(), &[99.0]).3, [(99.0, 0.0)]);
    }
}
