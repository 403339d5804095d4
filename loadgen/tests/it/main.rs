//! Integration tests of benchfleet-loadgen, against fake servers that run in
//! the test: an OpenAI-compatible one with known timings and an
//! IngestService that stands in for the controller, and a scripted raw-socket
//! server for the HTTP transport.

mod accuracy;
mod cli;
mod fake_ingest;
mod fake_openai;
mod load;
mod report;
mod streams;
mod transport;

use std::time::Duration;

use benchfleet_loadgen::{Dataset, LoadConfig};

/// A run of `n` random requests of `input` prompt and `output` reply tokens.
fn random_load(base_url: &str, model: &str, n: usize, input: u32, output: u32) -> LoadConfig {
    let dataset = Dataset::Random { input_tokens: input, output_tokens: output, seed: 42 };
    let mut config = LoadConfig::new(base_url, model, dataset, n);
    config.idle_timeout = Duration::from_secs(20);
    config.total_timeout = Duration::from_secs(60);
    config
}
