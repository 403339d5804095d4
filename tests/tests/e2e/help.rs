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
