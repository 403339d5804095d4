//! benchfleet's controller: it expands a matrix into jobs, hands them to
//! agents, stores every request record loadgen streams back, and renders the
//! reports. The operator CLI (`benchfleet`) and local mode are the
//! `benchfleet-cli` crate's.
//!
//! Layout: `matrix` parses and validates matrix files; `plan` turns a
//! submission into a run's groups and jobs and plans a greedy run's next
//! stage (with `greedy`, the planner itself) and a search profile's next
//! probes (with `search`, the bisection); `model` holds the domain and
//! stored types; `sched` is the scheduler, a pure state machine; `driver`
//! runs it on its own thread, with the store writes it asks for; `ingest`
//! stores record batches (group commit, fenced by attempt); `digests`
//! builds each attempt's digest (its distributions as histograms) from its
//! stored records, for reports that pool repeats; `store`
//! persists everything (sled); `service` is the gRPC face, and `convert` the
//! one place wire types become domain types; `metrics` serves Prometheus
//! `/metrics`; `report` renders reports; `export` writes a run out as JSON
//! lines and reads one into another store; `pki` makes and reads the
//! fleet's certificates, `enrol` keeps join tokens and revocations, and
//! `auth` decides which certificate may call what.

pub mod auth;
pub mod convert;
pub mod digests;
pub mod driver;
pub mod enrol;
pub mod export;
pub mod greedy;
pub mod ingest;
pub mod matrix;
pub mod metrics;
pub mod model;
pub mod pki;
pub mod plan;
pub mod report;
pub mod sched;
pub mod search;
pub mod service;
pub mod store;

pub use driver::{Controller, ControllerConfig};
pub use service::serve;
pub use store::{SledStore, Store};
