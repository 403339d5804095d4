//! An engine's command line, written once: the agent starts engines with
//! it, and the reports show it (one line, or one argument a line) as the
//! reference documents print it, each argument as the matrix gives it.

use serde::{Deserialize, Serialize};

/// The inference engine a configuration runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    Vllm,
    Sglang,
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        }
    }

    /// The kind of this name (`vllm`, `sglang`), if it is one.
    pub fn from_name(name: &str) -> Option<EngineKind> {
        [EngineKind::Vllm, EngineKind::Sglang].into_iter().find(|k| k.as_str() == name)
    }

    /// The words that start this engine serving `model`, as its
    /// documentation gives them.
    fn program(self, model: &str) -> Vec<String> {
        let words: &[&str] = match self {
            EngineKind::Vllm => &["vllm", "serve"],
            EngineKind::Sglang => &["python3", "-m", "sglang.launch_server", "--model-path"],
        };
        words.iter().map(|w| (*w).to_owned()).chain([model.to_owned()]).collect()
    }
}

/// The command line that serves `model` with `args`: listening on `listen`
/// (host, port) when given, which the agent always gives and a report
/// never shows.
pub fn command(kind: EngineKind, model: &str, args: &[String], listen: Option<(&str, u16)>) -> Vec<String> {
    let mut words = kind.program(model);
    if let Some((host, port)) = listen {
        words.extend(["--host".to_owned(), host.to_owned(), "--port".to_owned(), port.to_string()]);
    }
    words.extend(args.iter().cloned());
    words
}

/// The serve command on one line, as a report shows it.
pub fn one_line(kind: EngineKind, model: &str, args: &[String]) -> String {
    command(kind, model, args, None).join(" ")
}

/// The serve command one argument a line, continued with `\`, as the
/// reference documents print a recommended command.
pub fn lines(kind: EngineKind, model: &str, args: &[String]) -> String {
    let head = kind.program(model).join(" ");
    std::iter::once(head).chain(args.iter().map(|a| format!("    {a}"))).collect::<Vec<_>>().join(" \\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn each_engine_is_started_as_its_documentation_says() {
        let a = args(&["--max-num-seqs", "64"]);
        assert_eq!(
            command(EngineKind::Vllm, "m", &a, Some(("127.0.0.1", 9))).join(" "),
            "vllm serve m --host 127.0.0.1 --port 9 --max-num-seqs 64"
        );
        assert_eq!(
            command(EngineKind::Sglang, "m", &a, None).join(" "),
            "python3 -m sglang.launch_server --model-path m --max-num-seqs 64"
        );
    }

    #[test]
    fn a_report_shows_the_command_on_one_line_or_one_argument_a_line() {
        let a = args(&["--max-model-len=32768", r#"--speculative-config={"method":"mtp"}"#]);
        assert_eq!(
            one_line(EngineKind::Vllm, "Qwen/Qwen3-8B", &a),
            r#"vllm serve Qwen/Qwen3-8B --max-model-len=32768 --speculative-config={"method":"mtp"}"#
        );
        assert_eq!(
            lines(EngineKind::Sglang, "m", &a),
            "python3 -m sglang.launch_server --model-path m \\\n    --max-model-len=32768 \\\n    \
             --speculative-config={\"method\":\"mtp\"}"
        );
        assert_eq!(lines(EngineKind::Vllm, "m", &[]), "vllm serve m");
        assert_eq!(EngineKind::from_name("sglang"), Some(EngineKind::Sglang));
        assert_eq!(EngineKind::from_name("trt"), None);
    }
}
