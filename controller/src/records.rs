//! What the control plane stores beside the study's runs, groups and jobs:
//! each agent as registered (its GPUs, its certificate), the counters that
//! must survive a restart, and the writes the scheduler asks the store for.

use benchfleet_core::telemetry::Series;
use benchfleet_study::model::{AgentId, AttemptKey, Group, Job, Note, Run};
use serde::{Deserialize, Serialize};

/// A GPU as an agent last reported it: what placement and the operator's
/// listing need.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuState {
    pub index: u32,
    pub uuid: String,
    /// The product name, e.g. "NVIDIA H200".
    pub name: String,
    pub memory_total_bytes: u64,
    pub usable: bool,
    /// Why it is not usable.
    pub reasons: Vec<String>,
    pub driver_version: String,
    pub cuda_driver_version: String,
    /// Name, UUID, driver, CUDA and clocks, as one line.
    pub fingerprint: String,
}

/// One agent as the controller keeps it between restarts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub id: AgentId,
    /// Its identity in the fleet: two live agents never share it.
    pub name: String,
    pub hostname: String,
    pub version: String,
    pub gpus: Vec<GpuState>,
    pub runtimes: Vec<String>,
    /// Set while the agent is drained: no new work.
    pub drain: Option<Note>,
    pub registered_unix_ms: i64,
    /// When its last session began.
    pub connected_unix_ms: i64,
    /// The epoch of its last session.
    pub epoch: u64,
    /// The certificate it joined (or last renewed) with; `None` for an agent
    /// known only by its name (plain text, or stored before schema 3).
    pub certificate: Option<AgentCertificate>,
}

/// An agent's certificate, as the controller issued it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentCertificate {
    /// Hex.
    pub serial: String,
    pub not_after_unix_ms: i64,
    /// Set once the agent's name was revoked: its certificates open nothing.
    pub revoked: Option<Note>,
}

/// Counters that must survive a restart so ids and epochs never repeat.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub next_agent: u64,
    pub next_epoch: u64,
}

/// A store write the scheduler asks for (`Store::apply` makes them).
// Writes live for one batch of events; boxing each would only add an
// allocation per write.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    Agent(AgentRecord),
    Run(Run),
    Group(Group),
    Job(Job),
    Counters(Counters),
    /// The series of an attempt's telemetry, kept apart from its job.
    Telemetry(AttemptKey, Vec<Series>),
}
