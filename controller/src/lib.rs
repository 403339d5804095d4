//! benchfleet's controller, the control plane: it plans runs with the
//! study's planners (`benchfleet_study`: matrix, model, greedy, search,
//! report), hands jobs to agents, stores every request record loadgen
//! streams back, and reads the store into the study's report. The operator
//! CLI (`benchfleet`) and local mode are the `benchfleet-cli` crate's.
//!
//! Layout: `plan` turns a submission into a run's groups and jobs and plans
//! a greedy run's next stage and a search profile's next probes; `records`
//! holds what only the control plane stores (agents, counters, the writes
//! the scheduler asks for); `sched` is the scheduler, a pure state machine;
//! `driver` runs it on its own thread, with the store writes it asks for;
//! `ingest` stores record batches (group commit, fenced by attempt);
//! `digests` builds each attempt's digest (its distributions as histograms)
//! from its stored records, for reports that pool repeats; `store` persists
//! everything (sled); `service` is the gRPC face, and `convert` the one
//! place wire types become domain types; `metrics` serves Prometheus
//! `/metrics`; `report` reads a stored run into the study's report;
//! `export` writes a run out as JSON lines and reads one into another
//! store; `pki` makes and reads the fleet's certificates, `enrol` keeps join
//! tokens and revocations, and `auth` decides which certificate may call
//! what.

pub mod auth;
pub mod convert;
pub mod digests;
pub mod driver;
pub mod enrol;
pub mod export;
pub mod ingest;
pub mod metrics;
pub mod pki;
pub mod plan;
pub mod records;
pub mod report;
pub mod sched;
pub mod service;
pub mod store;

pub use driver::{Controller, ControllerConfig};
pub use service::serve;
pub use store::{SledStore, Store};
