//! Trace replay end to end: a generated Mooncake trace of 2,000 requests
//! replayed by `run --local` on the simulator at 1x and 2x, its schedule
//! kept and its shared blocks found by the engine's prefix cache.

/// A small Mooncake trace generator: `n` requests with exponential gaps of
/// mean `span_ms / n`; each opens with the two blocks of one of `groups`
/// system prompts (hash ids `g * 1000`, `g * 1000 + 1`), then a block of its
/// own cut to 1 to 512 tokens; 4 to 12 output tokens. The same seed gives
/// the same trace.
fn mooncake_trace(n: usize, span_ms: f64, groups: u64, seed: u64) -> String {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut at = 0.0f64;
    let mut out = String::new();
    for i in 0..n {
        if i > 0 {
            let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
            at += -(1.0 - u).ln() * span_ms / n as f64;
        }
        let g = next() % groups;
        let own = 1 + next() % 512;
        let output = 4 + next() % 9;
        out.push_str(&format!(
            "{{\"timestamp\": {}, \"input_length\": {}, \"output_length\": {output}, \"hash_ids\": [{}, {}, {}]}}\n",
            at.round(),
            1024 + own,
            g * 1000,
            g * 1000 + 1,
            100_000 + i,
        ));
    }
    out
}

/// The share of the trace's prompt tokens in a system prompt sent before:
/// what a prefix cache that evicts nothing finds.
fn expected_hit_rate(trace: &str) -> f64 {
    let (mut seen, mut hit, mut total) = (std::collections::HashSet::new(), 0.0, 0.0);
    for line in trace.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a line");
        total += v["input_length"].as_f64().expect("input");
        if !seen.insert(v["hash_ids"][0].as_u64().expect("id")) {
            hit += 1024.0;
        }
    }
    hit / total
}

#[test]
fn a_generated_trace_replays_on_its_schedule_at_either_speed_with_its_prefix_reuse() {
    let trace = mooncake_trace(2000, 20_000.0, 16, 7);
    // A debug build of loadgen on a busy machine may fall a few ms behind a
    // gap of 10 ms: the lag limit allows it, the achieved rate is checked.
    assert_eq!(trace, mooncake_trace(2000, 20_000.0, 16, 7), "a seed gives one trace");
    let (stdout, doc) = super::run_local_json_with(
        "name: replay\nmodel: Qwen/Qwen3-8B\nhardware: { gpu: H200 }\nengines:\n  \
         vllm: { image: vllm/vllm-openai:v0.17.1, args: [--max-model-len=8192, --enable-prefix-caching] }\nprofiles:\n  \
         as-recorded: { dataset: { trace: { path: mooncake.jsonl } }, requests: 2000, lag_limit_ms: 200 }\n  \
         twice-as-fast: { dataset: { trace: { path: mooncake.jsonl, speed: 2.0 } }, requests: 2000, lag_limit_ms: 200 }\n",
        &[("mooncake.jsonl", &trace)],
    );
    let blocks = doc["configurations"][0]["blocks"].as_array().expect("blocks");
    let block = |name: &str| blocks.iter().find(|b| b["profile"] == name).expect("the profile's block");
    let (slow, fast) = (&block("as-recorded")["pooled"], &block("twice-as-fast")["pooled"]);
    for s in [slow, fast] {
        assert_eq!((s["successful"].as_u64(), s["failed"].as_u64()), (Some(2000), Some(0)), "{s:#}");
    }
    let number = |s: &serde_json::Value, key: &str| s[key].as_f64().unwrap_or_else(|| panic!("{key}: {s:#}"));
    // The schedule is the trace's: every request sent at its time, the
    // offered rate exactly doubled, and the sending done in half the time
    // (what the engine then takes to drain its queue is its own).
    for s in [slow, fast] {
        let kept = number(s, "achieved_rate") / number(s, "offered_rate");
        assert!((0.97..1.01).contains(&kept), "achieved against offered {kept}: {s:#}");
        assert!(s["invalid"].is_null(), "{s:#}");
    }
    let offered = number(fast, "offered_rate") / number(slow, "offered_rate");
    assert!((offered - 2.0).abs() < 1e-9, "offered rates {offered}");
    let sending = |s: &serde_json::Value| 1999.0 / number(s, "achieved_rate");
    assert!((sending(fast) / sending(slow) - 0.5).abs() < 0.03, "sent in {} and {} s", sending(slow), sending(fast));
    assert!((19.0..21.5).contains(&sending(slow)), "{slow:#}");
    // The engine's prefix cache finds the system prompts the trace shares.
    let expected = expected_hit_rate(&trace);
    for name in ["as-recorded", "twice-as-fast"] {
        let rate = block(name)["prefix_cache_hit_rate"].as_f64().expect("a hit rate");
        assert!((rate - expected).abs() < 0.02, "{name}: {rate} against {expected}");
    }
    assert!(stdout.contains("Profile: twice-as-fast"), "{stdout}");
    let said = doc.to_string();
    assert!(said.contains("mooncake trace mooncake.jsonl (sha256 "), "the report names the dataset: {said}");
}
