//! benchfleet's study: what a benchmark asks and what it found, apart from
//! how it is run. `matrix` parses and validates matrix files; `model` holds
//! the domain types of runs, groups, jobs and attempts (as the controller
//! stores them); `fleet` judges each host of a fleet check against its
//! peers; `slo` the types of an SLO search (what it varies, its
//! bounds); `greedy` plans a greedy run's stages from its results and
//! `search` a search profile's probes; `report` gathers a run's document
//! (`report::doc::ReportDoc`) from its runs, jobs and measurements and
//! renders it (console, Markdown, JSON, CSV, HTML) or compares two.
//!
//! No store, no network, no threads: the controller reads its store into
//! these types, and the CLI validates, compares and renders with them.

pub mod fleet;
pub mod greedy;
pub mod hostlist;
pub mod matrix;
pub mod model;
pub mod report;
pub mod search;
pub mod slo;
