//! Tidy: ARCHITECTURE.md's invariants, enforced on the source tree (in the
//! manner of rust-analyzer's tidy test). Each check names the files that
//! break it and what to do.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Library and binary sources that may name the gRPC (prost) types; every
/// other module works on domain types. Each is named in ARCHITECTURE.md's
/// invariants too. Tests may use the wire types freely.
const MAY_NAME_PROST_TYPES: &[&str] = &[
    "proto/src/lib.rs",
    "core/src/convert.rs",
    "controller/src/convert.rs",
    "controller/src/service.rs",
    "cli/src/client.rs",
    "cli/src/cli.rs",
    "cli/src/cli/fleet.rs",
    "agent/src/session.rs",
    "agent/src/job.rs",
    "agent/src/identity.rs",
    "loadgen/src/sink.rs",
    "loadgen/src/sink/spill.rs",
];

/// The one file that may hold `unsafe` code: the NVML call nvml-wrapper does
/// not wrap.
const MAY_BE_UNSAFE: &[&str] = &["agent/src/nvml.rs"];

/// Crates the controller daemon must not link: the agent's container, GPU
/// and tokenizer stacks belong on GPU hosts.
const NOT_IN_THE_CONTROLLER: &[&str] =
    &["bollard", "nvml-wrapper", "tokenizers", "benchfleet-agent", "benchfleet-loadgen"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf()
}

/// Every `.rs` file under a crate's `src/`, relative to the root.
fn sources() -> Vec<String> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if name != "target" && !name.to_string_lossy().starts_with('.') {
                    walk(&path, root, out);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).expect("under the root").to_string_lossy().replace('\\', "/");
                if rel.split('/').nth(1) == Some("src") {
                    out.push(rel);
                }
            }
        }
    }
    let root = root();
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out.sort();
    assert!(out.len() > 20, "found only {} source files under {}", out.len(), root.display());
    out
}

/// The file's text without `//` comments and outside `#[cfg(test)]` modules
/// at the end (the project's convention: test modules come last).
fn code(path: &str) -> String {
    let text = std::fs::read_to_string(root().join(path)).expect("readable source");
    let text = text.split("\n#[cfg(test)]").next().unwrap_or_default();
    text.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

#[test]
fn only_the_boundary_modules_name_prost_types() {
    let offenders: Vec<String> = sources()
        .into_iter()
        .filter(|p| !MAY_NAME_PROST_TYPES.contains(&p.as_str()))
        .filter(|p| {
            let code = code(p);
            code.contains("benchfleet_proto") || code.contains("pb::") || code.contains("prost::")
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "these modules name gRPC types; convert to domain types in the crate's convert module instead: {offenders:?}"
    );
}

#[test]
fn unsafe_code_stays_in_its_one_module() {
    let offenders: Vec<String> = sources()
        .into_iter()
        .filter(|p| !MAY_BE_UNSAFE.contains(&p.as_str()))
        .filter(|p| {
            let code = code(p);
            code.contains("unsafe {") || code.contains("unsafe fn") || code.contains("allow(unsafe_code)")
        })
        .collect();
    assert!(offenders.is_empty(), "unsafe code outside {MAY_BE_UNSAFE:?}: {offenders:?}");
}

#[test]
fn the_boundary_lists_match_architecture_md() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let invariants = doc.split("## Invariants").nth(1).expect("ARCHITECTURE.md has an Invariants section");
    for path in MAY_NAME_PROST_TYPES.iter().chain(MAY_BE_UNSAFE) {
        assert!(root().join(path).is_file(), "{path} is listed in the tidy test but does not exist");
        let module = path.trim_end_matches(".rs").replace("/src/", "::").replace('/', "::").replace("::lib", "");
        assert!(
            invariants.contains(&format!("`{module}`")),
            "ARCHITECTURE.md's invariants do not name `{module}` ({path}), which the tidy test allows"
        );
    }
}

#[test]
fn every_module_says_what_it_is_for() {
    let undocumented: Vec<String> = sources()
        .into_iter()
        .filter(|p| {
            let text = std::fs::read_to_string(root().join(p)).unwrap_or_default();
            !text.trim_start().starts_with("//!")
        })
        .collect();
    assert!(undocumented.is_empty(), "modules without a `//!` line saying what they are for: {undocumented:?}");
}

/// What `krate` links (normal dependencies) of `names`.
fn linked<'a>(krate: &str, names: &[&'a str]) -> Vec<&'a str> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .current_dir(root())
        .args(["tree", "--offline", "-p", krate, "-e", "normal", "--prefix", "none"])
        .output()
        .expect("cargo tree runs");
    assert!(out.status.success(), "cargo tree -p {krate} failed: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    names.iter().copied().filter(|name| tree.lines().any(|l| l.split_whitespace().next() == Some(name))).collect()
}

#[test]
fn the_controller_daemon_links_no_agent_code() {
    let linked = linked("benchfleet-controller", NOT_IN_THE_CONTROLLER);
    assert!(linked.is_empty(), "benchfleet-controller links {linked:?}; the controller daemon must not");
}

/// Crates the study must not link: it has no store, no network, no threads
/// of its own, and knows nothing of the control plane.
const NOT_IN_THE_STUDY: &[&str] =
    &["tonic", "sled", "tokio", "benchfleet-proto", "benchfleet-controller", "benchfleet-agent", "benchfleet-loadgen"];

#[test]
fn the_study_links_no_store_and_no_network() {
    let linked = linked("benchfleet-study", NOT_IN_THE_STUDY);
    assert!(linked.is_empty(), "benchfleet-study links {linked:?}; the study must not (ARCHITECTURE.md, `study/`)");
}

#[test]
fn nothing_below_the_controller_imports_the_study() {
    for krate in ["benchfleet-proto", "benchfleet-core", "benchfleet-loadgen", "benchfleet-agent", "benchfleet-sim"] {
        let linked = linked(krate, &["benchfleet-study"]);
        assert!(linked.is_empty(), "{krate} links the study; only the controller and the CLI may");
    }
}
