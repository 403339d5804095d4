//! Drives the simulator as a benchmark client would: an in-process server over real HTTP, and the built binary.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

/// A simulator on 127.0.0.1:0, stopped when dropped.
struct Sim {
    base: String,
    client: reqwest::Client,
    _stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start(command_line: &str) -> Sim {
    // reqwest is built without a crypto provider; installing twice across tests is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args: Vec<String> = command_line.split_whitespace().map(String::from).collect();
    let config = benchfleet_sim::parse_command_line(&args).expect("valid command line");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("bound address"));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(benchfleet_sim::serve(config, listener, async move {
        let _ = stopped.await;
    }));
    Sim { base, client: reqwest::Client::new(), _stop: stop, task }
}

impl Sim {
    async fn post(&self, path: &str, body: Value) -> (StatusCode, String) {
        let response = self.client.post(format!("{}{path}", self.base)).json(&body).send().await.expect("request");
        (response.status(), response.text().await.expect("body"))
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        let response = self.client.get(format!("{}{path}", self.base)).send().await.expect("request");
        (response.status(), response.text().await.expect("body"))
    }
}

/// The JSON chunks of an SSE body, checking vLLM's framing and the final `[DONE]`.
fn sse_chunks(body: &str) -> Vec<Value> {
    let events: Vec<&str> = body.split_terminator("\n\n").collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{body}");
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").expect("data event")).expect("json chunk"))
        .collect()
}

#[tokio::test]
async fn health_waits_for_startup_and_models_lists_the_served_name() {
    let sim =
        start("vllm serve Qwen/Qwen3-8B --served-model-name qwen --max-model-len 4096 --sim-startup-ms 300").await;
    assert_eq!(sim.get("/health").await.0, StatusCode::SERVICE_UNAVAILABLE);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(sim.get("/health").await.0, StatusCode::OK);
    let (status, body) = sim.get("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    let models: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "qwen");
    assert_eq!(models["data"][0]["owned_by"], "benchfleet-sim");
    assert_eq!(models["data"][0]["max_model_len"], 4096);
}

#[tokio::test]
async fn streamed_completion_has_max_tokens_chunks_then_usage_then_done() {
    let sim = start("vllm serve m --sim-speedup 10").await;
    let request = json!({"model": "m", "prompt": "one two three", "max_tokens": 5, "stream": true,
        "stream_options": {"include_usage": true}, "ignore_eos": true, "temperature": 0.0});
    let (status, body) = sim.post("/v1/completions", request).await;
    assert_eq!(status, StatusCode::OK);
    let chunks = sse_chunks(&body);
    assert_eq!(chunks.len(), 6, "{body}");
    for (i, chunk) in chunks[..5].iter().enumerate() {
        assert_eq!(chunk["object"], "text_completion");
        assert!(chunk["id"].as_str().expect("id").starts_with("cmpl-"));
        assert!(chunk["choices"][0]["text"].as_str().expect("text").starts_with(' '));
        let finish = if i == 4 { json!("length") } else { Value::Null };
        assert_eq!(chunk["choices"][0]["finish_reason"], finish);
    }
    assert_eq!(chunks[5]["choices"], json!([]));
    assert_eq!(chunks[5]["usage"], json!({"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}));
}

#[tokio::test]
async fn chat_stream_starts_role_only_then_reasoning_then_content() {
    let sim = start("sglang serve --model-path m --reasoning-parser qwen3 --sim-speedup 10").await;
    let request = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi there"}]}],
        "max_tokens": 8, "stream": true});
    let (status, body) = sim.post("/v1/chat/completions", request).await;
    assert_eq!(status, StatusCode::OK);
    let chunks = sse_chunks(&body);
    assert_eq!(chunks.len(), 9, "role chunk, 8 tokens and no usage: {body}");
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    let fields: Vec<String> = chunks[1..]
        .iter()
        .map(|c| c["choices"][0]["delta"].as_object().expect("delta").keys().cloned().collect())
        .collect();
    assert_eq!(fields[..2], ["reasoning_content", "reasoning_content"]);
    assert!(fields[2..].iter().all(|f| f == "content"), "{fields:?}");
    assert_eq!(chunks[8]["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn non_streaming_responses_report_usage() {
    let sim = start("vllm serve m --sim-speedup 10").await;
    let (status, body) = sim.post("/v1/completions", json!({"prompt": ["a b c d"], "max_tokens": 3})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let reply: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(reply["usage"], json!({"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}));
    assert_eq!(reply["choices"][0]["text"].as_str().expect("text").split_whitespace().count(), 3);

    let chat = json!({"model": "m", "messages": [{"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is up"}]});
    let (status, body) = sim.post("/v1/chat/completions", chat).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let reply: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(reply["object"], "chat.completion");
    assert_eq!(reply["usage"], json!({"prompt_tokens": 5, "completion_tokens": 16, "total_tokens": 21}));
    // The same request generates the same words.
    let again: Value = serde_json::from_str(
        &sim.post(
            "/v1/chat/completions",
            json!({"model": "m",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is up"}]}),
        )
        .await
        .1,
    )
    .expect("json");
    assert_eq!(again["choices"][0]["message"]["content"], reply["choices"][0]["message"]["content"]);
}

#[tokio::test]
async fn errors_look_like_vllm() {
    let sim = start("vllm serve m --max-model-len 10").await;
    let (status, body) = sim.post("/v1/completions", json!({"prompt": "w w w w w w w", "max_tokens": 4})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(error["error"]["type"], "BadRequestError");
    assert_eq!(error["error"]["code"], 400);
    assert!(error["error"]["message"].as_str().expect("message").contains("maximum context length is 10"));
    // However many tokens are asked for: the sum is checked whole.
    let (status, body) = sim.post("/v1/completions", json!({"prompt": "w", "max_tokens": u64::MAX})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains(&format!("you requested {} tokens", u128::from(u64::MAX) + 1)), "{body}");

    let (status, body) = sim.post("/v1/completions", json!({"model": "other", "prompt": "hi"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(serde_json::from_str::<Value>(&body).expect("json")["error"]["code"], 404);

    // One choice per request: more is refused, not served as one.
    let (status, body) = sim.post("/v1/completions", json!({"prompt": "hi", "max_tokens": 2, "n": 3})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("one choice per request, not n=3"), "{body}");
    assert_eq!(sim.post("/v1/completions", json!({"prompt": "hi", "max_tokens": 2, "n": 1})).await.0, StatusCode::OK);
    // A body of megabytes (a million-token prompt) is read, as the engines' servers read it, and
    // refused here only for its length in tokens.
    let (status, body) = sim.post("/v1/completions", json!({"prompt": "w ".repeat(3_000_000), "max_tokens": 1})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("maximum context length is 10"), "{body}");

    // Nothing to prefill: vLLM's error, for text and token ids alike; a chat request has its template.
    for prompt in [json!(""), json!("   "), json!([]), json!([""])] {
        let (status, body) = sim.post("/v1/completions", json!({"prompt": prompt, "max_tokens": 2})).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{prompt}");
        assert!(body.contains("The decoder prompt cannot be empty"), "{prompt}: {body}");
    }
    let chat = json!({"messages": [{"role": "user", "content": ""}], "max_tokens": 2});
    assert_eq!(sim.post("/v1/chat/completions", chat).await.0, StatusCode::OK);

    let sim = start("vllm serve m --sim-fail-rate 1").await;
    assert_eq!(sim.post("/v1/completions", json!({"prompt": "hi"})).await.0, StatusCode::INTERNAL_SERVER_ERROR);
}

/// The value of one `/metrics` series.
async fn metric(sim: &Sim, name: &str) -> f64 {
    let text = sim.get("/metrics").await.1;
    let line = text.lines().find(|l| l.starts_with(&format!("{name}{{"))).unwrap_or_else(|| panic!("{name} in {text}"));
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("a number")
}

#[tokio::test]
async fn metrics_count_prefix_cache_hits_until_the_cache_is_reset() {
    let sim = start("vllm serve m --sim-speedup 10").await;
    let text = sim.get("/metrics").await.1;
    for series in [
        "# TYPE vllm:num_requests_running gauge",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        "# TYPE vllm:prefix_cache_hits_total counter",
        "# TYPE vllm:prefix_cache_queries_total counter",
    ] {
        assert!(text.contains(series), "{text}");
    }
    assert!(text.contains("vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} 0.0"), "{text}");
    let prompt = "word ".repeat(100);
    let request = json!({"prompt": prompt, "max_tokens": 2});
    assert_eq!(sim.post("/v1/completions", request.clone()).await.0, StatusCode::OK);
    assert_eq!(metric(&sim, "vllm:prefix_cache_hits_total").await, 0.0);
    assert_eq!(sim.post("/v1/completions", request.clone()).await.0, StatusCode::OK);
    // Six full blocks of 16 words are cached; the prompt's last four words are computed again.
    assert_eq!(metric(&sim, "vllm:prefix_cache_hits_total").await, 96.0);
    assert_eq!(metric(&sim, "vllm:prefix_cache_queries_total").await, 200.0);
    assert_eq!(sim.post("/reset_prefix_cache", json!({})).await.0, StatusCode::OK);
    assert_eq!(sim.post("/v1/completions", request).await.0, StatusCode::OK);
    assert_eq!(metric(&sim, "vllm:prefix_cache_hits_total").await, 96.0, "cold after the reset");
}

#[tokio::test]
async fn a_conversations_next_turn_finds_the_reply_in_the_prefix_cache() {
    // A 40-word question answered in 40 words, then asked on: the second prompt carries both and
    // 10 words more. The first request computed the KV of 79 tokens, 4 full blocks; vLLM caches a
    // reply's blocks as it computes them. With a reasoning parser the reply's first quarter is
    // reasoning, which the next turn does not carry, so only the question's 2 blocks match.
    for (flags, hits) in [("", 64.0), ("--reasoning-parser qwen3", 32.0)] {
        let sim = start(&format!("vllm serve m --sim-speedup 10 {flags}")).await;
        let question = json!({"role": "user", "content": "word ".repeat(40)});
        let first = json!({"model": "m", "messages": [question], "max_tokens": 40});
        let (status, body) = sim.post("/v1/chat/completions", first).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let reply: Value = serde_json::from_str(&body).expect("json");
        let answer = reply["choices"][0]["message"]["content"].clone();
        let next = json!({"model": "m", "max_tokens": 4, "messages": [question,
            {"role": "assistant", "content": answer}, {"role": "user", "content": "more ".repeat(10)}]});
        assert_eq!(sim.post("/v1/chat/completions", next).await.0, StatusCode::OK);
        assert_eq!(metric(&sim, "vllm:prefix_cache_hits_total").await, hits, "{flags}");
    }
}

/// Reads a streamed body to its end, or to the error that cut it.
async fn read_stream(sim: &Sim, max_tokens: usize) -> Result<String, reqwest::Error> {
    let request = json!({"prompt": "a b c", "max_tokens": max_tokens, "stream": true});
    let response = sim.client.post(format!("{}/v1/completions", sim.base)).json(&request).send().await?;
    response.text().await
}

#[tokio::test]
async fn faults_disconnect_and_stall_streams() {
    let sim = start("vllm serve m --sim-speedup 10 --sim-disconnect-rate 1").await;
    let cut = read_stream(&sim, 10).await;
    assert!(cut.is_err() || !cut.as_deref().unwrap_or_default().contains("[DONE]"), "{cut:?}");

    let sim = start("vllm serve m --sim-speedup 10 --sim-stall-rate 1 --sim-stall-ms 300").await;
    let started = std::time::Instant::now();
    let body = read_stream(&sim, 10).await.expect("a stalled stream still ends");
    assert_eq!(sse_chunks(&body).len(), 10);
    assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
}

#[tokio::test]
async fn the_engine_crashes_after_n_requests_and_the_server_stops_with_an_error() {
    let sim = start("vllm serve m --sim-speedup 10 --sim-crash-after 1").await;
    assert_eq!(sim.post("/v1/completions", json!({"prompt": "hi", "max_tokens": 3})).await.0, StatusCode::OK);
    let result = tokio::time::timeout(Duration::from_secs(10), sim.task).await.expect("stops").expect("no panic");
    let err = result.expect_err("a crash is an error");
    assert!(err.to_string().contains("EngineDeadError"), "{err}");
}

#[tokio::test]
async fn past_its_failure_batch_speculative_decoding_fails_requests_with_the_engines_error() {
    let sim = start(
        "vllm serve m --sim-speedup 20 --speculative-config {\"method\":\"mtp\",\"num_speculative_tokens\":2} --sim-spec-failure-batch 0",
    )
    .await;
    // The first request runs alone and passes the size of 0: it finishes, the state is then corrupt.
    let (status, body) = sim.post("/v1/completions", json!({"model": "m", "prompt": "one two", "max_tokens": 4})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = sim.post("/v1/completions", json!({"model": "m", "prompt": "three", "max_tokens": 4})).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.contains("--sim-spec-failure-batch"), "{body}");
    let request = json!({"model": "m", "prompt": "four", "max_tokens": 4, "stream": true});
    let (status, body) = sim.post("/v1/completions", request).await;
    assert_eq!(status, StatusCode::OK);
    let chunks = sse_chunks(&body);
    assert_eq!(chunks.len(), 1, "an error event and nothing else: {body}");
    assert_eq!(chunks[0]["error"]["code"], 500);
    assert!(chunks[0]["error"]["message"].as_str().expect("message").contains("speculative decoding"), "{body}");
}

#[tokio::test]
async fn sglang_with_a_pool_smaller_than_its_context_serves_what_the_pool_holds() {
    let sim = start("sglang serve --model-path Qwen/Qwen3.5-9B --context-length 32768 --max-total-tokens 2000").await;
    let (status, body) = sim.post("/v1/completions", json!({"prompt": "w ".repeat(2500), "max_tokens": 4})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body.contains("maximum context length is 1999 tokens"), "{body}");
    let (status, body) = sim.post("/v1/completions", json!({"prompt": "w ".repeat(1000), "max_tokens": 4})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn a_model_that_does_not_fit_fails_at_startup() {
    let sim = start("vllm serve Qwen/Qwen3-235B-A22B --sim-gpu H100").await;
    let err = sim.task.await.expect("no panic").expect_err("out of memory");
    assert!(err.to_string().contains("CUDA out of memory"), "{err}");
}

#[test]
fn binary_exits_1_with_the_engines_message_when_the_kv_cache_is_too_small() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_benchfleet-sim"))
        .args(["vllm", "serve", "Qwen/Qwen3.5-9B", "--port", "0", "--sim-gpu", "H100"])
        .args(["--gpu-memory-utilization", "0.27", "--max-model-len", "131072"])
        .output()
        .expect("run benchfleet-sim");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("KV cache is needed, which is larger than the available KV cache memory"), "{stderr}");
}

#[test]
fn binary_counts_the_gpus_it_was_given_as_the_engine_does() {
    let run = |devices: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_benchfleet-sim"))
            .args(["vllm", "serve", "Qwen/Qwen3.5-9B", "--port", "0", "--tensor-parallel-size", "2"])
            .env("CUDA_VISIBLE_DEVICES", devices)
            .output()
            .expect("run benchfleet-sim")
    };
    // One GPU given (an agent lists a job's simulated GPUs as it would real ones): TP 2 cannot start.
    let output = run("GPU-sim-host-0");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("World size (2) is larger than the number of available GPUs (1)"), "{stderr}");
    assert!(String::from_utf8_lossy(&run("").stderr).contains("No CUDA GPUs are available"));
}

#[test]
fn help_lists_every_simulator_flag_and_each_one_is_taken() {
    for args in [&["--help"][..], &["vllm", "serve", "m", "--help"][..], &["-h"][..]] {
        let output =
            std::process::Command::new(env!("CARGO_BIN_EXE_benchfleet-sim")).args(args).output().expect("runs");
        assert_eq!(output.status.code(), Some(0), "{args:?}");
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(help.contains("Usage:") && help.contains("Exit status:") && help.contains("BENCHFLEET_SIM_GPU"));
        for (flag, _, _) in benchfleet_sim::SIM_FLAGS {
            assert!(help.contains(flag), "{flag} is not in --help");
        }
    }
    // A report's recommended command leaves these flags out, with their values but the switches'.
    let switches: Vec<&str> =
        benchfleet_sim::SIM_FLAGS.iter().filter(|(_, sample, _)| sample.is_empty()).map(|(flag, ..)| *flag).collect();
    assert_eq!(switches, benchfleet_core::flags::SIMULATOR_SWITCHES);
    for (flag, sample, _) in benchfleet_sim::SIM_FLAGS {
        let mut line = vec!["vllm".to_owned(), "serve".to_owned(), "m".to_owned(), flag.to_owned()];
        if !sample.is_empty() {
            line.push(sample.to_owned());
        }
        benchfleet_sim::parse_command_line(&line).unwrap_or_else(|e| panic!("{flag} {sample}: {e}"));
    }
}

#[test]
fn binary_rejects_bad_command_lines_with_exit_code_2() {
    for (args, expected) in [
        (&["vllm", "serve", "m", "--bogus"][..], "error: unrecognized arguments: --bogus"),
        (&["sglang", "serve", "--port", "1"][..], "error: the following arguments are required: --model-path"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_benchfleet-sim"))
            .args(args)
            .output()
            .expect("run benchfleet-sim");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert_eq!(String::from_utf8_lossy(&output.stderr).trim(), expected);
    }
}

#[tokio::test]
async fn each_engine_kind_empties_its_cache_its_own_way_or_not_at_all() {
    let vllm = start("vllm serve m").await;
    assert_eq!(vllm.post("/reset_prefix_cache", json!({})).await.0, StatusCode::OK);
    assert_eq!(vllm.post("/flush_cache", json!({})).await.0, StatusCode::NOT_FOUND);
    let sglang = start("python3 -m sglang.launch_server --model-path m").await;
    assert_eq!(sglang.post("/flush_cache", json!({})).await.0, StatusCode::OK);
    assert_eq!(sglang.post("/reset_prefix_cache", json!({})).await.0, StatusCode::NOT_FOUND);
    let refusing = start("vllm serve m --sim-refuse-cache-reset").await;
    assert_eq!(refusing.post("/reset_prefix_cache", json!({})).await.0, StatusCode::NOT_FOUND);
}

/// The engine's series the agent keeps, read from `/metrics` with the agent's own parser.
async fn series(sim: &Sim, kind: &str) -> std::collections::HashMap<String, f64> {
    let (status, text) = sim.get("/metrics").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    let names = benchfleet_core::telemetry::engine_series(kind);
    let values = benchfleet_core::telemetry::read_metrics(&text, names).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(values.len(), names.len(), "every series the agent keeps is served: {text}");
    values.into_iter().collect()
}

#[tokio::test]
async fn metrics_of_both_engines_parse_and_move_under_load() {
    const VLLM: [&str; 4] = [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:generation_tokens_total",
    ];
    const SGLANG: [&str; 4] =
        ["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:generation_tokens_total"];
    // Four slots: on one engine, on its pipeline's two batches in flight (one engine still), or on
    // two data-parallel replicas of two, each labelled by its rank.
    for (command, kind, [running, waiting, usage, generated], ranks) in [
        ("vllm serve m --max-num-seqs 4 --sim-speedup 2", "vllm", VLLM, &["engine=\"0\""][..]),
        ("vllm serve m --max-num-seqs 4 -pp 2 --sim-speedup 2", "vllm", VLLM, &["engine=\"0\""]),
        ("vllm serve m --max-num-seqs 2 -dp 2 --sim-speedup 2", "vllm", VLLM, &["engine=\"0\"", "engine=\"1\""]),
        (
            "sglang serve --model-path m --max-running-requests 4 --enable-metrics --sim-speedup 2",
            "sglang",
            SGLANG,
            &["tp_rank=\"0\""],
        ),
        (
            "sglang serve --model-path m --max-running-requests 2 --dp-size 2 --enable-metrics --sim-speedup 2",
            "sglang",
            SGLANG,
            &["dp_rank=\"0\"", "dp_rank=\"1\""],
        ),
    ] {
        let sim = start(command).await;
        let text = sim.get("/metrics").await.1;
        for rank in ranks {
            assert!(text.lines().any(|l| l.starts_with(running) && l.contains(rank)), "{command}: {rank} in {text}");
        }
        assert_eq!(text.lines().filter(|l| l.starts_with(running)).count(), ranks.len(), "{command}: {text}");
        let idle = series(&sim, kind).await;
        assert_eq!((idle[running], idle[waiting], idle[usage], idle[generated]), (0.0, 0.0, 0.0, 0.0), "{command}");
        // Eight long requests on four slots: four run, four wait.
        let client = sim.client.clone();
        let url = format!("{}/v1/completions", sim.base);
        let load: Vec<_> = (0..8)
            .map(|i| {
                let (client, url) = (client.clone(), url.clone());
                let prompt = format!("request {i} ").repeat(200);
                tokio::spawn(async move {
                    client.post(url).json(&json!({"prompt": prompt, "max_tokens": 400})).send().await?.text().await
                })
            })
            .collect();
        let busy = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let now = series(&sim, kind).await;
                if now[running] > 0.0 && now[waiting] > 0.0 {
                    return now;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{command}: requests never ran and waited at once"));
        assert_eq!(busy[running] + busy[waiting], 8.0, "{command}: {busy:?}");
        assert!(busy[usage] > 0.0 && busy[usage] <= 1.0, "{command}: {busy:?}");
        for request in load {
            request.await.expect("no panic").expect("a reply");
        }
        let after = series(&sim, kind).await;
        assert_eq!((after[running], after[waiting]), (0.0, 0.0), "{command}");
        assert_eq!(after[generated], 8.0 * 400.0, "{command}");
        // The simulator's own account of its steps' timing: two of the
        // eight ran 400 steps each, one after the other (four slots), and
        // no step woke before its deadline.
        let text = sim.get("/metrics").await.1;
        let own =
            ["benchfleet_sim:steps_total", "benchfleet_sim:late_steps_total", "benchfleet_sim:step_late_seconds_total"];
        let values: std::collections::HashMap<String, f64> =
            benchfleet_core::telemetry::read_metrics(&text, &own).expect("parses").into_iter().collect();
        let (steps, late, seconds) = (values[own[0]], values[own[1]], values[own[2]]);
        assert!(steps >= 800.0, "{command}: {values:?}");
        assert!(late <= steps && seconds >= 0.0, "{command}: {values:?}");
    }
}

#[tokio::test]
async fn each_engine_says_its_version_its_own_way_and_sglang_serves_metrics_only_when_asked() {
    let vllm = start("vllm serve m").await;
    let (status, body) = vllm.get("/version").await;
    assert_eq!(status, StatusCode::OK);
    let version: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(version, json!({"version": benchfleet_sim::ENGINE_VERSION}));
    assert_eq!(vllm.get("/get_server_info").await.0, StatusCode::NOT_FOUND);

    let sglang = start("sglang serve --model-path m").await;
    let (status, body) = sglang.get("/get_server_info").await;
    assert_eq!(status, StatusCode::OK);
    let info: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(
        (info["version"].as_str(), info["model_path"].as_str()),
        (Some(benchfleet_sim::ENGINE_VERSION), Some("m"))
    );
    assert_eq!(sglang.get("/version").await.0, StatusCode::NOT_FOUND);
    assert_eq!(sglang.get("/metrics").await.0, StatusCode::NOT_FOUND, "without --enable-metrics");
}
