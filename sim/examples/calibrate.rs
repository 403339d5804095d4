//! Fits the simulator's coefficients to the published reference studies.
//!
//! ```text
//! cargo run --release -p benchfleet-sim --example calibrate               # fit on all three studies
//! cargo run --release -p benchfleet-sim --example calibrate -- 35b        # fit without the 35B study
//! ```
//!
//! It starts from `calibration::START` (`FROM=committed` starts from `profile::COEFFICIENTS`, to
//! go on from the committed fit; `FROM=held-out`, with a study, from its set in
//! `calibration::HOLD_OUT`, to go on from a committed fit without it), prints each improvement of
//! the loss, then the fitted coefficients (to copy into `sim/src/profile.rs`, or into
//! `calibration::HOLD_OUT` for a fit without a study) and every row's figures under them. `ROUNDS`
//! caps the rounds (default 40); `KNOBS=SGLang` fits only the knobs whose names hold the word.
//! The rows of `calibration::LEFT_OUT` are replayed but their own checks leave the loss (marked `-`
//! in the output); `LEAVE_OUT=0,29` leaves out those rows instead, `LEAVE_OUT=none` none.
//! `-- transformer` fits vLLM's fixed step on a transformer to the other runs marked `fitted`
//! (`calibration::fit_transformer_step`), the rest as committed, and prints it with the hybrid part
//! that keeps a hybrid model's step where the committed fit has it.
//! `-- breakdown` fits nothing: it prints where each row's engine time goes under the committed
//! coefficients, and its replay's duration, mean TTFT, latency and steps beside the report's duration.

use benchfleet_sim::{
    calibration::{self, Study},
    profile::COEFFICIENTS,
};

fn main() {
    if std::env::args().nth(1).as_deref() == Some("breakdown") {
        // Where each row's engine time goes under the committed coefficients, seconds, how full
        // its decode batches ran, and its replay's duration and steps.
        for (i, row) in calibration::rows().iter().enumerate() {
            let b = calibration::breakdown(row, &COEFFICIENTS);
            let p = b.parts;
            println!(
                "{i:>2} {:<8} overhead {:>6.1} tokens {:>6.1} extras {:>6.1} compute {:>6.1} memory {:>6.1} \
                 attention {:>6.1} batch {:>5.1} preempted {:>5}  {}",
                row.study.key(),
                p.overhead,
                p.tokens,
                p.extras,
                p.compute,
                p.memory,
                p.attention,
                b.mean_decode_batch,
                b.preemptions,
                row.args
            );
            // The replay's own clock beside the report's, and how many steps it took to get there.
            let published = row.duration.map_or("-".into(), |d| format!("{d:.2} s"));
            println!(
                "   duration {:.2} s (published {published}) mean TTFT {:.2} s latency {:.2} s steps {} prefilling {}",
                b.summary.duration, b.summary.mean_ttft, b.summary.mean_latency, b.steps, b.prefill_steps
            );
        }
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("transformer") {
        let step = calibration::fit_transformer_step(&COEFFICIENTS);
        let hybrid = COEFFICIENTS.vllm.step_overhead + COEFFICIENTS.vllm_hybrid_step_overhead - step;
        println!("vLLM step on a transformer {step:.6e} (was {:.6e})", COEFFICIENTS.vllm.step_overhead);
        println!("vLLM hybrid step overhead {hybrid:.6e} (was {:.6e})", COEFFICIENTS.vllm_hybrid_step_overhead);
        let mut fitted = COEFFICIENTS;
        (fitted.vllm.step_overhead, fitted.vllm_hybrid_step_overhead) = (step, hybrid);
        for run in calibration::other_runs() {
            let simulated = calibration::simulate_other(&run, &fitted);
            let mark = if run.fitted { " " } else { "*" };
            println!(
                "{mark} {:+6.1}% {} {} ({})",
                100.0 * (simulated / run.duration - 1.0),
                run.command,
                run.workload.name(),
                run.engine
            );
        }
        return;
    }
    let held_out: Option<Study> = std::env::args().nth(1).map(|key| {
        Study::ALL.into_iter().find(|s| s.key() == key).unwrap_or_else(|| {
            eprintln!("unknown study {key:?}: one of 35b, 9b, latency");
            std::process::exit(2);
        })
    });
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(40);
    let studies: Vec<Study> = Study::ALL.into_iter().filter(|s| Some(*s) != held_out).collect();
    let start = match std::env::var("FROM").as_deref() {
        Ok("committed") => COEFFICIENTS,
        // Goes on from the committed fit without the held-out study, which saw nothing of it.
        Ok("held-out") => {
            let Some(study) = held_out else {
                eprintln!("FROM=held-out needs the study to hold out: 35b, 9b or latency");
                std::process::exit(2);
            };
            calibration::HOLD_OUT.iter().find(|(s, _)| *s == study).map(|(_, c)| *c).expect("every study has a set")
        }
        Err(std::env::VarError::NotPresent) => calibration::START,
        Ok(other) => {
            eprintln!("unknown FROM={other:?}: committed or held-out (unset: calibration::START)");
            std::process::exit(2);
        }
        Err(e) => {
            eprintln!("FROM: {e}");
            std::process::exit(2);
        }
    };
    // `KNOBS=SGLang` fits only the knobs whose names hold the word, the others as they start.
    let only = std::env::var("KNOBS").unwrap_or_default();
    let fitted_knobs: Vec<_> = calibration::knobs().into_iter().filter(|k| k.name.contains(&only)).collect();
    if fitted_knobs.is_empty() {
        eprintln!("no knob's name holds KNOBS={only:?}");
        std::process::exit(2);
    }
    let rows = calibration::rows();
    // Rows replayed but not fitted to: the committed fit's, or `LEAVE_OUT=0,29`, or `none`.
    let left_out: Vec<usize> = match std::env::var("LEAVE_OUT") {
        Ok(none) if none == "none" => Vec::new(),
        Ok(list) => list
            .split(',')
            .map(|n| match n.trim().parse::<usize>() {
                Ok(i) if i < rows.len() => i,
                _ => {
                    eprintln!(
                        "LEAVE_OUT={list:?}: {n:?} is not a row's number (0 to {}); LEAVE_OUT=none leaves none out",
                        rows.len() - 1
                    );
                    std::process::exit(2);
                }
            })
            .collect(),
        Err(_) => calibration::LEFT_OUT.to_vec(),
    };
    let fitted = calibration::fit(start, &studies, &left_out, &fitted_knobs, rounds, |loss, c| {
        eprintln!("loss {loss:.3}: {c:?}")
    });
    let knobs = calibration::knobs();
    println!("{fitted:?}");
    for knob in &knobs {
        println!("{:<28} {:>12.6e} (was {:.6e})", knob.name, (knob.get)(&fitted), (knob.get)(&start));
    }
    for (i, (row, outcome)) in rows.iter().zip(calibration::evaluate(&rows, &fitted)).enumerate() {
        let mark = match (studies.contains(&row.study), left_out.contains(&i)) {
            (false, _) => "*",
            (true, true) => "-",
            (true, false) => " ",
        };
        println!(
            "{mark}{i:>2} {:<9} published {:>+7.1} simulated {:>+7.1} {}",
            row.study.key(),
            outcome.published_figure,
            outcome.simulated_figure,
            outcome.failure.unwrap_or_default()
        );
    }
}
