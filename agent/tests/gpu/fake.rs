//! Builds the fake NVML library once per test run and runs
//! `benchfleet-agent` against a scenario.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The fake library, compiled on first use with the system's C compiler.
pub fn lib() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-nvml/fake_nvml.c");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fake-nvml");
        std::fs::create_dir_all(&dir).expect("create the fake NVML's build directory");
        // Built under a name of its own and renamed into place: another test
        // run sharing the target directory may be loading the library.
        let partial = dir.join(format!("libnvidia-ml.so.{}.partial", std::process::id()));
        let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
        let status = Command::new(&compiler)
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-o"])
            .arg(&partial)
            .arg(&source)
            .status()
            .unwrap_or_else(|e| {
                panic!("cannot run the C compiler `{compiler}` to build the fake NVML: {e}; install gcc or set CC")
            });
        assert!(status.success(), "`{compiler}` failed to build {} ({status})", source.display());
        let lib = dir.join("libnvidia-ml.so.1");
        std::fs::rename(&partial, &lib).expect("move the fake NVML into place");
        lib
    })
}

/// A scenario of the fake library (its format is described in
/// `fake_nvml.c`), written to a file that lives as long as this value.
pub struct Scenario {
    dir: tempfile::TempDir,
}

impl Scenario {
    pub fn new(text: &str) -> Scenario {
        let dir = tempfile::tempdir().expect("create a scenario directory");
        std::fs::write(dir.path().join("scenario"), text).expect("write the scenario");
        Scenario { dir }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("scenario")
    }

    /// A file beside the scenario, e.g. an agent config.
    pub fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text).expect("write a file beside the scenario");
        path
    }

    /// Runs `benchfleet-agent` with `args`, loading the fake NVML with this
    /// scenario.
    pub fn agent(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_benchfleet-agent"))
            .args(args)
            .env("FAKE_NVML_CONFIG", self.path())
            .env("BENCHFLEET_NVML_LIB", lib())
            .env_remove("BENCHFLEET_AGENT_CONFIG")
            .output()
            .expect("run benchfleet-agent")
    }

    /// `verify --json` (plus `args`) on this scenario: the exit code and the
    /// report.
    pub fn verify_json(&self, args: &[&str]) -> (i32, serde_json::Value) {
        let mut all = vec!["verify", "--json"];
        all.extend_from_slice(args);
        let out = self.agent(&all);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let report = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!("verify printed no JSON ({e}): {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr))
        });
        (out.status.code().expect("an exit code"), report)
    }
}
