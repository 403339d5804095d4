//! The data-driven cases of `tests/inputs/streams`: a server that answers
//! each completion request with the file its model names, byte for byte,
//! and the real `benchfleet-loadgen` binary run against it, once with each
//! reply written at once and once a byte at a time (so that every line end
//! and every frame is split between reads).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpListener;

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/inputs/streams")
}

/// The server: `GET /v1/models` lists every case; a completion request gets
/// the reply of the file its `model` names.
async fn serve(byte_by_byte: bool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(connection(tcp, byte_by_byte));
        }
    });
    url
}

async fn connection(mut tcp: tokio::net::TcpStream, byte_by_byte: bool) {
    let _ = tcp.set_nodelay(true);
    let mut buf = Vec::new();
    while let Some((head, body)) = crate::read_request(&mut tcp, &mut buf).await {
        let reply: Vec<u8> = if head.starts_with("get /v1/models") {
            let ids: Vec<String> = std::fs::read_dir(cases_dir())
                .expect("the cases")
                .filter_map(|e| {
                    e.ok()?.file_name().to_str()?.strip_suffix(".http").map(|s| format!("{{\"id\":\"{s}\"}}"))
                })
                .collect();
            let list = format!("{{\"object\":\"list\",\"data\":[{}]}}", ids.join(","));
            format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{list}", list.len())
                .into_bytes()
        } else {
            let request: serde_json::Value = serde_json::from_slice(&body).expect("a JSON request");
            let model = request["model"].as_str().expect("a model").to_owned();
            assert!(model.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'), "{model}");
            std::fs::read(cases_dir().join(format!("{model}.http"))).expect("the case's file")
        };
        let text = String::from_utf8_lossy(&reply).to_ascii_lowercase();
        let framed = text.contains("content-length:") || text.contains("transfer-encoding: chunked");
        let keep = framed && !text.contains("connection: close");
        let written = if byte_by_byte {
            let mut result = Ok(());
            for b in &reply {
                result = tcp.write_all(std::slice::from_ref(b)).await;
                if result.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_micros(50)).await;
            }
            result
        } else {
            tcp.write_all(&reply).await
        };
        if written.is_err() || !keep {
            let _ = tcp.shutdown().await;
            return;
        }
    }
}

struct Case {
    file: String,
    ok: bool,
    words: Vec<String>,
}

fn cases() -> Vec<Case> {
    let list = std::fs::read_to_string(cases_dir().join("CASES")).expect("CASES");
    let mut out = Vec::new();
    for line in list.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let mut fields = line.splitn(3, char::is_whitespace).filter(|f| !f.is_empty());
        let file = fields.next().expect("a file").to_owned();
        let rest: Vec<&str> = line[file.len()..].trim().splitn(2, char::is_whitespace).collect();
        let ok = match rest[0] {
            "ok" => true,
            "fail" => false,
            other => panic!("{file}: unknown verdict {other}"),
        };
        let words = rest.get(1).map_or(Vec::new(), |w| w.split(" | ").map(|s| s.trim().to_owned()).collect());
        assert!(cases_dir().join(&file).is_file(), "{file} is not in tests/inputs/streams");
        out.push(Case { file, ok, words });
    }
    // Every file is a case.
    for e in std::fs::read_dir(cases_dir()).expect("dir") {
        let name = e.expect("entry").file_name().to_string_lossy().into_owned();
        if name.ends_with(".http") {
            assert!(out.iter().any(|c| c.file == name), "{name} has no line in CASES");
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_case_gets_its_verdict() {
    let _machine = crate::alone().await;
    // Dozens of loadgen processes: not beside a timing test.
    let cases = cases();
    assert!(cases.len() >= 15);
    let dir = tempfile::tempdir().expect("tempdir");
    for byte_by_byte in [false, true] {
        let url = serve(byte_by_byte).await;
        for case in &cases {
            let model = case.file.trim_end_matches(".http");
            let records = dir.path().join(format!("{model}-{byte_by_byte}.jsonl"));
            let mut command = Command::new(env!("CARGO_BIN_EXE_benchfleet-loadgen"));
            command.args([
                "--base-url",
                &url,
                "--model",
                model,
                "--num-prompts",
                "2",
                "--max-concurrency",
                "1",
                "--random-input-len",
                "5",
                "--random-output-len",
                "3",
                "--idle-timeout",
                "5",
                "--timeout",
                "20",
                "--quiet",
            ]);
            command.arg("--save-records").arg(&records);
            let out = tokio::task::spawn_blocking(move || command.output()).await.expect("join").expect("loadgen runs");
            let said = format!(
                "{} ({}): exit {:?}\nstdout:\n{}\nstderr:\n{}",
                case.file,
                if byte_by_byte { "a byte at a time" } else { "at once" },
                out.status.code(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let lines = std::fs::read_to_string(&records).unwrap_or_default();
            let records: Vec<serde_json::Value> =
                lines.lines().map(|l| serde_json::from_str(l).expect("a JSON record")).collect();
            assert_eq!(records.len(), 2, "{said}");
            if case.ok {
                assert_eq!(out.status.code(), Some(0), "{said}");
                for r in &records {
                    assert_eq!(r["outcome"], "ok", "{said}\n{r}");
                    assert_eq!(r["output_tokens"], 3, "{said}\n{r}");
                }
            } else {
                assert_eq!(out.status.code(), Some(4), "{said}");
                for r in &records {
                    assert_ne!(r["outcome"], "ok", "{said}\n{r}");
                    if r["outcome"] == "malformed" {
                        assert!(r["first_token_ns"].is_null(), "no TTFT for a reply that is not one: {said}\n{r}");
                    }
                    let error = format!(
                        "{}: {}",
                        r["outcome"].as_str().unwrap_or_default(),
                        r["error"].as_str().unwrap_or_default()
                    );
                    for w in &case.words {
                        assert!(error.contains(w.as_str()), "{said}\nthe error {error:?} does not say {w:?}");
                    }
                }
            }
        }
    }
}
