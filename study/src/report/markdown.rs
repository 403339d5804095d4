//! The report as the reference documents lay it out, in Markdown: the
//! conclusion (the serve command and the before/after table), the notes,
//! the setup, the profiles, the results stage by stage with every "Serving
//! Benchmark Result" block and where it came from, the summary of the
//! optimizations tried, the other profiles, and the failures.

use std::fmt::Write as _;

use benchfleet_core::{render_block, render_block_with};

use super::doc::*;
use super::words;

pub fn render(doc: &ReportDoc) -> String {
    let mut out = String::new();
    let run = &doc.run;
    let aim = match run.objective.as_str() {
        "mean_latency" => "latency",
        "output_throughput" => "output throughput",
        "capacity" => "capacity",
        _ => "throughput",
    };
    // The matrix's model is its baseline's; variants may serve others.
    let model = doc.setup.models.first().map_or("", String::as_str);
    let _ = writeln!(out, "# {}: {model} {aim} optimization\n", run.name);
    let _ = writeln!(
        out,
        "Run {} (`{}`), {}: {} of {} jobs succeeded, {} failed. Written by {}.\n",
        run.id, run.matrix_file, run.state, run.jobs_succeeded, run.jobs_total, run.jobs_failed, doc.generated_by
    );

    conclusion(&mut out, doc, aim);
    if let Some(f) = &doc.fleet {
        super::fleet::markdown(&mut out, f);
    }
    notes(&mut out, doc);
    setup(&mut out, doc);
    profiles(&mut out, doc);
    results(&mut out, doc);
    searches(&mut out, doc);
    pareto(&mut out, doc);
    summary_table(&mut out, doc);
    other_profiles(&mut out, doc);
    failures(&mut out, doc);
    out
}

fn conclusion(out: &mut String, doc: &ReportDoc, aim: &str) {
    let _ = writeln!(out, "## Conclusion\n");
    let Some(r) = &doc.recommendation else {
        if let Some(why) = words::no_capacity(doc) {
            let _ = writeln!(out, "{why}: nothing is recommended.\n");
            return;
        }
        let _ = writeln!(
            out,
            "No configuration met the acceptance (a valid run and a success rate of at least {:.1}%) on the primary \
             profile `{}`: nothing is recommended.\n",
            doc.run.min_success_rate * 100.0,
            doc.run.primary_profile
        );
        return;
    };
    let gpu = gpu_names(doc);
    let on = if gpu.is_empty() { String::new() } else { format!(" on {gpu}") };
    let model = doc.configurations.iter().find(|c| c.name == r.config).map_or("", |c| c.model.as_str());
    let _ = writeln!(out, "The recommended configuration to optimize the {aim} of {model}{on} (`{}`):\n", r.config);
    let _ = writeln!(out, "Serve command:\n");
    let _ = writeln!(out, "```shell\n{}\n```\n", multi_line(doc, &r.config));
    if !r.simulator_flags.is_empty() {
        let _ = writeln!(out, "{}\n", super::words::simulator_flags_left_out(&r.simulator_flags, "`"));
    }
    let _ = writeln!(out, "Chosen as {}.\n", r.why);
    match &r.baseline {
        Some(base) => {
            let _ = writeln!(out, "Benchmark results before and after the optimization:\n");
            let _ = writeln!(
                out,
                "| Benchmark profile | Baseline (`{base}`, no optimization) | Optimized (`{}`) |",
                r.config
            );
            let _ = writeln!(out, "|---|---|---|");
            for row in &r.table {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} |",
                    cell(&row.profile),
                    cell(row.baseline.as_deref().unwrap_or("no result")),
                    cell(row.optimized.as_deref().unwrap_or("no result"))
                );
            }
            out.push('\n');
        }
        None => {
            let _ = writeln!(out, "No variant did better than this engine's defaults beyond noise.\n");
        }
    }
    if let Some(line) = cost_line(doc, r) {
        let _ = writeln!(out, "{line}\n");
    }
}

/// What a million output tokens cost on the recommended configuration, and
/// on its baseline, at the matrix's price; `None` without one.
fn cost_line(doc: &ReportDoc, r: &Recommendation) -> Option<String> {
    let cost = |name: &str| doc.configurations.iter().find(|c| c.name == name)?.block(&r.profile)?.cost.clone();
    let best = cost(&r.config)?;
    let per_million = best.per_million_output?;
    let currency = &best.currency;
    let mut line = format!(
        "At {:.2} {currency} a GPU-hour, a million output tokens cost {per_million:.4} {currency} on `{}`",
        best.gpu_hour, r.config
    );
    if let Some(base) = r.baseline.as_deref().and_then(|b| cost(b)?.per_million_output.map(|c| (b, c))) {
        let (name, before) = base;
        line.push_str(&format!(
            ", against {before:.4} {currency} on the baseline `{name}` ({:+.1}%)",
            (per_million / before - 1.0) * 100.0
        ));
    }
    line.push_str(&format!(" (profile {}).", r.profile));
    Some(line)
}

/// The recommended serve command one argument a line, as the references
/// print it.
fn multi_line(doc: &ReportDoc, config: &str) -> String {
    doc.configurations.iter().find(|c| c.name == config).map_or(String::new(), Configuration::published_lines)
}

fn gpu_names(doc: &ReportDoc) -> String {
    // A fingerprint starts with the product name, before its first comma
    // or parenthesis.
    let mut names: Vec<String> = doc
        .setup
        .gpus
        .iter()
        .map(|g| g.split([',', '(', ';']).next().unwrap_or(g).trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names.join(", ")
}

fn notes(out: &mut String, doc: &ReportDoc) {
    let _ = writeln!(out, "## Notes\n");
    let mut n = 0;
    let mut note = |out: &mut String, text: String| {
        n += 1;
        let _ = writeln!(out, "{n}. {text}");
    };
    if doc.run.strategy == "greedy" {
        let tried = if doc.greedy.as_ref().is_some_and(|g| g.cumulative) {
            "each variant is tried on top of the configuration kept so far, in the matrix's order, and kept if it \
             helps"
        } else {
            "each variant is tried alone on it, and those that helped are combined while they still help"
        };
        note(
            out,
            format!(
                "The benchmark does not cover every combination of optimizations: the engine that did best at its \
                 defaults is the starting point, {tried}. This pruning finds a local optimum, which need not be the \
                 global one."
            ),
        );
    }
    let confirmed = doc.run.confirm_repeats.map_or(String::new(), |n| {
        format!(
            " A decision taken on fewer than {n} repeats whose gain came out from 0 to twice that minimum was taken \
             again once both sides had run {n} times: one run each can fall on either side of it."
        )
    });
    note(
        out,
        format!(
            "A difference counts only when it is at least {:.2}% and its 95% interval excludes zero: Welch's with two \
             repeats or more on each side, else the one the runs' own requests give (batch means; a mean latency, \
             TTFT or TPOT of the same requests batch by batch, paired). Otherwise it is within noise, and a variant \
             within noise is never adopted.{confirmed}",
            doc.run.min_effect * 100.0
        ),
    );
    note(
        out,
        "A run is INVALID when the load generator did not keep its own schedule (its dispatch lag or achieved rate, \
         by the rule of its load kind in docs/metrics.md): its numbers are shown, never compared or recommended."
            .into(),
    );
    note(
        out,
        "The results hold for the hardware and software listed under Setup; newer engine versions may change them."
            .into(),
    );
    out.push('\n');
}

fn setup(out: &mut String, doc: &ReportDoc) {
    let _ = writeln!(out, "## Setup\n");
    let _ = writeln!(out, "### Model\n");
    for m in &doc.setup.models {
        let _ = writeln!(out, "- {m}");
    }
    let _ = writeln!(out, "\n### Hardware\n");
    if doc.setup.gpus.is_empty() {
        let _ = writeln!(out, "- no GPU reported");
    }
    for g in &doc.setup.gpus {
        let _ = writeln!(out, "- {g}");
    }
    if !doc.setup.hosts.is_empty() {
        let _ = writeln!(out, "- hosts: {}", doc.setup.hosts.join(", "));
    }
    let _ = writeln!(out, "\n### Engines\n");
    for e in &doc.setup.engines {
        let images = if e.images.is_empty() { String::new() } else { format!(", image {}", e.images.join(", ")) };
        let digests =
            if e.image_digests.is_empty() { String::new() } else { format!(" ({})", e.image_digests.join(", ")) };
        let versions = if e.versions.is_empty() { String::new() } else { format!(": {}", e.versions.join(", ")) };
        let _ = writeln!(out, "- {}{versions} ({}, {} runtime{images}{digests})", e.name, e.kind, e.runtime);
    }
    let _ = writeln!(out, "\n### Method\n");
    let _ = writeln!(
        out,
        "Each job started the engine configuration on its GPUs and ran `benchfleet-loadgen` against it; every \
         request's record was streamed to the controller and stored. {} repeat{}{} per configuration and profile; \
         repeats are pooled (the percentiles of the union of their samples, never a mean of percentiles), and each \
         headline number gets a 95% interval from the repeats' own values (Student's t). Objective: {}; \
         acceptance: a success rate of at least {:.1}%. Metric definitions: docs/metrics.md.\n",
        doc.run.repeats,
        if doc.run.repeats == 1 { "" } else { "s" },
        doc.run.confirm_repeats.map_or(String::new(), |n| format!(" ({n} where a decision was confirmed)")),
        doc.run.objective,
        doc.run.min_success_rate * 100.0
    );
}

fn profiles(out: &mut String, doc: &ReportDoc) {
    let _ = writeln!(out, "## Benchmark profiles\n");
    for p in doc.profiles.iter().filter(|p| p.probe_of.is_none()) {
        let primary = if p.primary { " (primary)" } else { "" };
        let _ = writeln!(out, "### {}{primary}\n", p.name);
        let _ = writeln!(out, "```yaml");
        for (k, v) in &p.parameters {
            let _ = writeln!(out, "{k}: {v}");
        }
        let _ = writeln!(out, "```\n");
    }
}

fn results(out: &mut String, doc: &ReportDoc) {
    let _ = writeln!(out, "## Results\n");
    if doc.stages.is_empty() {
        for c in &doc.configurations {
            let _ = writeln!(out, "### {}\n", c.name);
            let probe = |b: &Block| doc.profiles.iter().any(|p| p.name == b.profile && p.probe_of.is_some());
            for b in c.blocks.iter().filter(|b| !probe(b)) {
                block(out, c, b, "####");
            }
            for s in doc.searches.iter().filter(|s| s.results.iter().any(|r| r.config == c.name)) {
                let _ = writeln!(out, "#### Search {}\n", s.profile);
                searched(out, c, s, Some("#####"));
            }
        }
        return;
    }
    let primary = doc.run.primary_profile.as_str();
    // A configuration's probe blocks are shown the first time it appears.
    let mut probed: Vec<&str> = Vec::new();
    for s in &doc.stages {
        let _ = writeln!(out, "### Stage {}: {}\n", s.number, s.title);
        for name in &s.configurations {
            let Some(c) = doc.configurations.iter().find(|c| &c.name == name) else { continue };
            let _ = writeln!(out, "#### {name}\n");
            if let Some(search) = doc.searches.iter().find(|s| s.profile == primary) {
                let again = probed.contains(&name.as_str());
                probed.push(name);
                searched(out, c, search, if again { None } else { Some("#####") });
                continue;
            }
            match c.block(primary) {
                Some(b) => block(out, c, b, "#####"),
                None => {
                    let _ = writeln!(out, "No job on the primary profile.\n");
                }
            }
        }
        if let Some(said) = &s.summary {
            let _ = writeln!(out, "Summary: {said}\n");
        }
        if !s.decisions.is_empty() {
            let _ = writeln!(out, "Decisions:\n");
            for d in &s.decisions {
                let _ = writeln!(out, "- `{}`: {}", d.config, d.verdict);
            }
            out.push('\n');
        }
    }
    if let Some(g) = &doc.greedy {
        match (g.running_stage, &g.chosen) {
            (Some(n), _) => {
                let _ = writeln!(out, "Stage {n} is still running.\n");
            }
            (None, Some(w)) => {
                let _ = writeln!(out, "Chosen: `{w}`: {}\n", g.reason);
            }
            (None, None) => {
                let _ = writeln!(out, "Nothing chosen: {}\n", g.reason);
            }
        }
    }
}

/// Each search: the load found per configuration (every probe is under
/// Results).
/// Each sweep's Pareto set: the points no other point of the sweep beats
/// on both throughput per GPU and tokens per second per user.
fn pareto(out: &mut String, doc: &ReportDoc) {
    if doc.pareto.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## Pareto
"
    );
    for sweep in &doc.pareto {
        let _ = writeln!(
            out,
            "### {}

The points of the sweep that no other point beats on both output tokens per second per GPU \
             and per user (1000 / mean TPOT), from the most throughput to the most interactive:\n",
            sweep.sweep
        );
        let _ = writeln!(
            out,
            "| Configuration | Profile | Output tok/s per GPU | Output tok/s per user |\n|---|---|---:|---:|"
        );
        for (config, p) in sweep.optimal() {
            let _ = writeln!(out, "| `{config}` | {} | {:.2} | {:.2} |", p.profile, p.per_gpu, p.per_user);
        }
        out.push('\n');
    }
}

fn searches(out: &mut String, doc: &ReportDoc) {
    if doc.searches.is_empty() {
        return;
    }
    let _ = writeln!(out, "## SLO search\n");
    for s in &doc.searches {
        let primary = if s.primary { " (primary)" } else { "" };
        let _ = writeln!(out, "### {}{primary}\n", s.profile);
        let _ = writeln!(
            out,
            "The highest {} from {} to {} {} at which {} held, by bisection: at most {} probes after the bounds.\n",
            if s.over == "rate" { "request rate" } else { "concurrency" },
            words::number(s.lo),
            words::number(s.hi),
            s.unit,
            s.slo.join(", "),
            s.steps
        );
        let _ = writeln!(out, "| Configuration | Capacity | Held at | Missed at | Probes |\n|---|---|---:|---:|---:|");
        for r in &s.results {
            let at = |x: Option<f64>| x.map_or("-".to_owned(), words::number);
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} |",
                r.config,
                cell(&r.capacity),
                at(r.found),
                at(r.missed_at),
                r.probes.len()
            );
        }
        out.push('\n');
    }
}

/// A configuration's search: what it found, its probes in the order they
/// ran, and (with a heading for them) each probe's block.
fn searched(out: &mut String, c: &Configuration, s: &SearchInfo, blocks: Option<&str>) {
    let Some(r) = s.results.iter().find(|r| r.config == c.name) else {
        let _ = writeln!(out, "No probe of the search {}.\n", s.profile);
        return;
    };
    let _ = writeln!(out, "Capacity within {}: {}.\n", s.slo.join(", "), r.capacity);
    let _ = writeln!(out, "| Probe | Load | SLOs | Measured | Why not |\n|---|---:|---|---|---|");
    for p in &r.probes {
        let held = p.verdict();
        let _ = writeln!(
            out,
            "| {} | {} {} | {held} | {} | {} |",
            p.profile,
            words::number(p.point),
            s.unit,
            cell(&p.measured),
            cell(p.missed.as_deref().unwrap_or(""))
        );
    }
    out.push('\n');
    let Some(heading) = blocks else { return };
    for p in &r.probes {
        if let Some(b) = c.block(&p.profile) {
            block(out, c, b, heading);
        }
    }
}

/// A multi-turn run's figures by turn number: the first turn against the later ones, whose
/// conversation a prefix cache may hold.
fn turns(out: &mut String, s: &benchfleet_core::Summary) {
    let Some(sessions) = s.sessions.as_ref().filter(|x| !x.by_turn.is_empty()) else { return };
    let _ = writeln!(
        out,
        "By turn ({} sessions, {:.2} turns a session):\n\n| Turn | Successful | Failed | Mean TTFT (ms) | Mean prompt tokens |\n|---:|---:|---:|---:|---:|",
        sessions.sessions,
        sessions.turns_per_session()
    );
    for t in &sessions.by_turn {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.2} | {:.1} |",
            t.label(),
            t.successful,
            t.failed,
            t.mean_ttft_ms,
            t.mean_prompt_tokens
        );
    }
    out.push('\n');
}

/// One configuration on one profile: its backend parameters, its block,
/// the intervals, and where every repeat was measured.
fn block(out: &mut String, c: &Configuration, b: &Block, heading: &str) {
    let _ = writeln!(out, "- Profile: {}", b.profile);
    let _ = writeln!(out, "- Backend parameters:\n");
    let _ =
        writeln!(out, "```\n{}\n```\n", if c.args.is_empty() { "(defaults)".to_owned() } else { c.args.join("\n") });
    let n = b.succeeded();
    match (&b.pooled, &b.not_pooled) {
        (Some(s), _) => {
            let pooled = if n > 1 { format!(" ({n} repeats pooled)") } else { String::new() };
            let _ = writeln!(out, "{heading} Benchmark result{pooled}\n");
            let _ = writeln!(out, "```\n{}```\n", render_block_with(s, &b.sections()));
            turns(out, s);
            if b.intervals.is_empty() {
                let _ = writeln!(out, "One repeat: no confidence intervals.\n");
            } else if n == 1 {
                let _ = writeln!(
                    out,
                    "One repeat: 95% confidence intervals from its own requests (batch means, docs/metrics.md):\n"
                );
                let _ = writeln!(out, "| Metric | Value | ± |\n|---|---:|---:|");
                for i in &b.intervals {
                    let half = i.half_width.map_or("no interval".to_owned(), |h| format!("{h:.2}"));
                    let _ = writeln!(out, "| {} | {:.2} | {half} |", i.metric, i.mean);
                }
                out.push('\n');
            } else {
                let _ = writeln!(out, "95% confidence intervals over the {n} repeats (Student's t, {} df):\n", n - 1);
                let _ = writeln!(out, "| Metric | Mean | ± |\n|---|---:|---:|");
                for i in &b.intervals {
                    let _ = writeln!(out, "| {} | {:.2} | {:.2} |", i.metric, i.mean, i.half_width.unwrap_or(0.0));
                }
                out.push('\n');
            }
        }
        (None, Some(why)) => {
            let _ = writeln!(out, "The {n} repeats cannot be pooled ({why}); each is shown alone.\n");
            for r in b.repeats.iter().filter(|r| r.state == "succeeded") {
                if let Some(s) = &r.summary {
                    let _ = writeln!(out, "{heading} Benchmark result, repeat {}\n", r.repeat);
                    let _ = writeln!(out, "```\n{}```\n", render_block(s, r.energy().as_ref()));
                }
            }
        }
        (None, None) => {
            let _ = writeln!(out, "No successful repeat.\n");
        }
    }
    let _ = writeln!(out, "Provenance:\n");
    for r in &b.repeats {
        let p = &r.provenance;
        let mut facts = vec![format!("job {}, {}", r.job, r.state)];
        if let Some(h) = &p.host {
            facts.push(format!("host {h} (attempt {})", p.attempt));
        }
        if let (Some(a), Some(e)) = (p.started_unix_ms, p.ended_unix_ms) {
            facts.push(format!("{} to {}", words::utc(a), words::utc(e)));
        }
        if let Some(s) = p.engine_startup_s {
            facts.push(format!("engine serving {s:.1} s after start"));
        }
        if let Some(cache) = &p.prefix_cache {
            facts.push(format!("prefix cache {cache}"));
        }
        facts.push(format!("engine command `{}`", c.serve_command));
        facts.push(p.dataset.clone());
        facts.push(p.load.clone());
        if !c.image.is_empty() {
            let digest = p.image_digest.as_deref().map_or(String::new(), |d| format!(" ({d})"));
            facts.push(format!("image {}{digest}", c.image));
        }
        if let Some(v) = &p.engine_version {
            facts.push(format!("engine version {v}"));
        }
        if let Some(v) = &p.loadgen_version {
            facts.push(v.clone());
        }
        for g in &p.gpus {
            facts.push(format!("GPU {g}"));
        }
        if let Some(b) = p.peak_gpu_memory_bytes {
            facts.push(format!("peak GPU memory {}", words::gib(b)));
        }
        for t in &p.throttled {
            facts.push(format!("**GPU held down**: {t}"));
        }
        if let Some(why) = &p.invalid {
            facts.push(format!("**INVALID**: {why}"));
        }
        if let Some(said) = &p.token_counts {
            facts.push(format!("token counts disagree: {said}"));
        }
        if let Some(w) = r.summary.as_ref().and_then(|s| s.steady_state_said()) {
            let said = format!("steady state {}", w.words());
            facts.push(if w.drifts() { format!("**{said}**") } else { said });
        }
        if let Some(said) = p.telemetry.as_ref().and_then(words::telemetry) {
            facts.push(format!("during the job: {said}"));
        }
        let _ = writeln!(out, "- repeat {}: {}", r.repeat, facts.join("; "));
    }
    out.push('\n');
    if let Some(command) =
        b.repeats.iter().filter(|r| r.state == "succeeded").find_map(|r| r.provenance.reproduce.as_ref())
    {
        let _ = writeln!(
            out,
            "Reproduce this block's load against an engine started with the backend parameters above \
             (`ENGINE_URL`: its address, e.g. `http://127.0.0.1:8000`):\n"
        );
        let _ = writeln!(out, "```shell\n{command}\n```\n");
    }
}

fn summary_table(out: &mut String, doc: &ReportDoc) {
    let primary = doc.run.primary_profile.as_str();
    let rows: Vec<&ComparisonRow> = doc.comparisons.iter().filter(|r| r.profile == primary).collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Summary of the optimizations\n");
    let _ = writeln!(out, "On the primary profile `{primary}`, each against its engine's defaults:\n");
    let _ = writeln!(out, "| Configuration | Optimized | Baseline | Comparison | Decision |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for r in rows {
        let value = |v: Option<f64>, tpot: Option<f64>| match (v, tpot) {
            (Some(v), _) if doc.run.objective == "mean_latency" => format!("Mean latency: {v:.2}s/req"),
            (Some(v), Some(t)) => format!("{}: {v:.2} Mean TPOT(ms): {t:.2}", r.metric),
            (Some(v), None) => format!("{}: {}", r.metric, words::number(v)),
            _ => "no result".to_owned(),
        };
        let decision = doc
            .stages
            .iter()
            .flat_map(|s| &s.decisions)
            .rfind(|d| d.config == r.config)
            .map(|d| d.verdict.as_str())
            .unwrap_or(if r.verdict.adopted() { "better" } else { "not adopted" });
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} |",
            r.config,
            cell(&value(r.value, r.tpot_ms)),
            cell(&value(r.baseline_value, r.baseline_tpot_ms)),
            cell(&r.said),
            cell(decision)
        );
    }
    out.push('\n');
}

/// The profiles other than the primary one: the baseline's and the
/// recommendation's blocks side by side (a grid shows them under Results).
fn other_profiles(out: &mut String, doc: &ReportDoc) {
    if doc.stages.is_empty() {
        return;
    }
    let others: Vec<&ProfileInfo> = doc.profiles.iter().filter(|p| !p.primary && p.probe_of.is_none()).collect();
    if others.is_empty() {
        return;
    }
    let shown: Vec<&Configuration> = match &doc.recommendation {
        Some(r) => {
            doc.configurations.iter().filter(|c| Some(&c.name) == r.baseline.as_ref() || c.name == r.config).collect()
        }
        None => doc.configurations.iter().filter(|c| c.is_baseline()).collect(),
    };
    let _ = writeln!(out, "## Other benchmark profiles\n");
    for p in others {
        let _ = writeln!(out, "### {}\n", p.name);
        let search = doc.searches.iter().find(|s| s.profile == p.name);
        for c in &shown {
            if let Some(s) = search {
                let role = if c.is_baseline() { "Baseline" } else { "Optimized" };
                let _ = writeln!(out, "#### {role}: {}\n", c.name);
                searched(out, c, s, Some("#####"));
            } else if let Some(b) = c.block(&p.name) {
                let role = if c.is_baseline() { "Baseline" } else { "Optimized" };
                let _ = writeln!(out, "#### {role}: {}\n", c.name);
                block(out, c, b, "#####");
            }
        }
    }
}

fn failures(out: &mut String, doc: &ReportDoc) {
    let failed: Vec<(&Configuration, &Block, &Repeat)> = doc
        .configurations
        .iter()
        .flat_map(|c| c.blocks.iter().map(move |b| (c, b)))
        .flat_map(|(c, b)| b.repeats.iter().filter(|r| r.state != "succeeded").map(move |r| (c, b, r)))
        .collect();
    if failed.is_empty() {
        return;
    }
    let _ = writeln!(out, "## Failures\n");
    for (c, b, r) in failed {
        let _ = writeln!(
            out,
            "- `{}` on {}, repeat {} ({}): {}",
            c.name,
            b.profile,
            r.repeat,
            r.state,
            r.error.as_deref().unwrap_or("no reason given")
        );
        if let Some(tail) = &r.log_tail {
            let _ = writeln!(
                out,
                "\n  ```\n{}\n  ```",
                tail.lines().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
            );
        }
    }
    out.push('\n');
}

/// Text safe in a table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}
