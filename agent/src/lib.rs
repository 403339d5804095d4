//! benchfleet's agent: the daemon on each GPU host. It reports its GPUs,
//! holds a session with the controller, starts the engine of each group it
//! is given, runs loadgen against it for every job, and stops the engine.
//!
//! Layout: `agent` is the agent's life (reconnects, the lease watchdog,
//! leaving and stopping); `session` one session with the controller and the
//! groups held across sessions; `group` runs one engine group; `job` holds
//! the domain types of an assignment and their conversion from and to gRPC;
//! `engine` the engine runtimes, `docker` the one that runs containers;
//! `identity` the certificate it is known by (`WORK_DIR/identity/`);
//! `policy` what engines the agent's config file lets it run;
//! `load` runs loadgen; `telemetry` samples the engine's `/metrics` and the
//! GPUs while it runs; `procs` keeps the pid files of what the agent
//! starts; `gpu` the GPU inventory, `nvml` reads it on real hosts, `verdict`
//! judges it and `verify` shows it; `observe` serves `--metrics-listen`
//! (`/metrics`, `/healthz`, `/readyz`).

pub mod agent;
pub mod docker;
pub mod engine;
pub mod gpu;
pub mod group;
pub mod identity;
pub mod job;
pub mod load;
pub mod nvml;
pub mod observe;
pub mod policy;
pub mod procs;
pub mod session;
pub mod telemetry;
pub mod verdict;
pub mod verify;

pub use agent::{AgentConfig, Shutdown, run, run_with};

/// Finds a sibling binary of the running executable (they are built into
/// the same directory), else on `PATH`.
pub fn find_binary(name: &str) -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let mut dirs: Vec<std::path::PathBuf> = exe.parent().into_iter().map(|d| d.to_path_buf()).collect();
    // Test executables live one level down, in `deps/`.
    if let Some(up) = exe.parent().and_then(|d| d.parent()) {
        dirs.push(up.to_path_buf());
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}
