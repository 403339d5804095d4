//! deploy/systemd/: both units pass `systemd-analyze verify` without a
//! single warning, with their Exec lines pointed at the binaries built here
//! (verify checks that each command is an executable); and what the daemons'
//! stopping needs of them holds: the agent's unit waits out its leave grace
//! and sends SIGTERM to the agent alone. scripts/test installs Debian's
//! systemd, whose `systemd-analyze` needs no running systemd.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::faults::bin;

const UNITS: [&str; 2] = ["benchfleet-controller.service", "benchfleet-agent.service"];

fn unit_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd")
}

fn read_unit(name: &str) -> String {
    let path = unit_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `systemd-analyze verify` on these files. Its messages go to stderr
/// whatever the environment says (not to a journal, at no other level).
fn verify(files: &[PathBuf]) -> Output {
    let mut cmd = Command::new("systemd-analyze");
    cmd.arg("verify").args(files).env("SYSTEMD_LOG_TARGET", "console").env_remove("SYSTEMD_LOG_LEVEL");
    match cmd.output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "systemd-analyze is not installed; scripts/test installs Debian's systemd (apt-get install -y systemd)"
        ),
        Err(e) => panic!("cannot run systemd-analyze: {e}"),
    }
}

/// The unit's text with every `/usr/local/bin/NAME` replaced by the binary
/// built here; fails unless its ExecStart names one.
fn pointed_at_built_binaries(name: &str) -> String {
    let mut text = read_unit(name);
    for binary in ["benchfleet-controller", "benchfleet-agent"] {
        text = text.replace(&format!("/usr/local/bin/{binary}"), &bin(binary).display().to_string());
    }
    let exec = text.lines().find(|l| l.starts_with("ExecStart=")).unwrap_or_else(|| panic!("{name}: no ExecStart"));
    assert!(!exec.contains("/usr/local/bin/"), "{name}: an ExecStart this test cannot point at a built binary: {exec}");
    text
}

/// The value of `key=` in the unit (the last one, as systemd reads it).
fn setting<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().rev().find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

fn seconds(value: &str) -> u64 {
    let number = value.trim_end_matches('s');
    number.parse().unwrap_or_else(|_| panic!("{value}: expected seconds (N or Ns)"))
}

/// A default from `--help` (`[default: N]` on the line after `--flag`).
fn help_default(binary: &str, sub: &str, flag: &str) -> u64 {
    let out = Command::new(bin(binary)).args([sub, "--help"]).output().expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let at = text.find(&format!("--{flag} ")).unwrap_or_else(|| panic!("{binary} {sub} --help lacks --{flag}"));
    let rest = &text[at..];
    let start = rest.find("[default: ").unwrap_or_else(|| panic!("--{flag} has no default")) + "[default: ".len();
    let end = start + rest[start..].find(']').expect("]");
    rest[start..end].parse().unwrap_or_else(|_| panic!("--{flag}: default {} is not a number", &rest[start..end]))
}

#[test]
fn both_units_verify_without_a_warning() {
    let tmp = tempfile::tempdir().expect("tmp");
    let files: Vec<PathBuf> = UNITS
        .iter()
        .map(|name| {
            let path = tmp.path().join(name);
            std::fs::write(&path, pointed_at_built_binaries(name)).expect("unit written");
            path
        })
        .collect();
    let out = verify(&files);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "systemd-analyze verify failed ({}):\n{stderr}{stdout}", out.status);
    assert!(stderr.trim().is_empty() && stdout.trim().is_empty(), "systemd-analyze verify warned:\n{stderr}{stdout}");

    // The same check finds a mistake here: a key systemd does not know is a
    // warning on stderr (verify still exits 0).
    let broken = tmp.path().join("broken").join(UNITS[0]);
    std::fs::create_dir_all(broken.parent().expect("dir")).expect("dir");
    let text = pointed_at_built_binaries(UNITS[0]).replace("Restart=on-failure", "Restart=on-failure\nRestartt=always");
    std::fs::write(&broken, text).expect("unit written");
    let out = verify(&[broken]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Unknown key 'Restartt'"), "a misspelt key is not reported: {stderr}");
}

#[test]
fn the_units_notify_restart_and_stop_as_the_daemons_need() {
    for name in UNITS {
        let text = read_unit(name);
        assert_eq!(setting(&text, "Type"), Some("notify"), "{name}: the daemons send READY=1 and STOPPING=1");
        assert_eq!(setting(&text, "Restart"), Some("on-failure"), "{name}");
        assert_eq!(setting(&text, "ExecReload"), None, "{name}: neither daemon reloads");
        let config = if name.contains("controller") { "controller.toml" } else { "agent.toml" };
        let exec = setting(&text, "ExecStart").unwrap_or_default();
        assert!(exec.ends_with(&format!("--config /etc/benchfleet/{config}")), "{name}: {exec}");
    }

    let controller = read_unit(UNITS[0]);
    assert_eq!(setting(&controller, "DynamicUser"), Some("yes"));
    assert_eq!(setting(&controller, "StateDirectory"), Some("benchfleet"));
    assert_eq!(setting(&controller, "Environment=BENCHFLEET_DATA_DIR"), Some("/var/lib/benchfleet"));

    // SIGTERM to the agent alone: it stops its engines itself, after its
    // running groups had their grace and the engines theirs.
    let agent = read_unit(UNITS[1]);
    assert_eq!(setting(&agent, "KillMode"), Some("mixed"));
    let stop = seconds(setting(&agent, "TimeoutStopSec").expect("the agent's unit sets TimeoutStopSec"));
    let leave = help_default("benchfleet-agent", "run", "leave-grace-s");
    let engine = help_default("benchfleet-agent", "run", "stop-grace-s");
    assert!(
        stop > leave + engine,
        "TimeoutStopSec={stop} s, not above --leave-grace-s {leave} + --stop-grace-s {engine}"
    );
    // Docker is wanted, never required: the unit starts without it.
    assert!(setting(&agent, "Wants").is_some_and(|w| w.contains("docker.service")));
    assert!(setting(&agent, "After").is_some_and(|w| w.contains("docker.service")));
    assert!(!agent.lines().any(|l| l.starts_with("Requires=") || l.starts_with("BindsTo=")), "{agent}");
    assert_eq!(setting(&agent, "StateDirectory"), Some("benchfleet-agent"));
}
