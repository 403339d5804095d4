//! Building random prompts with a tokenizer: word pieces (a prompt of n
//! pieces is n tokens, no encoding) against decoding random ids and
//! encoding again until the count is exact, side by side in one run.
//!
//!   cargo bench -p benchfleet-loadgen --bench prompts -- [--tokenizer PATH] [--prompts N]
//!
//! The default tokenizer is the test fixture (a 4,000-token byte-level BPE);
//! give a model's `tokenizer.json` to measure it.

use std::path::PathBuf;
use std::time::Instant;

use benchfleet_loadgen::TokenCounter;
use benchfleet_loadgen::dataset::{Dataset, prompt_texts};

fn main() {
    let mut tokenizer = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bpe/tokenizer.json");
    let mut prompts = 2000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--tokenizer" => tokenizer = args.next().expect("--tokenizer PATH").into(),
            "--prompts" => prompts = args.next().and_then(|n| n.parse().ok()).expect("--prompts N"),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    let began = Instant::now();
    let fast = TokenCounter::load(&tokenizer).expect("the tokenizer loads");
    let load_s = began.elapsed().as_secs_f64();
    assert!(fast.has_word_pieces(), "{} keeps no words apart: nothing to compare", tokenizer.display());
    let slow = fast.without_word_pieces();
    println!("tokenizer {} (loaded with its word pieces in {load_s:.3} s)", tokenizer.display());
    println!("{:>13} {:>9} {:>16} {:>16} {:>8}", "input tokens", "prompts", "decode+encode", "word pieces", "ratio");
    for input_tokens in [128u32, 512, 1024, 4096] {
        let d = Dataset::Random { input_tokens, output_tokens: 128, seed: 42 };
        // Fewer of the long ones: the slow way takes a while.
        let n = (prompts * 128 / input_tokens as usize).max(50);
        let time = |counter: &TokenCounter| {
            let began = Instant::now();
            let texts = prompt_texts(&d, n, counter);
            assert_eq!(texts.len(), n);
            began.elapsed().as_secs_f64() * 1e3 / n as f64
        };
        let (s, f) = (time(&slow), time(&fast));
        println!("{input_tokens:>13} {n:>9} {:>13.3} ms {:>13.4} ms {:>7.0}x", s, f, s / f);
    }
}
