//! benchfleet's gRPC services and messages, generated from
//! `proto/benchfleet/v1/benchfleet.proto`. No logic lives here: each crate
//! converts these types to its domain types in one `convert` module.

#[allow(clippy::all, clippy::unwrap_used, missing_docs)]
pub mod v1 {
    tonic::include_proto!("benchfleet.v1");
}

/// The encoded file descriptor set, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/benchfleet_descriptor.bin"));

pub use v1::*;
