//! Every flag a deployment file gives a benchfleet binary exists: the
//! systemd units' Exec lines, the compose files' commands, entrypoints and
//! health checks, and the Kubernetes containers' command and args are read
//! and each `--flag` is looked up in the `--help` of the binary it goes to,
//! or of its subcommand when one is named (one level: a flag before the
//! subcommand is the binary's, after it the subcommand's).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::faults::bin;

const BINARIES: [&str; 4] = ["benchfleet", "benchfleet-controller", "benchfleet-agent", "benchfleet-loadgen"];

/// A binary's long flags and subcommands, from its `--help`.
#[derive(Debug, Default)]
struct Help {
    flags: BTreeSet<String>,
    commands: BTreeSet<String>,
}

fn help(binary: &str, sub: Option<&str>) -> Help {
    let mut cmd = std::process::Command::new(bin(binary));
    cmd.args(sub).arg("--help");
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {binary}: {e}"));
    assert!(out.status.success(), "{binary} {sub:?} --help failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut help = Help::default();
    let mut in_commands = false;
    for line in text.lines() {
        if line.ends_with(':') && !line.starts_with(' ') {
            in_commands = line == "Commands:";
            continue;
        }
        let trimmed = line.trim_start();
        if in_commands
            && line.starts_with("  ")
            && !line.starts_with("   ")
            && let Some(name) = trimmed.split_whitespace().next()
        {
            help.commands.insert(name.to_owned());
        }
        // An option line: `  -s, --long <V>` or `      --long`.
        let option = trimmed.strip_prefix('-').and_then(|r| r.chars().next()).is_some() && line.starts_with("  ");
        if option {
            for word in trimmed.split([' ', ',']) {
                if let Some(long) = word.strip_prefix("--") {
                    let long = long.split(['=', '[', '<']).next().unwrap_or_default();
                    if !long.is_empty() {
                        help.flags.insert(long.to_owned());
                    }
                }
                if !word.starts_with('-') && !word.is_empty() {
                    break;
                }
            }
        }
    }
    help
}

/// One command line a deployment file gives a binary.
#[derive(Debug)]
struct Given {
    file: PathBuf,
    what: String,
    binary: String,
    argv: Vec<String>,
}

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn files(dir: &str, ext: &[&str]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(deploy().join(dir))
        .unwrap_or_else(|e| panic!("deploy/{dir}: {e}"))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().and_then(|e| e.to_str()).is_some_and(|e| ext.contains(&e)))
        .collect();
    out.sort();
    out
}

/// The benchfleet binary a word names (a path or a bare name), if any.
fn binary_of(word: &str) -> Option<String> {
    let base = word.rsplit('/').next()?;
    BINARIES.contains(&base).then(|| base.to_owned())
}

/// The binary an image runs: its repository's last component, without tag.
fn image_binary(image: &str) -> Option<String> {
    let repo = image.rsplit('/').next()?.split([':', '@']).next()?;
    binary_of(repo)
}

/// A command from an entrypoint-less image (`args`) or a full one.
fn given(file: &Path, what: String, image: Option<&str>, argv: Vec<String>) -> Option<Given> {
    let (binary, argv) = match argv.first().and_then(|w| binary_of(w)) {
        Some(b) => (b, argv[1..].to_vec()),
        None => (image.and_then(image_binary)?, argv),
    };
    Some(Given { file: file.to_owned(), what, binary, argv })
}

fn strings(v: Option<&serde_json::Value>) -> Vec<String> {
    match v {
        Some(serde_json::Value::Array(items)) => items.iter().filter_map(|i| i.as_str().map(str::to_owned)).collect(),
        Some(serde_json::Value::String(s)) => s.split_whitespace().map(str::to_owned).collect(),
        _ => Vec::new(),
    }
}

fn systemd() -> Vec<Given> {
    let mut out = Vec::new();
    for file in files("systemd", &["service"]) {
        let text = std::fs::read_to_string(&file).expect("unit");
        for line in text.lines().filter(|l| l.starts_with("Exec")) {
            let Some((key, command)) = line.split_once('=') else { continue };
            let argv: Vec<String> =
                command.trim_start_matches(['-', '@', '+', '!', ':']).split_whitespace().map(str::to_owned).collect();
            out.extend(given(&file, key.to_owned(), None, argv));
        }
    }
    out
}

fn yaml_documents(file: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(file).expect("yaml");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap_or_else(|e| panic!("{}: not YAML: {e}", file.display())))
        .collect()
}

fn compose() -> Vec<Given> {
    let mut out = Vec::new();
    for file in files("compose", &["yaml", "yml"]) {
        for doc in yaml_documents(&file) {
            let Some(services) = doc.get("services").and_then(|s| s.as_object()) else { continue };
            for (name, service) in services {
                let image = service.get("image").and_then(|i| i.as_str());
                let entrypoint = strings(service.get("entrypoint"));
                let mut command = entrypoint.clone();
                command.extend(strings(service.get("command")));
                out.extend(given(&file, format!("service {name}: command"), image, command));
                let mut test = strings(service.get("healthcheck").and_then(|h| h.get("test")));
                if test.first().is_some_and(|t| t == "CMD" || t == "CMD-SHELL") {
                    test.remove(0);
                }
                // A shell check's words after the binary are its argv.
                if let Some(at) = test.iter().position(|w| binary_of(w).is_some()) {
                    out.extend(given(&file, format!("service {name}: healthcheck"), None, test[at..].to_vec()));
                }
            }
        }
    }
    out
}

fn kubernetes() -> Vec<Given> {
    let mut out = Vec::new();
    for file in files("k8s", &["yaml", "yml"]) {
        for doc in yaml_documents(&file) {
            let spec = doc.pointer("/spec/template/spec").or_else(|| doc.pointer("/spec")).cloned();
            let Some(spec) = spec else { continue };
            for list in ["initContainers", "containers"] {
                for c in spec.get(list).and_then(|c| c.as_array()).into_iter().flatten() {
                    let name = c.get("name").and_then(|n| n.as_str()).unwrap_or("?");
                    let image = c.get("image").and_then(|i| i.as_str());
                    let mut argv = strings(c.get("command"));
                    argv.extend(strings(c.get("args")));
                    out.extend(given(&file, format!("{list} {name}"), image, argv));
                    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
                        let exec = strings(c.get(probe).and_then(|p| p.pointer("/exec/command")));
                        out.extend(given(&file, format!("{list} {name}: {probe}"), None, exec));
                    }
                }
            }
        }
    }
    out
}

/// The flags of `g` that its binary (or subcommand) lacks.
fn unknown(g: &Given, helps: &mut BTreeMap<(String, Option<String>), Help>) -> Vec<String> {
    let commands = {
        let key = (g.binary.clone(), None);
        helps.entry(key).or_insert_with(|| help(&g.binary, None)).commands.clone()
    };
    let mut flags = |sub: Option<&str>| -> BTreeSet<String> {
        let key = (g.binary.clone(), sub.map(str::to_owned));
        helps.entry(key).or_insert_with(|| help(&g.binary, sub)).flags.clone()
    };
    let sub = g.argv.iter().position(|w| commands.contains(w));
    let mut missing = Vec::new();
    for (i, word) in g.argv.iter().enumerate() {
        let Some(flag) = word.strip_prefix("--") else { continue };
        let flag = flag.split('=').next().unwrap_or_default();
        let (owner, known) = match sub {
            Some(at) if i > at => (format!("{} {}", g.binary, g.argv[at]), flags(Some(&g.argv[at]))),
            _ => (g.binary.clone(), flags(None)),
        };
        if !known.contains(flag) {
            missing.push(format!("--{flag} (not in `{owner} --help`)"));
        }
    }
    missing
}

#[test]
fn every_flag_a_deployment_file_gives_is_in_its_binarys_help() {
    let mut helps = BTreeMap::new();
    let all: Vec<Given> = systemd().into_iter().chain(compose()).chain(kubernetes()).collect();
    for (dir, at_least) in [("systemd", 2), ("compose", 5), ("k8s", 3)] {
        let n = all.iter().filter(|g| g.file.parent().is_some_and(|p| p.ends_with(dir))).count();
        assert!(n >= at_least, "deploy/{dir}: {n} command lines found, expected {at_least} or more");
    }
    let mut wrong = Vec::new();
    for g in &all {
        for m in unknown(g, &mut helps) {
            wrong.push(format!("{} ({}, {}): {m}", g.file.display(), g.what, g.binary));
        }
    }
    assert!(wrong.is_empty(), "flags the binaries do not have:\n{}", wrong.join("\n"));
}

#[test]
fn a_flag_the_binary_lacks_is_caught() {
    let mut helps = BTreeMap::new();
    let argv = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
    let g = |argv| Given { file: PathBuf::from("x"), what: "test".into(), binary: "benchfleet-agent".into(), argv };
    assert!(unknown(&g(argv(&["run", "--work-dir", "/w", "--metrics-listen=0.0.0.0:7072"])), &mut helps).is_empty());
    assert_eq!(
        unknown(&g(argv(&["join", "--sim-gpus", "H200x8"])), &mut helps),
        ["--sim-gpus (not in `benchfleet-agent join --help`)"]
    );
    assert_eq!(
        unknown(&g(argv(&["--metrics-listn", "x"])), &mut helps),
        ["--metrics-listn (not in `benchfleet-agent --help`)"]
    );
    // Image names and paths both find the binary.
    assert_eq!(
        image_binary("registry.lab:5000/benchfleet/benchfleet-agent:0.1.0").as_deref(),
        Some("benchfleet-agent")
    );
    assert_eq!(binary_of("/usr/local/bin/benchfleet-controller").as_deref(), Some("benchfleet-controller"));
}
