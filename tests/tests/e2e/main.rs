//! End-to-end tests of the whole system, in-process: a real controller (gRPC
//! on 127.0.0.1:0, sled in a temp dir), a real agent, the simulator's and
//! loadgen's libraries in place of their binaries.

mod compose;
mod config;
mod deploy;
mod deploy_flags;
mod docker;
mod faults;
mod fleet;
mod fleet_check;
mod help;
mod ingest_crash;
mod k8s;
mod local_pipeline;
mod observe;
mod placement;
mod security;
mod steady;
mod systemd;
mod telemetry;
