//! The report as console text: what `benchfleet run` and `report` print.

use std::fmt::Write as _;

use benchfleet_core::{render_block, render_block_with};

use super::doc::*;

pub fn render(doc: &ReportDoc) -> String {
    let mut out = String::new();
    let run = &doc.run;
    let _ = writeln!(out, "Run {}: {} ({})", run.id, run.name, run.matrix_file);
    let _ = writeln!(
        out,
        "State: {}; {} of {} jobs succeeded, {} failed",
        run.state, run.jobs_succeeded, run.jobs_total, run.jobs_failed
    );
    if let Some(f) = &doc.fleet {
        super::fleet::console(&mut out, f);
    }

    for c in &doc.configurations {
        let _ = writeln!(out, "\n## {}\n", c.name);
        let _ = writeln!(out, "Serve command:\n\n{}\n", c.serve_command);
        if c.runtime == "docker" && !c.image.is_empty() {
            let _ = writeln!(out, "Image: {}", c.image);
        }
        // The GPUs every number of this configuration was measured on.
        let mut gpus: Vec<&String> =
            c.blocks.iter().flat_map(|b| &b.repeats).flat_map(|r| &r.provenance.gpus).collect();
        gpus.sort();
        gpus.dedup();
        for gpu in &gpus {
            let _ = writeln!(out, "GPU: {gpu}");
        }
        if !gpus.is_empty() {
            out.push('\n');
        }
        for b in &c.blocks {
            block(&mut out, b);
        }
    }

    if let Some(g) = &doc.greedy {
        let _ = writeln!(out, "## Greedy stages\n");
        for s in &doc.stages {
            let _ = writeln!(out, "Stage {}: {}", s.number, s.title);
            for d in &s.decisions {
                let _ = writeln!(out, "  {:<40} {}", d.config, d.verdict);
            }
            if let Some(said) = &s.summary {
                let _ = writeln!(out, "  Summary: {said}");
            }
        }
        match g.running_stage {
            Some(n) => {
                let title = super::stage_title(n, g.cumulative);
                let _ = writeln!(out, "Stage {n} ({title}) is running");
            }
            None => {
                let chosen = g.chosen.as_deref().map_or(String::new(), |w| format!("{w}: "));
                let _ = writeln!(out, "Chosen: {chosen}{}", g.reason);
            }
        }
        out.push('\n');
    }

    for s in &doc.searches {
        let _ = writeln!(out, "## SLO search: {}\n", s.profile);
        let _ = writeln!(
            out,
            "The highest {} from {} to {} {} holding {}:",
            s.over,
            super::words::number(s.lo),
            super::words::number(s.hi),
            s.unit,
            s.slo.join(", ")
        );
        for r in &s.results {
            let _ = writeln!(out, "  {:<40} {}", r.config, r.capacity);
            for p in &r.probes {
                let held = p.verdict();
                let why = p.missed.as_deref().map_or(String::new(), |m| format!(": {m}"));
                let _ = writeln!(out, "    {:<24} {held:<7} {}{why}", p.profile, p.measured);
            }
        }
        out.push('\n');
    }

    if !doc.comparisons.is_empty() {
        let _ = writeln!(out, "## Against the baseline\n");
        for p in doc.profiles.iter().filter(|p| doc.comparisons.iter().any(|r| r.profile == p.name)) {
            let _ = writeln!(out, "Profile: {}", p.name);
            for row in doc.comparisons.iter().filter(|r| r.profile == p.name) {
                let line = match (row.value, row.baseline_value) {
                    (Some(v), Some(b)) if row.tpot_ms.is_none() => {
                        format!("{name}: {v:.2} ({}) | baseline {name}: {b:.2}", row.said, name = row.metric)
                    }
                    (Some(v), Some(b)) => format!(
                        "{name}: {v:.2} ({}) Mean TPOT(ms): {:.2} | baseline {name}: {b:.2} Mean TPOT(ms): {:.2}",
                        row.said,
                        row.tpot_ms.unwrap_or(0.0),
                        row.baseline_tpot_ms.unwrap_or(0.0),
                        name = row.metric,
                    ),
                    _ => row.said.clone(),
                };
                let _ = writeln!(out, "  {:<40} {line}", row.config);
            }
            out.push('\n');
        }
    }

    match &doc.recommendation {
        Some(r) => {
            let _ = writeln!(out, "## Recommended\n");
            let _ = writeln!(out, "{}\n", r.serve_command);
            if !r.simulator_flags.is_empty() {
                let _ = writeln!(out, "{}\n", super::words::simulator_flags_left_out(&r.simulator_flags, ""));
            }
            let _ = writeln!(
                out,
                "({}: {} among the configurations that met the acceptance; a variant within noise of its baseline is \
                 not recommended)",
                r.config, r.why
            );
            if let Some(base) = &r.baseline {
                let _ = writeln!(out, "\nBefore ({base}) and after ({}):", r.config);
                for row in &r.table {
                    let _ = writeln!(
                        out,
                        "  {:<20} {} | {}",
                        row.profile,
                        row.baseline.as_deref().unwrap_or("no result"),
                        row.optimized.as_deref().unwrap_or("no result")
                    );
                }
            }
        }
        None => match super::words::no_capacity(doc) {
            Some(why) => {
                let _ = writeln!(out, "## No recommendation\n\n{why}.");
            }
            None => {
                let _ = writeln!(
                    out,
                    "## No recommendation\n\nNo configuration met the acceptance (a valid run and the success rate) \
                     on the primary profile."
                );
            }
        },
    }
    out
}

fn block(out: &mut String, b: &Block) {
    let _ = writeln!(out, "Profile: {}", b.profile);
    let repeats = b.succeeded();
    match (&b.pooled, &b.not_pooled) {
        (Some(s), _) => {
            if repeats > 1 {
                let _ = writeln!(out, "({repeats} repeats pooled)");
            }
            out.push('\n');
            out.push_str(&render_block_with(s, &b.sections()));
            intervals(out, b);
        }
        // Never a block of guessed percentiles: each repeat's own.
        (None, Some(why)) => {
            let _ = writeln!(out, "(the {repeats} repeats cannot be pooled: {why}; each is shown alone)");
            for r in b.repeats.iter().filter(|r| r.state == "succeeded") {
                if let Some(s) = &r.summary {
                    let _ = writeln!(out, "\nrepeat {}:\n", r.repeat);
                    out.push_str(&render_block(s, r.energy().as_ref()));
                }
            }
        }
        (None, None) => {
            let _ = writeln!(out, "\nno successful repeat");
        }
    }
    for r in b.repeats.iter().filter(|r| r.state == "succeeded") {
        if let Some(warm) = r.provenance.prefix_cache.as_deref().filter(|c| c.starts_with("warm")) {
            let _ = writeln!(out, "\nrepeat {} ran with its prefix cache {warm}", r.repeat);
        }
        if let Some(said) = &r.provenance.token_counts {
            let _ = writeln!(out, "\nrepeat {}: token counts disagree: {said}", r.repeat);
        }
        for t in &r.provenance.throttled {
            let _ = writeln!(out, "\nrepeat {}: GPU held down: {t}", r.repeat);
        }
    }
    for r in b.repeats.iter().filter(|r| r.state != "succeeded") {
        let state = match r.state.as_str() {
            "failed" | "cancelled" => r.state.as_str(),
            _ => "did not finish",
        };
        let _ = writeln!(out, "\nrepeat {} {state}: {}", r.repeat, r.error.as_deref().unwrap_or("no reason given"));
        if let Some(tail) = &r.log_tail {
            let _ = writeln!(out, "last engine log lines:\n{tail}");
        }
    }
    out.push('\n');
}

/// Each headline number's 95% confidence interval over the repeats.
fn intervals(out: &mut String, b: &Block) {
    if b.intervals.is_empty() {
        let _ = writeln!(out, "One repeat: no confidence intervals.");
        return;
    }
    let n = b.succeeded();
    if n == 1 {
        let _ = writeln!(out, "One repeat: 95% confidence intervals from its own requests (batch means):");
        for i in &b.intervals {
            let half = i.half_width.map_or("no interval".to_owned(), |h| format!("± {h:.2}"));
            let _ = writeln!(out, "  {:<34} {:.2} {half}", format!("{}:", i.metric), i.mean);
        }
        return;
    }
    let _ = writeln!(
        out,
        "95% confidence intervals of the {n} repeats' own values (Student's t, {} degrees of freedom):",
        n - 1
    );
    for i in &b.intervals {
        let _ = writeln!(out, "  {:<34} {:.2} ± {:.2}", format!("{}:", i.metric), i.mean, i.half_width.unwrap_or(0.0));
    }
}
