//! Every binary's `--help` says how to run it, which environment it reads
//! and what its exit codes mean.

#[test]
fn every_binary_s_help_lists_its_environment_and_exit_codes() {
    for name in ["benchfleet", "benchfleet-controller", "benchfleet-agent", "benchfleet-loadgen", "benchfleet-sim"] {
        let binary = benchfleet_agent::find_binary(name)
            .unwrap_or_else(|| panic!("{name} is not built; run `cargo build --workspace` first"));
        let out = std::process::Command::new(&binary).arg("--help").output().expect("runs");
        assert_eq!(out.status.code(), Some(0), "{name} --help");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("Exit status:"), "{name} --help says nothing of its exit codes:\n{help}");
        let env = help.contains("Environment:") || help.contains("[env: ");
        assert!(env, "{name} --help says nothing of its environment:\n{help}");
    }
}

/// Tools find the controller's TLS flags by name: no other flag may look
/// like one (a word tls, cert, ssl, ca or key).
#[test]
fn only_the_controller_s_tls_flags_are_named_like_tls_flags() {
    let binary = benchfleet_agent::find_binary("benchfleet-controller").expect("built");
    let out = std::process::Command::new(&binary).arg("--help").output().expect("runs");
    let help = String::from_utf8_lossy(&out.stdout);
    let flags: Vec<&str> = help
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("--"))
        .map(|w| w.trim_end_matches([',', '.', ';', ')']))
        .filter(|w| !w.is_empty())
        .collect();
    for flag in ["tls-cert", "tls-key", "client-ca", "insecure", "pki-dir"] {
        assert!(flags.contains(&flag), "--{flag} is missing:\n{help}");
    }
    for flag in flags {
        let tls_like = flag.split('-').any(|w| ["tls", "cert", "ssl", "ca", "key"].contains(&w));
        assert_eq!(tls_like, ["tls-cert", "tls-key", "client-ca"].contains(&flag), "--{flag}");
    }
}
