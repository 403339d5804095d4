//! benchfleet's operator side: the `benchfleet` command line (`cli`), its
//! gRPC client of the controller (`client`), and local mode (`local`): a
//! controller, one agent and simulated engines in one process tree.
//!
//! It lives outside the controller's library so that the controller daemon
//! links none of the agent's GPU and container code.

pub mod cli;
pub mod client;
pub mod local;
