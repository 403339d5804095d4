//! The three reference studies of `examples/` rehearsed end to end with
//! `benchfleet run --local` on the simulator, against what the published
//! reports chose.
//!
//! Each study is run time-scaled: every engine runs `--sim-speedup 4` and
//! every offered rate is 4 times the matrix's, so the whole study (arrivals,
//! queues, steps) runs 4 times faster and every ratio it decides on (an
//! effect, a latency against another) is the one the matrix as written
//! gives, in a quarter of its two hours. Faster, the client's own dispatch
//! lag (which does not scale) passes a tenth of the engine's TTFT and the
//! runs are marked INVALID. Not in CI (about 30 minutes, best alone on the
//! machine):
//!
//! ```text
//! cargo build --release && cargo test --release -p benchfleet-cli --test cli -- --ignored reference_studies
//! ```
//!
//! (`STUDY=latency` before it runs only the studies whose file names hold the word.)

use std::path::Path;
use std::process::Command;

/// How much faster than written the studies run.
const SCALE: f64 = 4.0;

/// A study: its matrix, the configuration the published report chose, and,
/// where the rehearsal does not choose it yet, why (`docs/sim-calibration.md`
/// has the rehearsals' figures).
struct Study {
    file: &'static str,
    published: &'static str,
    /// The serve command the report published, on one line.
    command: &'static str,
    outstanding: Option<&'static str>,
}

const STUDIES: [Study; 3] = [
    Study {
        file: "study-35b-a3b-h200-throughput.yaml",
        published: "vllm+fp8+prefix-caching+throughput-mode",
        command: "vllm serve Qwen/Qwen3.5-35B-A3B-FP8 --reasoning-parser=qwen3 --performance-mode=throughput \
                  --max-model-len=32768 --enable-prefix-caching",
        outstanding: Some(
            "chooses vllm+fp8, or vllm+fp8+throughput-mode (four rehearsals of fifteen), the report's choice at \
             every stage by its runs' durations (FP8 +8.6%, prefix caching -1.6%, throughput mode +1.4%), each \
             stage's effect within 3 points of them; the report's command also has prefix caching, which it kept by \
             guidellm's throughput lines (+4.1 points), whose spans leave out 2.4 s of one run and 5.8 s of the \
             other; throughput mode's gain on FP8 sits at the gate's 1% minimum effect (replayed, +0.2% on FP8 \
             with prefix caching; -2.2% to +2.0% in the rehearsals), where one run's order and clock decide",
        ),
    },
    Study {
        file: "study-9b-h100-throughput.yaml",
        published: "vllm+throughput-seqs-512",
        command: "vllm serve Qwen/Qwen3.5-9B --reasoning-parser=qwen3 --performance-mode=throughput \
                  --max-model-len=32768 --max-num-seqs=512",
        outstanding: Some(
            "chooses one of throughput mode's settings or none, within noise of the next best: the report's batch \
             limits lie within 3.0 points of each other (-1.1% to +1.9%), two of them that run the same batches \
             under the client's cap differ by 2.1% in it, and one run of the baseline's configuration spreads 1.9% \
             over eight on the wall clock; replayed, the model puts each setting within its band and throughput \
             mode's settings but 256 sequences within 0.8 points of each other (calibration rows 17-27), so which \
             of them wins one run is noise on both sides",
        ),
    },
    Study {
        file: "study-9b-h100-latency.yaml",
        published: "vllm+mtp+interactivity+language-model-only",
        command: "vllm serve Qwen/Qwen3.5-9B --reasoning-parser=qwen3 --max-model-len=32768 \
                  --speculative-config={\"method\":\"mtp\",\"num_speculative_tokens\":1} --language-model-only \
                  --performance-mode=interactivity",
        outstanding: None,
    },
];

/// `yaml` time-scaled: `--sim-speedup` on every engine, every rate times [`SCALE`].
fn time_scaled(yaml: &str) -> String {
    let scale_rate = |rate: &str| {
        let r: f64 = rate.trim().parse().expect("a rate");
        format!("{}", r * SCALE)
    };
    yaml.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let indent = &line[..line.len() - trimmed.len()];
            if let Some(rates) = trimmed.strip_prefix("rate: [") {
                let rates: Vec<String> = rates.trim_end_matches(']').split(',').map(scale_rate).collect();
                format!("{indent}rate: [{}]", rates.join(", "))
            } else if let Some(rate) = trimmed.strip_prefix("rate: ") {
                format!("{indent}rate: {}", scale_rate(rate))
            } else if let Some((sweep, rate)) =
                trimmed.strip_prefix("primary_profile: ").and_then(|p| p.rsplit_once("-r"))
            {
                // A rate sweep's points are named by their rates.
                format!("{indent}primary_profile: {sweep}-r{}", scale_rate(rate))
            } else if line.starts_with("  vllm: ") || line.starts_with("  sglang: ") {
                line.replacen("args: [", &format!("args: [--sim-speedup={SCALE}, "), 1)
            } else {
                line.to_owned()
            }
        })
        .map(|line| line + "\n")
        .collect()
}

/// The configuration a finished greedy run's report says it chose.
fn chosen(report: &str) -> Option<&str> {
    report.lines().find_map(|l| l.strip_prefix("Chosen: "))?.split(':').next()
}

/// The command a report recommends, its words sorted: its flags come in the order of the matrix's
/// variants, which need not be the published order.
fn recommended(report: &str) -> Option<Vec<&str>> {
    let mut lines = report.lines().skip_while(|l| *l != "## Recommended").skip(1);
    lines.find(|l| !l.is_empty()).map(words)
}

/// `command`'s words sorted, as [`recommended`] gives a report's.
fn words(command: &str) -> Vec<&str> {
    let mut words: Vec<&str> = command.split_whitespace().collect();
    words.sort_unstable();
    words
}

fn rehearse(study: &Study) -> String {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let dir = tempfile::tempdir().expect("tempdir");
    let benchfleet = Path::new(env!("CARGO_BIN_EXE_benchfleet"));
    let sim = benchfleet.with_file_name("benchfleet-sim");
    let stand_in = Command::new(&sim).args(["sharegpt-like", "1000", "42"]).output().expect("benchfleet-sim runs");
    assert!(stand_in.status.success(), "{stand_in:?}");
    std::fs::write(dir.path().join("ShareGPT_V3_unfiltered_cleaned_split.json"), stand_in.stdout).expect("write");
    let yaml = std::fs::read_to_string(examples.join(study.file)).expect("the study");
    let matrix = dir.path().join(study.file);
    std::fs::write(&matrix, time_scaled(&yaml)).expect("write");
    let out = Command::new(benchfleet)
        .args(["run", "--local", matrix.to_str().expect("utf-8 path")])
        .env("BENCHFLEET_DATA_DIR", dir.path().join("data"))
        .env_remove("BENCHFLEET_CONTROLLER")
        .output()
        .expect("benchfleet runs");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}: {}\n{report}", study.file, String::from_utf8_lossy(&out.stderr));
    report
}

#[test]
fn a_reports_recommended_command_is_read_flag_for_flag() {
    let report = "## Recommended\n\nvllm serve m --b=1 --a\n\n(vllm+a+b: the best)\n";
    assert_eq!(recommended(report), Some(words("vllm serve m --a --b=1")));
    assert_ne!(recommended(report), Some(words("vllm serve m --a --b=1 --sim-speedup=4")));
    assert_eq!(recommended("## Baseline\n"), None);
}

#[test]
fn time_scaling_speeds_the_engines_and_the_rates_and_nothing_else() {
    let yaml = "engines:\n  vllm: { image: i, args: [--a] }\nprofiles:\n  p:\n    rate: 1000\n    max_concurrency: 512\n  \
                q:\n    rate: [8, 1]\nprimary_profile: q-r8\n";
    assert_eq!(
        time_scaled(yaml),
        "engines:\n  vllm: { image: i, args: [--sim-speedup=4, --a] }\nprofiles:\n  p:\n    rate: 4000\n    \
         max_concurrency: 512\n  q:\n    rate: [32, 4]\nprimary_profile: q-r32\n"
    );
}

#[test]
#[ignore = "about 30 minutes of simulated studies: run alone, with --release"]
fn reference_studies_rehearse_to_the_published_choices() {
    let mut gaps = Vec::new();
    // `STUDY=latency` runs the studies whose file names hold it.
    let only = std::env::var("STUDY").unwrap_or_default();
    for study in STUDIES.iter().filter(|s| s.file.contains(&only)) {
        let report = rehearse(study);
        // Shown with --nocapture: the stages' figures are what docs/sim-calibration.md quotes.
        eprintln!("{}:\n{report}", study.file);
        let got = chosen(&report).unwrap_or_else(|| panic!("{}: no choice in\n{report}", study.file));
        match study.outstanding {
            None => {
                assert_eq!(got, study.published, "{}\n{report}", study.file);
                // The published command flag for flag: the simulator's flags are not in it.
                assert_eq!(recommended(&report), Some(words(study.command)), "{}\n{report}", study.file);
            }
            // An outstanding gap lies within the report's noise or its clock (docs/sim-calibration.md),
            // so a rehearsal may draw the report's choice: said, not failed.
            Some(why) if got == study.published => {
                gaps.push(format!("{}: chose as the report did this time (where it did not: {why})", study.file))
            }
            Some(why) => gaps.push(format!("{}: {got} where the report chose {} ({why})", study.file, study.published)),
        }
    }
    eprintln!("outstanding:\n{}", gaps.join("\n"));
}
