//! benchfleet's controller: it expands a matrix into jobs, hands them to
//! agents, stores every request record loadgen streams back, and renders the
//! reports. The `benchfleet` operator CLI lives here too.
//!
//! Layout: `matrix` parses and expands matrix files; `greedy` plans the
//! stages of a greedy run from its results so far; `model` holds the domain
//! types; `store` persists them (sled); `server` holds the scheduling state and
//! the gRPC services; `convert` is the only module that sees prost types
//! besides `server`'s service glue; `report` renders reports; `local` runs a
//! controller, an agent and simulated engines in one process tree; `cli` is
//! the operator command line.

pub mod convert;
pub mod greedy;
pub mod matrix;
pub mod model;
pub mod report;
pub mod server;
pub mod store;

pub use server::{Controller, ControllerConfig, serve};
pub use store::{SledStore, Store};
pub mod cli;
pub mod client;
pub mod local;
