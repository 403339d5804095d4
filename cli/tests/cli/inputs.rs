//! The bad-input cases of `tests/inputs/`: each file goes through the
//! `benchfleet` binary as a user's would, and what it says must match the
//! case's verdict and words (`tests/inputs/matrix/CASES`). Every case runs
//! under a memory limit and must finish; none may panic.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A case that runs longer than this has hung (the slowest takes well under
/// a second).
const HUNG_S: u64 = 60;
/// Address space each case may use, in KiB (`ulimit -v`).
const MEMORY_KIB: u64 = 4 << 20;

fn inputs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/inputs")
}

struct Said {
    code: Option<i32>,
    output: String,
}

/// Runs `benchfleet ARGS` under the memory limit, killing it if it hangs.
fn benchfleet(args: &[&str]) -> Said {
    let data = tempfile::tempdir().expect("tempdir");
    let out = data.path().join("out");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {MEMORY_KIB} && exec \"$0\" \"$@\" > '{}' 2>&1", out.display()))
        .arg(env!("CARGO_BIN_EXE_benchfleet"))
        .args(args)
        .env("BENCHFLEET_DATA_DIR", data.path())
        .env_remove("BENCHFLEET_CONTROLLER")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .spawn()
        .expect("benchfleet starts");
    let status = crate::exit_within(&mut child, HUNG_S)
        .unwrap_or_else(|| panic!("benchfleet {args:?} did not finish in {HUNG_S} s"));
    Said { code: status.code(), output: std::fs::read_to_string(&out).unwrap_or_default() }
}

fn check(case: &str, said: &Said, verdict: &str, words: &[&str]) -> Result<(), String> {
    let code = match verdict {
        "ok" | "warn" => 0,
        "error" => 2,
        other => return Err(format!("{case}: unknown verdict '{other}'")),
    };
    let mut wrong = Vec::new();
    if said.code != Some(code) {
        wrong.push(format!("exit {:?}, expected {code}", said.code));
    }
    if said.output.contains("panicked") {
        wrong.push("it panicked".to_owned());
    }
    if (verdict == "warn") != said.output.contains("warning:") {
        wrong.push(format!("a warning {}", if verdict == "warn" { "was expected" } else { "was not expected" }));
    }
    for w in words {
        if !said.output.contains(w) {
            wrong.push(format!("no '{w}'"));
        }
    }
    if wrong.is_empty() { Ok(()) } else { Err(format!("{case}: {}\n  said: {}", wrong.join("; "), said.output.trim())) }
}

#[test]
fn every_matrix_case_gets_its_verdict() {
    let dir = inputs().join("matrix");
    let cases = std::fs::read_to_string(dir.join("CASES")).expect("CASES");
    let mut failures = Vec::new();
    let mut listed = Vec::new();
    for line in cases.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (file, rest) = line.split_once(char::is_whitespace).expect("a file and a verdict");
        let (verdict, words) = rest.trim().split_once(char::is_whitespace).unwrap_or((rest.trim(), ""));
        let words: Vec<&str> = words.split(" | ").map(str::trim).filter(|w| !w.is_empty()).collect();
        let path = dir.join(file);
        assert!(path.exists(), "CASES names {file}, which is not in {}", dir.display());
        listed.push(file.to_owned());
        let said = benchfleet(&["validate", path.to_str().expect("utf-8 path")]);
        if let Err(e) = check(file, &said, verdict, &words) {
            failures.push(e);
        }
    }
    // Every file in the directory is a case.
    for entry in std::fs::read_dir(&dir).expect("the cases' directory") {
        let entry = entry.expect("entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_file() && name != "CASES" && !listed.contains(&name) {
            failures.push(format!("{name} is not listed in CASES"));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases wrong:\n{}", failures.len(), listed.len(), failures.join("\n"));
}

#[test]
fn a_matrix_over_the_size_limit_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("large.yaml");
    let mut yaml = std::fs::read_to_string(inputs().join("matrix/good.yaml")).expect("good.yaml");
    while yaml.len() <= 2 << 20 {
        yaml.push_str("# padding, padding, padding, padding, padding, padding, padding\n");
    }
    std::fs::write(&path, &yaml).expect("write");
    let said = benchfleet(&["validate", path.to_str().expect("utf-8 path")]);
    if let Err(e) = check("large.yaml", &said, "error", &["large.yaml: is 2097", "at most 1048576 bytes (1 MiB)"]) {
        panic!("{e}");
    }
}

#[test]
fn large_alias_expansions_are_refused_before_anything_is_built() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = std::fs::read_to_string(inputs().join("matrix/good.yaml")).expect("good.yaml");
    let ones = |n: usize| vec!["1"; n].join(",");
    // A bomb behind enough plain values that the YAML crate's own limit
    // (100 alias jumps per event) would let it expand a thousandfold.
    let mut bomb = format!("{good}pad: [{}]\nbomb:\n  l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n", ones(150_000));
    for i in 1..10 {
        bomb.push_str(&format!("  l{i}: &l{i} [{}]\n", vec![format!("*l{}", i - 1); 10].join(", ")));
    }
    // One large anchor used a hundred times.
    let fat = format!("{good}big: &big [{}]\nuses: [{}]\n", ones(100_000), vec!["*big"; 100].join(", "));
    for (name, yaml, line) in [("bomb.yaml", bomb, ":11:"), ("fat.yaml", fat, ":9:")] {
        let path = dir.path().join(name);
        std::fs::write(&path, yaml).expect("write");
        let said = benchfleet(&["validate", path.to_str().expect("utf-8 path")]);
        if let Err(e) = check(name, &said, "error", &[line, "expands to more than 1000000 values through its aliases"])
        {
            panic!("{e}");
        }
    }
}
