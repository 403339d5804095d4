//! benchfleet's controller: it expands a matrix into jobs, hands them to
//! agents, stores every request record loadgen streams back, and renders the
//! reports. The operator CLI (`benchfleet`) and local mode are the
//! `benchfleet-cli` crate's.
//!
//! Layout: `matrix` parses and expands matrix files; `greedy` plans the
//! stages of a greedy run from its results so far; `model` holds the domain
//! types; `store` persists them (sled); `server` holds the scheduling state and
//! the gRPC services; `convert` is the only module that sees prost types
//! besides `server`'s service glue; `report` renders reports.

pub mod convert;
pub mod greedy;
pub mod matrix;
pub mod model;
pub mod report;
pub mod server;
pub mod store;

pub use server::{Controller, ControllerConfig, serve};
pub use store::{SledStore, Store};
