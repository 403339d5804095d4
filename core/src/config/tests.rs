//! `core::config` against a daemon-like command: the precedence, the errors
//! that name key and file, and the printed merge.

use super::*;
use clap::Parser;

/// A daemon's flags, as the controller and agent spell theirs.
#[derive(Parser, Debug)]
#[command(name = "daemon")]
struct Daemon {
    #[arg(long, env = "BF_TEST_CONFIG")]
    config: Option<PathBuf>,
    #[arg(long)]
    print_config: bool,
    #[arg(long, env = "BF_TEST_LISTEN", default_value = "127.0.0.1:7070")]
    listen: String,
    #[arg(long, default_value_t = 10_000)]
    lease_ttl_ms: u64,
    #[arg(long)]
    insecure: bool,
    #[arg(long, env = "BF_TEST_TOKEN", hide_env_values = true)]
    hf_token: Option<String>,
    #[arg(long)]
    name: Option<String>,
}

const SPEC: Spec<'static> = Spec { config: "config", print: "print_config", daemon: None, tables: &["gpu"] };

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    std::io::Write::write_all(&mut f, text.as_bytes()).expect("write");
    f
}

fn parse(args: &[&str]) -> Result<(Daemon, Layered), ConfigError> {
    parse_from::<Daemon, _, _>(&SPEC, std::iter::once("daemon").chain(args.iter().copied()))
}

#[test]
fn the_file_fills_what_neither_flag_nor_default_overrides() {
    let f = file("lease_ttl_ms = 20000\ninsecure = true\nname = \"gpu-07\"\n[gpu]\nrequire_model = [\"H200\"]\n");
    let path = f.path().to_str().expect("utf-8");
    let (d, layered) = parse(&["--config", path]).expect("parses");
    assert_eq!((d.lease_ttl_ms, d.insecure, d.name.as_deref()), (20_000, true, Some("gpu-07")));
    assert_eq!(d.listen, "127.0.0.1:7070");
    let source = |key: &str| layered.entries.iter().find(|e| e.key == key).expect("key").source.clone();
    assert_eq!(source("lease_ttl_ms"), Source::File(f.path().to_owned()));
    assert_eq!(source("listen"), Source::Default);
    assert_eq!(source("hf_token"), Source::Unset);
    assert!(layered.tables.contains_key("gpu"));
    let printed = layered.render();
    assert!(
        printed.contains("\n# hf_token (unset)\n") && printed.contains("[gpu]\nrequire_model = [\"H200\"]"),
        "{printed}"
    );
}

#[test]
fn a_flag_beats_the_file_and_false_in_the_file_leaves_a_switch_off() {
    let f = file("lease_ttl_ms = 20000\ninsecure = false\n");
    let path = f.path().to_str().expect("utf-8");
    let (d, layered) = parse(&["--lease-ttl-ms", "5000", "--config", path]).expect("parses");
    assert_eq!((d.lease_ttl_ms, d.insecure), (5000, false));
    let e = layered.entries.iter().find(|e| e.key == "lease_ttl_ms").expect("key");
    assert_eq!(e.source, Source::Flag);
}

#[test]
fn misspelt_keys_and_wrong_values_name_the_key_and_the_file() {
    let f = file("lease_tll_ms = 20000\n");
    let e = parse(&["--config", f.path().to_str().expect("utf-8")]).expect_err("unknown key").to_string();
    assert!(e.contains("unknown key `lease_tll_ms`") && e.contains("did you mean `lease_ttl_ms`"), "{e}");
    assert!(e.contains(&f.path().display().to_string()), "{e}");

    for (text, key, says) in [
        ("lease_ttl_ms = \"soon\"\n", "lease_ttl_ms", "invalid"),
        ("insecure = \"yes\"\n", "insecure", "true or false"),
        ("name = [\"a\", \"b\"]\n", "name", "one value"),
        ("gpu = 3\n", "gpu", "table"),
        ("config = \"other.toml\"\n", "config", "unknown key"),
    ] {
        let f = file(text);
        let e = parse(&["--config", f.path().to_str().expect("utf-8")]).expect_err(text).to_string();
        assert!(e.contains(&format!("`{key}`")) && e.contains(says), "{text}: {e}");
    }
    let f = file("listen = \n");
    let e = parse(&["--config", f.path().to_str().expect("utf-8")]).expect_err("syntax").to_string();
    assert!(e.contains("is not TOML") && e.contains("line 1"), "{e}");
    let e = parse(&["--config", "/nonexistent/benchfleet.toml"]).expect_err("missing").to_string();
    assert!(e.contains("cannot read the config file /nonexistent/benchfleet.toml"), "{e}");
}

#[test]
fn the_printed_configuration_reads_back_and_hides_secrets() {
    let f = file("lease_ttl_ms = 20000\nhf_token = \"hf_abcdef\"\nname = \"a \\\"quoted\\\" name\"\n");
    let path = f.path().to_str().expect("utf-8");
    let (_, layered) = parse(&["--config", path, "--insecure"]).expect("parses");
    let printed = layered.render();
    assert!(!printed.contains("hf_abcdef"), "{printed}");
    assert!(printed.contains("hf_token = \"***\"  # from"), "{printed}");
    assert!(printed.contains("\ninsecure = true  # from the command line\n"), "{printed}");
    assert!(printed.contains(&format!("\nlease_ttl_ms = 20000  # from {path}\n")), "{printed}");
    assert!(printed.contains("\nlisten = \"127.0.0.1:7070\"  # default\n"), "{printed}");
    // Read back (less the secret), it gives the same configuration.
    let again = file(&printed.lines().filter(|l| !l.starts_with("hf_token")).collect::<Vec<_>>().join("\n"));
    let (d, _) = parse(&["--config", again.path().to_str().expect("utf-8")]).expect("reads back");
    assert_eq!((d.lease_ttl_ms, d.insecure, d.name.as_deref()), (20_000, true, Some("a \"quoted\" name")));
}
