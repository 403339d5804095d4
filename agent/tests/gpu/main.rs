//! The agent's GPU checks through the real nvml-wrapper: a fake
//! `libnvidia-ml.so`, built from `tests/fake-nvml/fake_nvml.c` by `fake`,
//! reports the GPUs of each scenario, and `benchfleet-agent verify` reads
//! them. Each scenario runs in its own process: the fake library's state and
//! its config variable are process-wide. The `real` module needs a GPU host.

mod fake;
mod real;
mod verify;
mod xid;
