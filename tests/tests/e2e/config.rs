//! The daemons' one configuration precedence, as an operator meets it: a
//! flag beats its variable, which beats the `--config` file, which beats the
//! default; a misspelt key stops the daemon naming the key and the file;
//! `--print-config` shows where each value came from and never a secret;
//! and the example files under deploy/ list exactly the daemons' flags.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::faults::bin;

/// Runs a daemon with only `env` in its environment.
fn run(daemon: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(bin(daemon))
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {daemon}: {e}"))
}

/// A printed value and its source comment.
#[derive(Debug, PartialEq)]
struct Printed {
    value: Option<String>,
    source: String,
}

/// `--print-config`'s top-level keys.
fn printed(out: &Output) -> BTreeMap<String, Printed> {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "--print-config failed: {}{text}", String::from_utf8_lossy(&out.stderr));
    let mut keys = BTreeMap::new();
    for line in text.lines().take_while(|l| !l.starts_with('[')) {
        if let Some(key) = line.strip_prefix("# ").and_then(|l| l.strip_suffix(" (unset)")) {
            keys.insert(key.to_owned(), Printed { value: None, source: "unset".into() });
        } else if let Some((assignment, source)) = line.split_once("  # ")
            && let Some((key, value)) = assignment.split_once(" = ")
        {
            keys.insert(key.to_owned(), Printed { value: Some(value.to_owned()), source: source.to_owned() });
        }
    }
    keys
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").join(name)
}

/// The keys an example file lists, commented, above its first table.
fn example_keys(text: &str) -> Vec<String> {
    text.lines()
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| l.strip_prefix("# ")?.split_once(" = ").map(|(key, _)| key))
        .filter(|key| key.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_flag_beats_its_variable_which_beats_the_file_which_beats_the_default() {
    let tmp = tempfile::tempdir().expect("tmp");
    let file = tmp.path().join("controller.toml");
    std::fs::write(
        &file,
        "listen = \"127.0.0.1:1111\"\nmetrics_listen = \"127.0.0.1:2222\"\nlease_ttl_ms = 20000\nattempt_cap = 5\n\
         insecure = true\n",
    )
    .expect("write");
    let path = file.to_str().expect("utf-8");
    let out = run(
        "benchfleet-controller",
        &["--config", path, "--metrics-listen", "127.0.0.1:5555", "--print-config"],
        &[("BENCHFLEET_LISTEN", "127.0.0.1:3333"), ("BENCHFLEET_METRICS_LISTEN", "127.0.0.1:4444")],
    );
    let keys = printed(&out);
    let is = |key: &str, value: &str, source: &str| {
        assert_eq!(keys[key], Printed { value: Some(value.into()), source: source.into() }, "{key}");
    };
    is("metrics_listen", "\"127.0.0.1:5555\"", "from the command line");
    is("listen", "\"127.0.0.1:3333\"", "from the environment (BENCHFLEET_LISTEN)");
    is("lease_ttl_ms", "20000", &format!("from {path}"));
    is("attempt_cap", "5", &format!("from {path}"));
    is("insecure", "true", &format!("from {path}"));
    is("heartbeat_interval_ms", "1000", "default");
    assert_eq!(keys["advertise_url"].source, "unset");
    // The file named by the variable instead of the flag.
    let out = run("benchfleet-controller", &["--print-config"], &[("BENCHFLEET_CONTROLLER_CONFIG", path)]);
    assert_eq!(printed(&out)["listen"].value.as_deref(), Some("\"127.0.0.1:1111\""));
}

#[test]
fn a_misspelt_key_stops_each_daemon_naming_the_key_and_the_file_before_anything_is_touched() {
    let tmp = tempfile::tempdir().expect("tmp");
    let data = tmp.path().join("data");
    let file = tmp.path().join("controller.toml");
    let data_line = format!("data_dir = \"{}\"\n", data.display());
    std::fs::write(&file, format!("{data_line}lease_tll_ms = 20000\n")).expect("write");
    let out = run("benchfleet-controller", &["--config", file.to_str().expect("utf-8")], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("{}: unknown key `lease_tll_ms` (did you mean `lease_ttl_ms`?)", file.display())));
    assert!(!data.exists(), "nothing is created when the configuration is wrong");
    // A value of the wrong kind names its key too.
    std::fs::write(&file, format!("{data_line}attempt_cap = \"three\"\n")).expect("write");
    let out = run("benchfleet-controller", &["--config", file.to_str().expect("utf-8")], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("{}: key `attempt_cap`: invalid value 'three'", file.display())), "{stderr}");

    let work = tmp.path().join("work");
    let agent = tmp.path().join("agent.toml");
    let work_line = format!("work_dir = \"{}\"\nsim_gpus = \"H200x1\"\n", work.display());
    for (text, key) in [
        (
            format!("{work_line}contoller = \"https://ctl:7070\"\n"),
            "unknown key `contoller` (did you mean `controller`?)",
        ),
        (format!("{work_line}[gpus]\nallow_mig = true\n"), "unknown key `gpus` (did you mean `gpu`?)"),
        (format!("{work_line}[engines]\nproces = true\n"), "unknown field `proces`"),
    ] {
        std::fs::write(&agent, text).expect("write");
        let out = run("benchfleet-agent", &["--config", agent.to_str().expect("utf-8")], &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(key) && stderr.contains(&agent.display().to_string()), "{key}: {stderr}");
        assert!(!work.exists(), "{key}: nothing is created when the configuration is wrong");
    }
}

#[test]
fn print_config_never_shows_a_secret() {
    let tmp = tempfile::tempdir().expect("tmp");
    let file = tmp.path().join("agent.toml");
    std::fs::write(&file, "hf_token = \"hf_fromthefile\"\nsim_gpus = \"H200x8\"\n").expect("write");
    let path = file.to_str().expect("utf-8");
    for env in [&[][..], &[("HF_TOKEN", "hf_fromtheenvironment")][..]] {
        let out = run("benchfleet-agent", &["--config", path, "--print-config"], env);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains("hf_from"), "{text}");
        assert_eq!(printed(&out)["hf_token"].value.as_deref(), Some("\"***\""), "{text}");
    }
    let out = run("benchfleet-agent", &["--config", path, "--hf-token", "hf_fromtheflag", "--print-config"], &[]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("hf_from"));
}

#[test]
fn the_example_files_list_exactly_the_flags_and_parse_with_every_key_set() {
    for (daemon, name) in
        [("benchfleet-controller", "controller.example.toml"), ("benchfleet-agent", "agent.example.toml")]
    {
        let text = std::fs::read_to_string(example(name)).expect("the example");
        let mut listed = example_keys(&text);
        listed.sort();
        let flags: Vec<String> = printed(&run(daemon, &["--print-config"], &[])).into_keys().collect();
        assert_eq!(listed, flags, "{name} must list exactly {daemon}'s flags");
        // As shipped (every key commented), and with every key set.
        let out = run(daemon, &["--config", example(name).to_str().expect("utf-8"), "--print-config"], &[]);
        assert!(printed(&out).values().all(|p| p.source == "default" || p.source == "unset"), "{name}");
        let tmp = tempfile::tempdir().expect("tmp");
        let set = tmp.path().join(name);
        let uncommented: String = text
            .lines()
            .map(|l| match l.strip_prefix("# ") {
                Some(rest) if example_keys(l).len() == 1 && !rest.contains("(unset)") => rest,
                _ => l,
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&set, uncommented).expect("write");
        let out = run(daemon, &["--config", set.to_str().expect("utf-8"), "--print-config"], &[]);
        let from = format!("from {}", set.display());
        for (key, p) in printed(&out) {
            assert_eq!(p.source, from, "{name}: {key}");
        }
    }
}
