//! A matrix's profiles: each one's load (the dataset, the arrivals, the
//! warm-up and cool-down windows, the extra body), a sweep expanded into
//! one profile per point, a search's bounds and SLOs, goodput, and the
//! profiles an engine or variant limits its configurations to.

use super::*;
use crate::model::TraceFormat;

/// The profiles an engine or variant limits its configurations to, by the
/// names the matrix gives (a sweep's name is every point of it); `None`
/// when it sets no limit.
pub(super) fn profile_limit(
    field: &str,
    names: Option<&[String]>,
    profiles: &[Profile],
    sweeps: &[(String, Vec<String>)],
    err: &dyn Fn(&str, String) -> MatrixError,
) -> Result<Option<Vec<String>>, MatrixError> {
    let Some(names) = names else { return Ok(None) };
    if names.is_empty() {
        return Err(err(field, "names no profile; leave it out to run every profile".to_owned()));
    }
    let mut out: Vec<String> = Vec::new();
    for n in names {
        let points = match sweeps.iter().find(|(base, _)| base == n) {
            Some((_, points)) => points.clone(),
            None if profiles.iter().any(|p| &p.name == n) => vec![n.clone()],
            None => {
                let known: Vec<&str> = profiles.iter().map(|p| p.name.as_str()).collect();
                return Err(err(field, format!("no profile named '{n}'; profiles are: {}", known.join(", "))));
            }
        };
        for p in points {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    // In the matrix's order.
    Ok(Some(profiles.iter().map(|p| p.name.clone()).filter(|p| out.contains(p)).collect()))
}

/// A profile a sweep makes: its name, its rate and its cap.
pub(super) type SweepPoint<'a> = (String, Option<&'a RawRate>, Option<i64>);

/// The most profiles one sweep makes.
pub const MAX_SWEEP: usize = 64;
/// The highest concurrency a search may reach.
pub const MAX_SEARCH_CONCURRENCY: i64 = 100_000;
/// The bounds of a rate search, requests per second: the probes' names
/// and midpoints keep three significant digits down to the lowest.
pub const MIN_SEARCH_RATE: f64 = 0.01;
pub const MAX_SEARCH_RATE: f64 = 100_000.0;

/// The profiles a raw profile makes, by name, with the rate and the cap of
/// each: itself, or one per point of its sweeps (`NAME-r8` for a rate of 8,
/// `NAME-c64` for a cap of 64, `NAME-r8-c64` for both).
pub(super) fn sweep_points<'a>(
    name: &str,
    p: &'a RawProfile,
    err: &dyn Fn(&str, String) -> MatrixError,
) -> Result<Vec<SweepPoint<'a>>, MatrixError> {
    let field = |f: &str| format!("profiles.{name}.{f}");
    let rates: Vec<Option<&RawRate>> = match &p.rate {
        None => vec![None],
        Some(r) => r.list().into_iter().map(Some).collect(),
    };
    let caps: Vec<Option<i64>> = match &p.max_concurrency {
        None => vec![None],
        Some(c) => c.list().into_iter().map(|n| Some(*n)).collect(),
    };
    for (f, n) in [("rate", rates.len()), ("max_concurrency", caps.len())] {
        if n == 0 {
            return Err(err(&field(f), "an empty sweep: give one value or a list of them".to_owned()));
        }
        if n > MAX_SWEEP {
            return Err(err(&field(f), format!("a sweep of {n} values; at most {MAX_SWEEP}")));
        }
    }
    let rate_name = |r: &RawRate| match r {
        RawRate::Number(x) => {
            let s = format!("{x:.4}");
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        }
        RawRate::Word(w) => w.clone(),
    };
    for (i, r) in rates.iter().enumerate() {
        if rates[..i].contains(r) {
            let shown = r.map(rate_name).unwrap_or_default();
            return Err(err(&field("rate"), format!("the sweep gives the rate {shown} twice")));
        }
    }
    for (i, c) in caps.iter().enumerate() {
        if caps[..i].contains(c) {
            let shown = c.map_or(String::new(), |c| c.to_string());
            return Err(err(&field("max_concurrency"), format!("the sweep gives the cap {shown} twice")));
        }
    }
    let rate_swept = p.rate.as_ref().is_some_and(OneOrMany::is_sweep);
    let cap_swept = p.max_concurrency.as_ref().is_some_and(OneOrMany::is_sweep);
    let mut points = Vec::with_capacity(rates.len() * caps.len());
    for r in &rates {
        for c in &caps {
            let mut point = name.to_owned();
            if rate_swept && let Some(r) = r {
                point.push_str(&format!("-r{}", rate_name(r)));
            }
            if cap_swept && let Some(c) = c {
                point.push_str(&format!("-c{c}"));
            }
            points.push((point, *r, *c));
        }
    }
    Ok(points)
}

pub(super) fn profile(
    name: &str,
    p: &RawProfile,
    (raw_rate, raw_cap): (Option<&RawRate>, Option<i64>),
    err: &dyn Fn(&str, String) -> MatrixError,
    file_hash: &dyn Fn(&str) -> Option<String>,
    strict: bool,
) -> Result<Profile, MatrixError> {
    let field = |f: &str| format!("profiles.{name}.{f}");
    let admit = |check: Result<(), MatrixError>| if strict { check } else { Ok(()) };
    let cap = |max: i64| if strict { max } else { i64::MAX };
    admit(check_name(err, &format!("profiles.{name}"), name))?;
    let rate = match raw_rate {
        None => None,
        Some(RawRate::Word(w)) if w == "inf" => None,
        Some(RawRate::Word(w)) => {
            return Err(err(&field("rate"), format!("must be a number of requests per second or inf, got '{w}'")));
        }
        Some(RawRate::Number(r)) if !r.is_finite() || *r <= 0.0 => {
            return Err(err(&field("rate"), format!("must be a positive number of requests per second, got {r}")));
        }
        Some(RawRate::Number(r)) => Some(*r),
    };
    let requests = u64::try_from(p.requests)
        .ok()
        .filter(|&n| (1..=cap(MAX_REQUESTS as i64) as u64).contains(&n))
        .ok_or_else(|| {
            err(
                &field("requests"),
                format!("must be from 1 to {MAX_REQUESTS} (split more into repeats or profiles), got {}", p.requests),
            )
        })?;
    let max_concurrency = match raw_cap {
        None => None,
        Some(n) if n >= 1 => Some(n as u64),
        Some(n) => return Err(err(&field("max_concurrency"), format!("must be at least 1, got {n}"))),
    };
    let arrival = match p.arrival.as_deref() {
        None | Some("constant") => Arrival::Constant,
        Some("poisson") => Arrival::Poisson,
        Some(other) => {
            return Err(err(&field("arrival"), format!("unknown arrival '{other}'; expected constant or poisson")));
        }
    };
    let endpoint = match p.endpoint.as_deref() {
        None | Some("completions") => Endpoint::Completions,
        Some("chat") => Endpoint::Chat,
        Some(other) => {
            return Err(err(&field("endpoint"), format!("unknown endpoint '{other}'; expected completions or chat")));
        }
    };
    let dataset = dataset_of(name, p, requests, err, file_hash, strict)?;
    let (rate, max_concurrency) = match p.mode.as_deref() {
        None => (rate, max_concurrency),
        Some(_) if raw_rate.is_some() || raw_cap.is_some() => {
            return Err(err(
                &field("mode"),
                "sets the rate and the concurrency: give mode, or rate and max_concurrency, not both".to_owned(),
            ));
        }
        Some("synchronous") => (None, Some(1)),
        Some("throughput") => (None, None),
        Some(other) => {
            return Err(err(&field("mode"), format!("unknown mode '{other}'; expected synchronous or throughput")));
        }
    };
    let (warmup, cooldown) = windows_of(name, p, requests, err)?;
    let max_duration_s = match &p.max_duration {
        None => None,
        Some(v) => {
            let s = match v {
                serde_yaml_ng::Value::Number(n) => n.as_f64().filter(|s| s.is_finite() && *s > 0.0),
                serde_yaml_ng::Value::String(t) => seconds_of(t),
                _ => None,
            };
            Some(s.ok_or_else(|| {
                err(
                    &field("max_duration"),
                    format!(
                        "must be seconds (300, '300s' or '5m'), got {}",
                        serde_yaml_ng::to_string(v).unwrap_or_default().trim()
                    ),
                )
            })?)
        }
    };
    if (matches!(dataset, Dataset::MultiTurn { .. }) || matches!(dataset, Dataset::ShareGpt { sessions: Some(_), .. }))
        && matches!(cooldown, Some(Window::Seconds(_)))
        && max_duration_s.is_none()
    {
        return Err(err(
            &field("cooldown"),
            "in seconds needs a max_duration with sessions: when the last one ends is not known ahead".to_owned(),
        ));
    }
    let extra_body = extra_body_of(name, p, err)?;
    let lag_limit_ms = match p.lag_limit_ms {
        Some(ms) if !ms.is_finite() || ms <= 0.0 => {
            return Err(err(&field("lag_limit_ms"), format!("must be a positive number of milliseconds, got {ms}")));
        }
        ms => ms,
    };
    let rate_tolerance = p.rate_tolerance.as_ref().map(|v| fraction(err, &field("rate_tolerance"), v)).transpose()?;
    let goodput = goodput_of(name, p, err)?;
    Ok(Profile {
        name: name.to_owned(),
        load: LoadSpec {
            dataset,
            rate,
            arrival,
            requests,
            max_concurrency,
            endpoint,
            seed: p.seed.unwrap_or(0),
            lag_limit_ms,
            rate_tolerance,
            warmup,
            cooldown,
            max_duration_s,
            ignore_eos: p.ignore_eos,
            extra_body,
            goodput,
            processor: None,
        },
        search: search_of(name, p, err)?,
        probe: None,
        sweep_of: None,
    })
}

/// A profile's dataset: exactly one of random, sharegpt (its file's hash
/// looked up), shared_prefix or trace (its file's hash looked up), within
/// the token limits.
pub(super) fn dataset_of(
    name: &str,
    p: &RawProfile,
    requests: u64,
    err: &dyn Fn(&str, String) -> MatrixError,
    file_hash: &dyn Fn(&str) -> Option<String>,
    strict: bool,
) -> Result<Dataset, MatrixError> {
    let field = |f: &str| format!("profiles.{name}.{f}");
    let admit = |check: Result<(), MatrixError>| if strict { check } else { Ok(()) };
    let cap = |max: i64| if strict { max } else { i64::MAX };
    let d = &p.dataset;
    let count = |f: &str, v: i64| {
        u32::try_from(v)
            .ok()
            .filter(|&n| (1..=cap(MAX_TOKENS)).contains(&i64::from(n)))
            .ok_or_else(|| err(&field(&format!("dataset.{f}")), format!("must be from 1 to {MAX_TOKENS}, got {v}")))
    };
    if d.trace.is_some() {
        // A trace's arrivals are its own.
        for (f, given) in [("rate", p.rate.is_some()), ("arrival", p.arrival.is_some()), ("mode", p.mode.is_some())] {
            if given {
                return Err(err(
                    &field(f),
                    "a trace sends on its own schedule; dataset.trace.speed scales it (max_concurrency may cap it)"
                        .to_owned(),
                ));
            }
        }
    }
    if d.sessions.is_some() && d.sharegpt.is_none() {
        return Err(err(
            &field("dataset.sessions"),
            "applies to sharegpt (multi_turn sets its own sessions)".to_owned(),
        ));
    }
    if d.output_tokens.is_some() && d.sharegpt.is_none() {
        return Err(err(
            &field("dataset.output_tokens"),
            "applies to sharegpt; the other datasets set their own output_tokens".to_owned(),
        ));
    }
    if let Some(m) = &d.multi_turn {
        let others = [d.random.is_some(), d.sharegpt.is_some(), d.shared_prefix.is_some(), d.trace.is_some()];
        if others.contains(&true) {
            return Err(err(
                &field("dataset"),
                "give exactly one of random, sharegpt, shared_prefix, trace or multi_turn".to_owned(),
            ));
        }
        return multi_turn_of(m, requests, &field, &count, err, strict);
    }
    let dataset = match (&d.random, &d.sharegpt, &d.shared_prefix, &d.trace) {
        (Some(r), None, None, None) => Dataset::Random {
            input_tokens: count("random.input_tokens", r.input_tokens)?,
            output_tokens: count("random.output_tokens", r.output_tokens)?,
            seed: r.seed,
        },
        (None, None, Some(s), None) => Dataset::SharedPrefix {
            groups: count("shared_prefix.groups", s.groups)?,
            prefix_tokens: count("shared_prefix.prefix_tokens", s.prefix_tokens)?,
            suffix_tokens: count("shared_prefix.suffix_tokens", s.suffix_tokens)?,
            output_tokens: count("shared_prefix.output_tokens", s.output_tokens)?,
            seed: s.seed,
        },
        (None, Some(path), None, None) => {
            let output_tokens = d.output_tokens.map(|n| count("output_tokens", n)).transpose()?;
            admit(plain_text(err, &field("dataset.sharegpt"), path))?;
            let sha256 = file_hash(path).ok_or_else(|| {
                err(
                    &field("dataset.sharegpt"),
                    format!("cannot read the ShareGPT file '{path}' (paths are relative to the matrix file)"),
                )
            })?;
            let sessions = match &d.sessions {
                None => None,
                Some(s) => Some(Sessions {
                    think_time_ms: think_time(s.think_time_ms, &field("dataset.sessions.think_time_ms"), err)?,
                }),
            };
            Dataset::ShareGpt { file: path.clone(), sha256, output_tokens, sessions }
        }
        (None, None, None, Some(t)) => {
            let format = match t.format.as_deref() {
                None => TraceFormat::Mooncake,
                Some(f) => TraceFormat::from_name(f).ok_or_else(|| {
                    err(
                        &field("dataset.trace.format"),
                        format!("unknown trace format '{f}'; expected mooncake or jsonl"),
                    )
                })?,
            };
            let speed = match t.speed {
                None => 1.0,
                Some(s) if s.is_finite() && s > 0.0 => s,
                Some(s) => {
                    return Err(err(
                        &field("dataset.trace.speed"),
                        format!("must be above 0 (2.0 replays twice as fast as recorded), got {s}"),
                    ));
                }
            };
            admit(plain_text(err, &field("dataset.trace.path"), &t.path))?;
            let sha256 = file_hash(&t.path).ok_or_else(|| {
                err(
                    &field("dataset.trace.path"),
                    format!("cannot read the trace '{}' (paths are relative to the matrix file)", t.path),
                )
            })?;
            Dataset::Trace { file: t.path.clone(), sha256, format, speed }
        }
        _ => {
            return Err(err(
                &field("dataset"),
                "give exactly one of random, sharegpt, shared_prefix, trace or multi_turn".to_owned(),
            ));
        }
    };
    if let Some(input) = dataset.input_tokens() {
        let prompt_tokens = u64::from(input) * requests;
        if strict && prompt_tokens > MAX_PROMPT_TOKENS {
            return Err(err(
                &field("dataset"),
                format!(
                    "{requests} requests of {input} input tokens are {prompt_tokens} prompt tokens; \
                     a job may hold at most {MAX_PROMPT_TOKENS}"
                ),
            ));
        }
    }
    Ok(dataset)
}

/// A multi-turn dataset: its turns at least 1, its token counts like any
/// dataset's, its think time whole milliseconds from 0 up to an hour, and
/// the conversations' prompt tokens (each turn carries every earlier one
/// and its reply) within a job's.
fn multi_turn_of(
    m: &RawMultiTurn,
    requests: u64,
    field: &dyn Fn(&str) -> String,
    count: &dyn Fn(&str, i64) -> Result<u32, MatrixError>,
    err: &dyn Fn(&str, String) -> MatrixError,
    strict: bool,
) -> Result<Dataset, MatrixError> {
    let turns = u32::try_from(m.turns).ok().filter(|t| (1..=MAX_TURNS).contains(t)).ok_or_else(|| {
        err(&field("dataset.multi_turn.turns"), format!("must be from 1 to {MAX_TURNS}, got {}", m.turns))
    })?;
    let user_tokens = count("multi_turn.user_tokens", m.user_tokens)?;
    let output_tokens = count("multi_turn.output_tokens", m.output_tokens)?;
    let think_time_ms = think_time(m.think_time_ms, &field("dataset.multi_turn.think_time_ms"), err)?;
    // Turn k sends k user turns and k - 1 replies.
    let (t, u, o) = (u64::from(turns), u64::from(user_tokens), u64::from(output_tokens));
    let session = u * t * (t + 1) / 2 + o * t * (t - 1) / 2;
    let prompt_tokens = session.saturating_mul(requests.div_ceil(t));
    if strict && prompt_tokens > MAX_PROMPT_TOKENS {
        return Err(err(
            &field("dataset"),
            format!(
                "{requests} requests in sessions of {turns} turns are about {prompt_tokens} prompt tokens (each \
                 turn carries the conversation so far); a job may hold at most {MAX_PROMPT_TOKENS}"
            ),
        ));
    }
    Ok(Dataset::MultiTurn { turns, user_tokens, output_tokens, think_time_ms, seed: m.seed })
}

/// A session's think time: whole milliseconds from 0 (the default) to an
/// hour.
fn think_time(ms: Option<i64>, field: &str, err: &dyn Fn(&str, String) -> MatrixError) -> Result<u64, MatrixError> {
    match ms {
        None => Ok(0),
        Some(ms) => u64::try_from(ms)
            .ok()
            .filter(|&ms| ms <= 3_600_000)
            .ok_or_else(|| err(field, format!("must be from 0 to 3600000 ms, got {ms}"))),
    }
}

/// The most turns a session may have.
const MAX_TURNS: u32 = 1024;

/// A profile's warm-up and cool-down: requests (fewer than it sends, and
/// leaving some to measure) or seconds.
pub(super) fn windows_of(
    name: &str,
    p: &RawProfile,
    requests: u64,
    err: &dyn Fn(&str, String) -> MatrixError,
) -> Result<(Option<Window>, Option<Window>), MatrixError> {
    let field = |f: &str| format!("profiles.{name}.{f}");
    let window = |f: &str, w: &Option<RawWindow>| -> Result<Option<Window>, MatrixError> {
        match w {
            None => Ok(None),
            Some(RawWindow::Requests(n)) => match u64::try_from(*n) {
                Ok(n) if n < requests => Ok(Some(Window::Requests(n))),
                _ => Err(err(
                    &field(f),
                    format!("must be fewer requests than the profile's {requests}, or seconds ('30s'), got {n}"),
                )),
            },
            Some(RawWindow::Text(t)) => seconds_of(t).map(|s| Some(Window::Seconds(s))).ok_or_else(|| {
                err(&field(f), format!("must be a number of requests or seconds ('30s', '2m'), got '{t}'"))
            }),
        }
    };
    let warmup = window("warmup", &p.warmup)?;
    let cooldown = window("cooldown", &p.cooldown)?;
    if let (Some(Window::Requests(a)), Some(Window::Requests(b))) = (warmup, cooldown)
        && a + b >= requests
    {
        return Err(err(
            &field("cooldown"),
            format!("{a} warm-up and {b} cool-down requests leave none of the {requests} to measure"),
        ));
    }
    Ok((warmup, cooldown))
}

/// A profile's extra_body: a mapping, sent as a JSON object.
pub(super) fn extra_body_of(
    name: &str,
    p: &RawProfile,
    err: &dyn Fn(&str, String) -> MatrixError,
) -> Result<Option<String>, MatrixError> {
    let field = |f: &str| format!("profiles.{name}.{f}");
    Ok(match &p.extra_body {
        None => None,
        Some(v @ serde_yaml_ng::Value::Mapping(_)) => {
            let json = serde_json::to_value(v).ok().filter(serde_json::Value::is_object).ok_or_else(|| {
                err(&field("extra_body"), "must be a mapping with string keys, as a JSON object has".to_owned())
            })?;
            Some(json.to_string())
        }
        Some(_) => {
            return Err(err(&field("extra_body"), "must be a mapping of fields, e.g. { temperature: 0 }".to_owned()));
        }
    })
}

/// A profile's goodput SLOs: at least one, each at least 0 ms.
pub(super) fn goodput_of(
    name: &str,
    p: &RawProfile,
    err: &dyn Fn(&str, String) -> MatrixError,
) -> Result<Option<benchfleet_core::metrics::Slo>, MatrixError> {
    let field = |f: &str| format!("profiles.{name}.{f}");
    let Some(g) = &p.goodput else { return Ok(None) };
    for (f, v) in [("ttft_ms", g.ttft_ms), ("tpot_ms", g.tpot_ms), ("e2el_ms", g.e2el_ms)] {
        if let Some(ms) = v.filter(|ms| !ms.is_finite() || *ms < 0.0) {
            return Err(err(&field(&format!("goodput.{f}")), format!("must be ms, at least 0, got {ms}")));
        }
    }
    if g.ttft_ms.is_none() && g.tpot_ms.is_none() && g.e2el_ms.is_none() {
        return Err(err(&field("goodput"), "gives no SLO: set ttft_ms, tpot_ms or e2el_ms".to_owned()));
    }
    Ok(Some(benchfleet_core::metrics::Slo { ttft_ms: g.ttft_ms, tpot_ms: g.tpot_ms, e2el_ms: g.e2el_ms }))
}

/// A profile's search, validated: one dimension with its two bounds, the
/// steps, the SLOs; the profile must leave the searched load to it.
pub(super) fn search_of(
    name: &str,
    p: &RawProfile,
    err: &dyn Fn(&str, String) -> MatrixError,
) -> Result<Option<Search>, MatrixError> {
    let Some(raw) = &p.search else { return Ok(None) };
    let field = |f: &str| format!("profiles.{name}.{f}");
    let swept =
        p.rate.as_ref().is_some_and(OneOrMany::is_sweep) || p.max_concurrency.as_ref().is_some_and(OneOrMany::is_sweep);
    if swept {
        return Err(err(
            &field("search"),
            "a search profile cannot also be a sweep: the search chooses its own points".to_owned(),
        ));
    }
    if p.mode.is_some() {
        return Err(err(&field("mode"), "a search profile sets its own load: leave mode out".to_owned()));
    }
    let (over, lo, hi) = match (&raw.rate, &raw.max_concurrency) {
        (Some(_), None) if p.dataset.trace.is_some() => {
            return Err(err(
                &field("search.rate"),
                "a trace sends on its own schedule: search its max_concurrency instead".to_owned(),
            ));
        }
        (Some(r), None) => {
            let [lo, hi] = r[..] else {
                return Err(err(&field("search.rate"), format!("must be [lo, hi], two rates; got {} values", r.len())));
            };
            if !(lo.is_finite() && hi.is_finite() && lo > 0.0 && lo < hi) {
                return Err(err(
                    &field("search.rate"),
                    format!("must be [lo, hi] with 0 < lo < hi requests per second, got [{lo}, {hi}]"),
                ));
            }
            if !(MIN_SEARCH_RATE..=MAX_SEARCH_RATE).contains(&lo) || hi > MAX_SEARCH_RATE {
                return Err(err(
                    &field("search.rate"),
                    format!(
                        "the bounds must be from {MIN_SEARCH_RATE} to {MAX_SEARCH_RATE} requests per second, got \
                         [{lo}, {hi}]"
                    ),
                ));
            }
            if p.rate.is_some() {
                return Err(err(&field("rate"), "the search sets the rate: leave rate out".to_owned()));
            }
            (Over::Rate, lo, hi)
        }
        (None, Some(c)) => {
            let [lo, hi] = c[..] else {
                return Err(err(
                    &field("search.max_concurrency"),
                    format!("must be [lo, hi], two caps; got {} values", c.len()),
                ));
            };
            if !(1 <= lo && lo < hi && hi <= MAX_SEARCH_CONCURRENCY) {
                return Err(err(
                    &field("search.max_concurrency"),
                    format!("must be [lo, hi] with 1 <= lo < hi <= {MAX_SEARCH_CONCURRENCY}, got [{lo}, {hi}]"),
                ));
            }
            if p.max_concurrency.is_some() {
                return Err(err(
                    &field("max_concurrency"),
                    "the search sets the concurrency: leave max_concurrency out".to_owned(),
                ));
            }
            (Over::Concurrency, lo as f64, hi as f64)
        }
        _ => {
            return Err(err(
                &field("search"),
                "give what it searches: rate: [lo, hi] or max_concurrency: [lo, hi], one of them".to_owned(),
            ));
        }
    };
    let steps = match raw.steps {
        None => crate::slo::DEFAULT_STEPS,
        Some(n) => u32::try_from(n).ok().filter(|n| *n <= crate::slo::MAX_STEPS).ok_or_else(|| {
            err(&field("search.steps"), format!("must be from 0 to {}, got {n}", crate::slo::MAX_STEPS))
        })?,
    };
    let Some(slo) = raw.slo.as_ref().filter(|m| !m.is_empty()) else {
        return Err(err(
            &field(if raw.slo.is_some() { "search.slo" } else { "search" }),
            format!("gives no SLO to hold: set one or more of {}, or goodput", crate::slo::KEYS),
        ));
    };
    let (mut bounds, mut goodput) = (Vec::new(), None);
    for (key, value) in slo {
        let Some(key) = key.as_str() else {
            return Err(err(&field("search.slo"), "its keys must be SLO names, e.g. ttft_p99_ms".to_owned()));
        };
        let f = field(&format!("search.slo.{key}"));
        if key == "goodput" {
            if p.goodput.is_none() {
                return Err(err(
                    &f,
                    "counts the requests within the profile's goodput SLOs: give the profile goodput: \
                     { ttft_ms, tpot_ms, e2el_ms } too"
                        .to_owned(),
                ));
            }
            let all = value.as_f64() == Some(1.0) || value.as_str().is_some_and(|t| t.trim() == "100%");
            let share = if all { 1.0 } else { fraction(err, &f, value)? };
            if share <= 0.0 {
                return Err(err(&f, "must be more than 0% of the requests".to_owned()));
            }
            goodput = Some(share);
            continue;
        }
        let ms = value.as_f64().filter(|ms| ms.is_finite() && *ms > 0.0).ok_or_else(|| {
            let shown = serde_yaml_ng::to_string(value).unwrap_or_default();
            err(&f, format!("must be a positive number of milliseconds, got {}", shown.trim()))
        })?;
        let bound = crate::slo::Bound::parse(key, ms)
            .ok_or_else(|| err(&f, format!("is not an SLO this search knows; use {}, or goodput", crate::slo::KEYS)))?;
        bounds.push(bound);
    }
    Ok(Some(Search { over, lo, hi, steps, slo: bounds, goodput }))
}

/// Seconds written as `30s`, `2m` or `1h`, positive.
pub(super) fn seconds_of(text: &str) -> Option<f64> {
    let t = text.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3600.0)
    } else {
        return None;
    };
    number.trim().parse::<f64>().ok().map(|n| n * scale).filter(|s| s.is_finite() && *s > 0.0)
}
