//! The simulator's integration tests: one binary, one module per concern.
//!
//! `server` drives it over real HTTP; `load` checks its behaviour under load in
//! virtual time; `calibration` replays the published reports and keeps
//! `docs/sim-calibration.md` true; `plausible` draws flag combinations no
//! report measured and checks the answers move the way hardware does.

mod calibration;
mod load;
mod plausible;
mod server;
