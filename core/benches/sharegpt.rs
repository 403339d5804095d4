//! Reading a large ShareGPT file: `core::sharegpt::read` (a stream, keeping
//! only what is sent) against the parser it replaced (the whole file read,
//! then every conversation decoded), side by side on one generated file,
//! each in a fresh process so that its peak RSS is its own.
//!
//! `cargo bench -p benchfleet-core --bench sharegpt -- [--size-mb N]`

use std::io::Write as _;
use std::path::Path;
use std::time::Instant;

/// One ShareGPT-like conversation: 2 to 8 turns of 100 to 2,000 characters.
fn conversation(i: u64, out: &mut impl std::io::Write) -> std::io::Result<()> {
    let mix = |x: u64| x.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17) ^ x;
    let turns = 2 + mix(i) % 7;
    write!(out, "{{\"id\": \"c{i}\", \"conversations\": [")?;
    for t in 0..turns {
        let from = if t % 2 == 0 { "human" } else { "gpt" };
        let len = 100 + mix(i * 31 + t) % 1900;
        let words = "the river stone and the paper garden of light ";
        let text: String = words.chars().cycle().take(len as usize).collect();
        let sep = if t + 1 == turns { "" } else { ", " };
        write!(out, "{{\"from\": \"{from}\", \"value\": \"{text}\"}}{sep}")?;
    }
    write!(out, "]}}")
}

fn generate(path: &Path, bytes: u64) -> std::io::Result<u64> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    out.write_all(b"[\n")?;
    let mut i = 0;
    loop {
        conversation(i, &mut out)?;
        i += 1;
        if out.get_ref().metadata()?.len() >= bytes {
            break;
        }
        out.write_all(b",\n")?;
    }
    out.write_all(b"\n]\n")?;
    out.flush()?;
    Ok(i)
}

/// The parser before streaming: the file's bytes, then every entry with all
/// its turns as owned strings, then the exchanges copied out.
mod whole {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum RawEntry {
        Conversation { conversations: Vec<Turn> },
        Broken(serde::de::IgnoredAny),
    }

    #[derive(serde::Deserialize)]
    struct Turn {
        from: String,
        value: String,
    }

    pub fn read(path: &std::path::Path) -> usize {
        let bytes = std::fs::read(path).expect("read");
        let raw: Vec<RawEntry> = serde_json::from_slice(&bytes).expect("parse");
        let used: Vec<(String, String)> = raw
            .into_iter()
            .filter_map(|e| match e {
                RawEntry::Conversation { conversations } => {
                    let human = conversations.iter().position(|t| t.from == "human")?;
                    let reply = conversations.get(human + 1).filter(|t| t.from == "gpt")?;
                    Some((conversations[human].value.clone(), reply.value.clone()))
                }
                RawEntry::Broken(_) => None,
            })
            .collect();
        used.len()
    }
}

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    if let (Some(mode), Some(file)) = (arg("--mode"), arg("--file")) {
        let path = Path::new(&file);
        let began = Instant::now();
        let used = match mode.as_str() {
            "stream" => benchfleet_core::sharegpt::read(path, &file).expect("reads").entries.len(),
            _ => whole::read(path),
        };
        println!("{mode} {used} {:.2} {:.0}", began.elapsed().as_secs_f64(), peak_rss_mib());
        return;
    }
    let size_mb: u64 = arg("--size-mb").and_then(|s| s.parse().ok()).unwrap_or(300);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("sharegpt.json");
    let conversations = generate(&file, size_mb << 20).expect("generate");
    let size = std::fs::metadata(&file).expect("file").len() as f64 / (1 << 20) as f64;
    println!("a ShareGPT-like file of {size:.0} MiB, {conversations} conversations");
    let mut results = Vec::new();
    for mode in ["whole", "stream"] {
        let out = std::process::Command::new(std::env::current_exe().expect("exe"))
            .args(["--mode", mode, "--file", file.to_str().expect("utf-8")])
            .output()
            .expect("runs");
        let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 4, "{line} {}", String::from_utf8_lossy(&out.stderr));
        let (secs, rss): (f64, f64) = (f[2].parse().expect("secs"), f[3].parse().expect("rss"));
        println!("{mode:>6}: {} used, {secs:.2} s, peak RSS {rss:.0} MiB", f[1]);
        results.push((secs, rss));
    }
    let (whole, stream) = (results[0], results[1]);
    println!(
        "stream against whole: {:.2}x the time, {:.2}x the peak memory ({:.2} bytes of memory a byte of file)",
        stream.0 / whole.0,
        stream.1 / whole.1,
        stream.1 / size
    );
}
