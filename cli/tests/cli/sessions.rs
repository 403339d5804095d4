//! Multi-turn sessions end to end: `run --local` on the simulator, with and
//! without prefix caching, stores each request's session and turn and
//! reports the sessions' figures; the conversation each turn carries is
//! what a prefix cache finds again. A ShareGPT file's conversations go as
//! sessions too.

/// Ten conversations of three exchanges: conversation c's exchange e asks
/// 7 + c + e words.
fn chats() -> String {
    let conversations: Vec<serde_json::Value> = (0..10)
        .map(|c| {
            let turns: Vec<serde_json::Value> = (0..3)
                .flat_map(|e| {
                    let ask = format!("topic{c} question{e} {}", "word ".repeat(5 + c + e));
                    [
                        serde_json::json!({ "from": "human", "value": ask }),
                        serde_json::json!({ "from": "gpt", "value": "a recorded reply" }),
                    ]
                })
                .collect();
            serde_json::json!({ "id": c, "conversations": turns })
        })
        .collect();
    serde_json::Value::from(conversations).to_string()
}

#[test]
fn sessions_carry_their_conversation_and_a_prefix_cache_finds_it() {
    let (data, run_id, stdout) = super::run_local_kept(
        "name: chat\nmodel: Qwen/Qwen3-8B\nhardware: { gpu: H200 }\nengines:\n  \
         vllm: { image: vllm/vllm-openai:v0.17.1, args: [--max-model-len=8192, --no-enable-prefix-caching] }\n\
         variants:\n  prefix-caching: { args: [--enable-prefix-caching] }\nprofiles:\n  \
         sessions:\n    \
         dataset: { multi_turn: { turns: 4, user_tokens: 400, output_tokens: 32, think_time_ms: 50, seed: 3 } }\n    \
         endpoint: chat\n    requests: 120\n    max_concurrency: 6\n  \
         chats:\n    \
         dataset: { sharegpt: chats.json, output_tokens: 8, sessions: { think_time_ms: 20 } }\n    \
         endpoint: chat\n    requests: 30\n    max_concurrency: 4\n",
        &[("chats.json", &chats())],
    );
    let report =
        |format: &str| super::text(&super::benchfleet(data.path(), &["report", &run_id, "--format", format]).stdout);
    let doc: serde_json::Value = serde_json::from_str(&report("json")).expect("a JSON report");
    // The Markdown and HTML reports table each block's turns.
    let markdown = report("markdown");
    assert_eq!(
        markdown.matches("| Turn | Successful | Failed | Mean TTFT (ms) | Mean prompt tokens |").count(),
        4,
        "{markdown}"
    );
    assert!(
        markdown.contains("By turn (30 sessions, 4.00 turns a session)") && markdown.contains("| 4 | 30 | 0 | "),
        "{markdown}"
    );
    let html = report("html");
    assert_eq!(html.matches("<th>Turn</th>").count(), 4, "{html}");
    let configurations = doc["configurations"].as_array().expect("configurations");
    assert_eq!(configurations.len(), 2, "{doc:#}");
    let mut later_ttft = Vec::new();
    for configuration in configurations {
        let blocks = configuration["blocks"].as_array().expect("blocks");
        let block = blocks.iter().find(|b| b["profile"] == "sessions").expect("the sessions block");
        let chats = &blocks.iter().find(|b| b["profile"] == "chats").expect("the chats block")["pooled"];
        assert_eq!((chats["successful"].as_u64(), chats["failed"].as_u64()), (Some(30), Some(0)), "{chats:#}");
        let sessions = &chats["sessions"];
        assert_eq!((sessions["sessions"].as_u64(), sessions["turns"].as_u64()), (Some(10), Some(30)), "{sessions:#}");
        let prompts: Vec<f64> = sessions["by_turn"]
            .as_array()
            .expect("rows")
            .iter()
            .map(|r| r["mean_prompt_tokens"].as_f64().expect("prompt tokens"))
            .collect();
        // Conversation c's exchange e asks 7 + c + e words; each reply is 8.
        assert_eq!(prompts, [11.5, 11.5 + 12.5 + 8.0, 11.5 + 12.5 + 13.5 + 16.0], "{sessions:#}");
        let s = &block["pooled"];
        assert_eq!((s["successful"].as_u64(), s["failed"].as_u64()), (Some(120), Some(0)), "{s:#}");
        let sessions = &s["sessions"];
        assert_eq!((sessions["sessions"].as_u64(), sessions["turns"].as_u64()), (Some(30), Some(120)), "{sessions:#}");
        let rows = sessions["by_turn"].as_array().expect("rows by turn");
        let got: Vec<(u64, u64, f64)> = rows
            .iter()
            .map(|r| {
                let n = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r:#}"));
                (n("turn") as u64, n("successful") as u64, n("mean_prompt_tokens"))
            })
            .collect();
        // Turn k carries k user turns of 400 words and k - 1 replies of 32.
        assert_eq!(got, [(1, 30, 400.0), (2, 30, 832.0), (3, 30, 1264.0), (4, 30, 1696.0)], "{sessions:#}");
        let ttft = |turn: usize| rows[turn - 1]["mean_ttft_ms"].as_f64().expect("a TTFT");
        later_ttft.push((ttft(1), ttft(4), block["prefix_cache_hit_rate"].as_f64()));
    }
    assert!(configurations[1].to_string().contains("prefix-caching"), "the variant second: {:#}", configurations[1]);
    let ((first_off, fourth_off, _), (_, fourth_on, hit_rate)) = (later_ttft[0], later_ttft[1]);
    // Without a cache the fourth turn prefills four times the first's
    // prompt; with one, most of it is the conversation already seen.
    assert!(fourth_off > 1.5 * first_off, "no cache: turn 1 {first_off} ms, turn 4 {fourth_off} ms");
    assert!(fourth_on < 0.8 * fourth_off, "turn 4: {fourth_on} ms cached, {fourth_off} ms not");
    let hit_rate = hit_rate.expect("the cached engine's hit rate");
    assert!(hit_rate > 0.4, "prefix cache hit rate {hit_rate}");
    assert!(stdout.contains("Sessions:") && stdout.contains("Mean TTFT, later turns (ms):"), "{stdout}");
}
