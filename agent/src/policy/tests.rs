//! The engine policy's parsing and checks, one boundary per table row.

use std::sync::Mutex;

use super::*;

fn policy(toml: &str) -> EnginePolicy {
    EnginePolicy::from_toml(toml, Path::new("agent.toml")).expect("a valid [engines] table")
}

fn parse_error(toml: &str) -> String {
    EnginePolicy::from_toml(toml, Path::new("/etc/benchfleet/agent.toml")).expect_err("an invalid table").to_string()
}

fn launch(runtime: &str) -> EngineLaunch {
    EngineLaunch { kind: "vllm".into(), model: "Qwen/Qwen3-8B".into(), runtime: runtime.into(), ..Default::default() }
}

fn docker(image: &str) -> EngineLaunch {
    EngineLaunch { image: image.into(), ..launch("docker") }
}

fn with_args(runtime: &str, args: &[&str]) -> EngineLaunch {
    EngineLaunch { args: args.iter().map(|a| a.to_string()).collect(), ..launch(runtime) }
}

/// The refusal's message, or "" when the policy allows the launch.
fn refusal(policy: &EnginePolicy, launch: &EngineLaunch) -> String {
    match policy.check(launch) {
        Ok(()) => String::new(),
        Err(e @ EngineError::NotAllowed { .. }) => e.to_string(),
        Err(other) => panic!("a refusal is NotAllowed, not {other:?}"),
    }
}

#[test]
fn defaults_run_the_vllm_and_sglang_images_and_nothing_else() {
    let p = policy("");
    assert_eq!(p, EnginePolicy::default());
    assert_eq!(p.images.iter().map(ToString::to_string).collect::<Vec<_>>(), DEFAULT_IMAGES);
    assert!(!p.process && !p.trust_remote_code && p.external_urls.is_empty() && p.process_env.is_empty());
    assert_eq!(policy("[gpu]\nallow_mig = true\n[docker]\nx = 1\n"), p, "other tables are other modules' business");
    let offered: Vec<&str> =
        ["docker", "process", "external", "kubernetes"].into_iter().filter(|r| p.offers(r)).collect();
    assert_eq!(offered, ["docker"]);
}

#[test]
fn every_key_of_the_table_is_read() {
    let p = policy(
        "[engines]\nimages = [\"nvcr.io/nvidia\", \"vllm/vllm-openai:v0.9.1\"]\nprocess = true\n\
         external_urls = [\"http://10.0.0.5:8000/\"]\ntrust_remote_code = true\nprocess_env = [\"LD_LIBRARY_PATH\"]\n",
    );
    assert_eq!(
        p.images.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["nvcr.io/nvidia", "vllm/vllm-openai:v0.9.1"]
    );
    assert!(p.process && p.trust_remote_code);
    assert_eq!(p.external_urls.len(), 1);
    assert_eq!(p.process_env, ["LD_LIBRARY_PATH"]);
    assert!(policy("[engines]\nimages = []\n").images.is_empty(), "an empty list allows no image");
    assert!(!policy("[engines]\nimages = []\n").offers("docker"), "so the docker runtime is not offered");
}

#[test]
fn a_bad_key_or_value_is_an_error_naming_it_and_the_file() {
    for (toml, expected) in [
        ("[engines]\nproces = true\n", "unknown field `proces`"),
        ("[engines]\ntrust-remote-code = true\n", "unknown field `trust-remote-code`"),
        ("[engines]\nprocess = \"yes\"\n", "process"),
        (
            "[engines]\nimages = [\"Vllm/vllm-openai\"]\n",
            "[engines] images: 'Vllm/vllm-openai' is not an image reference",
        ),
        ("[engines]\nimages = [\"vllm/x@sha256:abc\"]\n", "[engines] images: 'vllm/x@sha256:abc'"),
        ("[engines]\nimages = [\"vllm/x@md5:0123456789abcdef0123456789abcdef\"]\n", "is not sha256:<64 hex digits>"),
        ("[engines]\nexternal_urls = [\"10.0.0.5:8000\"]\n", "[engines] external_urls: '10.0.0.5:8000'"),
        ("[engines]\nexternal_urls = [\"http://u:p@h:1/\"]\n", "has a user, a query or a fragment"),
        ("[engines]\nprocess_env = [\"A=B\"]\n", "[engines] process_env: 'A=B' is not the name"),
    ] {
        let message = parse_error(toml);
        assert!(message.starts_with("the agent config /etc/benchfleet/agent.toml"), "{message}");
        assert!(message.contains(expected), "{toml:?}: {message}");
    }
}

/// Whether `entries` allow `image`.
fn check_image(entries: &[&str], image: &str, allowed: bool) {
    let p = EnginePolicy {
        images: entries.iter().map(|e| ImageRule::parse(e).expect("a valid entry")).collect(),
        ..EnginePolicy::default()
    };
    let refused = refusal(&p, &docker(image));
    assert_eq!(refused.is_empty(), allowed, "{entries:?} {image}: {refused}");
    if !allowed {
        assert!(refused.contains(&format!("'{image}'")), "the refusal names the image: {refused}");
    }
}

#[test]
fn a_repository_allows_its_tags_digests_and_what_lies_under_it() {
    let sha = format!("sha256:{}", "a".repeat(64));
    for image in
        ["vllm/vllm-openai", "vllm/vllm-openai:v0.9.1", &format!("vllm/vllm-openai@{sha}"), "vllm/vllm-openai/sub:x"]
    {
        check_image(&["vllm/vllm-openai"], image, true);
    }
    // On whole path components only.
    for image in ["vllm/vllm-openai-evil", "vllm/vllm-openai-evil:v1", "vllm/vllm", "vllm", "evil/vllm-openai"] {
        check_image(&["vllm/vllm-openai"], image, false);
    }
    check_image(&["nvcr.io/nvidia"], "nvcr.io/nvidia/tritonserver:24.05-py3", true);
    check_image(&["nvcr.io/nvidia"], "nvcr.io/nvidiax/tritonserver:24.05-py3", false);
    check_image(&["nvcr.io/nvidia"], "nvidia/tritonserver", false);
}

#[test]
fn docker_hub_names_are_compared_as_docker_reads_them() {
    for image in ["docker.io/vllm/vllm-openai:v1", "index.docker.io/vllm/vllm-openai:v1", "vllm/vllm-openai:v1"] {
        check_image(&["vllm/vllm-openai"], image, true);
        check_image(&["docker.io/vllm/vllm-openai"], image, true);
    }
    // One name is an official image: `ubuntu` is docker.io/library/ubuntu.
    check_image(&["ubuntu"], "docker.io/library/ubuntu:24.04", true);
    check_image(&["docker.io/library/ubuntu"], "ubuntu", true);
    check_image(&["ubuntu"], "someone/ubuntu", false);
    // Another registry is another image, whatever its path.
    check_image(&["vllm/vllm-openai"], "evil.example/vllm/vllm-openai:v1", false);
    check_image(&["vllm/vllm-openai"], "localhost:5000/vllm/vllm-openai", false);
    check_image(&["localhost:5000/sim"], "localhost:5000/sim:dev", true);
}

#[test]
fn a_tag_or_a_digest_entry_allows_that_one_only() {
    let (a, b) = (format!("sha256:{}", "a".repeat(64)), format!("sha256:{}", "b".repeat(64)));
    let pinned = format!("vllm/vllm-openai@{a}");
    check_image(&[&pinned], &format!("vllm/vllm-openai@{a}"), true);
    check_image(&[&pinned], &format!("docker.io/vllm/vllm-openai:v1@{a}"), true);
    check_image(&[&pinned], &format!("vllm/vllm-openai@{b}"), false);
    check_image(&[&pinned], "vllm/vllm-openai:v1", false);
    check_image(&[&pinned], "vllm/vllm-openai", false);
    check_image(&[&pinned], &format!("evil/vllm-openai@{a}"), false);
    check_image(&["vllm/vllm-openai:v0.9.1"], "vllm/vllm-openai:v0.9.1", true);
    check_image(&["vllm/vllm-openai:v0.9.1"], "docker.io/vllm/vllm-openai:v0.9.1", true);
    for image in ["vllm/vllm-openai:v0.9.2", "vllm/vllm-openai", &format!("vllm/vllm-openai:v0.9.1@{b}")] {
        check_image(&["vllm/vllm-openai:v0.9.1"], image, false);
    }
}

#[test]
fn a_refused_image_says_which_key_allows_it() {
    assert_eq!(
        refusal(&EnginePolicy::default(), &docker("evil/miner:latest")),
        "image 'evil/miner:latest' is not allowed on this agent: add it to [engines] images in the agent's config file"
    );
    let odd = refusal(&EnginePolicy::default(), &docker("Evil/Miner"));
    assert!(odd.contains("image 'Evil/Miner' is not allowed on this agent: it is not an image reference"), "{odd}");
    assert!(refusal(&EnginePolicy::default(), &docker("")).contains("a docker engine without an image"));
}

#[test]
fn the_simulator_s_image_is_allowed_with_simulated_engines() {
    let simulated = EnginePolicy { simulator: true, ..EnginePolicy::default() };
    for image in ["benchfleet-sim:dev", "benchfleet-sim", "docker.io/library/benchfleet-sim:dev"] {
        assert_eq!(refusal(&simulated, &docker(image)), "", "{image}");
        assert_ne!(refusal(&EnginePolicy::default(), &docker(image)), "", "{image} without --sim-engines");
    }
    assert_ne!(refusal(&simulated, &docker("someone/benchfleet-sim:dev")), "");
    assert_ne!(refusal(&simulated, &docker("localhost:5000/benchfleet-sim:dev")), "");
    assert_eq!(refusal(&simulated, &docker("vllm/vllm-openai:v1")), "", "the configured images still are");
}

#[test]
fn remote_code_is_refused_in_any_spelling_unless_allowed() {
    let deny = EnginePolicy::default();
    let allow = EnginePolicy { trust_remote_code: true, ..EnginePolicy::default() };
    for arg in [
        "--trust-remote-code",
        "--trust-remote-code=true",
        "--trust-remote-code=false",
        "--trust_remote_code",
        "--trust_remote_code=1",
        "--trust-remote",
        "--trust",
    ] {
        for runtime in ["docker", "process"] {
            let mut launch = with_args(runtime, &["--max-model-len=4096", arg]);
            launch.image = "vllm/vllm-openai:v1".into();
            let (process_deny, process_allow) =
                (EnginePolicy { process: true, ..deny.clone() }, EnginePolicy { process: true, ..allow.clone() });
            let refused = refusal(&process_deny, &launch);
            assert_eq!(
                refused,
                format!(
                    "the engine argument '{arg}' (it runs the Python code of the model's repository) is not allowed \
                     on this agent: set trust_remote_code = true in [engines] in the agent's config file"
                )
            );
            assert_eq!(refusal(&process_allow, &launch), "", "{arg} with trust_remote_code = true");
        }
    }
    for arg in ["--trust-request-chat-template", "--no-trust-remote-code", "trust-remote-code", "--model=x"] {
        assert_eq!(
            refusal(&EnginePolicy { process: true, ..deny.clone() }, &with_args("process", &[arg])),
            "",
            "{arg}"
        );
    }
}

#[test]
fn the_engine_s_host_and_port_are_never_the_matrix_s() {
    let everything = EnginePolicy { process: true, trust_remote_code: true, ..EnginePolicy::default() };
    for arg in ["--host", "--host=0.0.0.0", "--port", "--port=9000", "--por=1", "--ho", "--po"] {
        let refused = refusal(&everything, &with_args("process", &["--max-num-seqs=8", arg, "1"]));
        assert!(refused.starts_with(&format!("the engine argument '{arg}' is not allowed on this agent")), "{refused}");
        assert!(refused.contains("the agent chooses the engine's host and port"), "{refused}");
    }
    for arg in ["--hosts-file", "--port-range=1", "--max-model-len", "0.0.0.0", "9000", "--p", "--h"] {
        let refused = refusal(&everything, &with_args("process", &[arg]));
        // `--p` and `--h` are ambiguous: the engines reject them; refusing them is no loss.
        assert_eq!(refused.is_empty(), !matches!(arg, "--p" | "--h"), "{arg}: {refused}");
    }
}

#[test]
fn a_model_that_is_a_flag_is_refused() {
    let p = EnginePolicy { process: true, ..EnginePolicy::default() };
    let launch = EngineLaunch { model: "--trust-remote-code".into(), ..launch("process") };
    assert!(refusal(&p, &launch).starts_with("the model name '--trust-remote-code' is not allowed"));
}

#[test]
fn local_commands_need_process_or_the_simulator() {
    let refused = refusal(&EnginePolicy::default(), &launch("process"));
    assert_eq!(
        refused,
        "the process runtime (engines run as local commands) is not allowed on this agent: set process = true in \
         [engines] in the agent's config file (or run the agent with --sim-engines)"
    );
    assert_eq!(refusal(&policy("[engines]\nprocess = true\n"), &launch("process")), "");
    assert_eq!(refusal(&EnginePolicy { simulator: true, ..EnginePolicy::default() }, &launch("process")), "");
    assert!(!EnginePolicy::default().offers("process"));
    assert!(EnginePolicy { simulator: true, ..EnginePolicy::default() }.offers("process"));
    assert!(refusal(&EnginePolicy::default(), &launch("ssh")).contains("the runtime 'ssh' is not allowed"));
}

/// Whether a policy of `entries` allows an external engine at `url`.
fn check_url(entries: &[&str], url: &str, allowed: bool) {
    let p = EnginePolicy {
        external_urls: entries.iter().map(|e| ExternalUrl::try_from(e.to_string()).expect("a valid URL")).collect(),
        ..EnginePolicy::default()
    };
    let launch = EngineLaunch { url: Some(url.into()), ..launch("external") };
    let refused = refusal(&p, &launch);
    assert_eq!(refused.is_empty(), allowed, "{entries:?} {url}: {refused}");
    if !allowed {
        assert!(refused.contains(&format!("the external engine at '{url}'")), "{refused}");
        assert!(refused.contains("add its URL to [engines] external_urls"), "{refused}");
    }
}

#[test]
fn external_engines_only_at_listed_urls() {
    check_url(&[], "http://10.0.0.5:8000", false);
    for url in ["http://10.0.0.5:8000", "http://10.0.0.5:8000/", "HTTP://10.0.0.5:8000", " http://10.0.0.5:8000//"] {
        check_url(&["http://10.0.0.5:8000/"], url, true);
    }
    check_url(&["http://engine.lab"], "http://ENGINE.lab:80/", true);
    check_url(&["https://engine.lab/v1/"], "https://engine.lab:443/v1", true);
    for url in [
        "http://10.0.0.5:8001",
        "https://10.0.0.5:8000",
        "http://10.0.0.6:8000",
        "http://10.0.0.5:8000/other",
        "http://10.0.0.5:8000?x=1",
        "http://user@10.0.0.5:8000",
        "not a url",
    ] {
        check_url(&["http://10.0.0.5:8000"], url, false);
    }
    check_url(&["http://10.0.0.5:8000/a"], "http://10.0.0.5:8000/a/b", false);
    let p = policy("[engines]\nexternal_urls = [\"http://10.0.0.5:8000\"]\n");
    assert!(p.offers("external") && !EnginePolicy::default().offers("external"));
    assert!(refusal(&p, &launch("external")).contains("an external engine without a url"));
}

/// A runtime that records what it was asked to do.
#[derive(Default)]
struct Recording(Mutex<Vec<&'static str>>);

#[tonic::async_trait]
impl EngineRuntime for Recording {
    async fn prepare(&self, _: &EngineLaunch, _: &(dyn Fn(String) + Send + Sync)) -> Result<(), EngineError> {
        self.0.lock().expect("not poisoned").push("prepare");
        Ok(())
    }
    async fn start(&self, _: &EngineLaunch) -> Result<Box<dyn Engine>, EngineError> {
        self.0.lock().expect("not poisoned").push("start");
        Err(EngineError::Unsupported("a recording".into()))
    }
}

#[tokio::test]
async fn an_offered_runtime_checks_before_it_prepares_or_starts() {
    let inner = Arc::new(Recording::default());
    let p = Arc::new(EnginePolicy::default());
    let offered = p.offered([
        ("docker".to_owned(), inner.clone() as Arc<dyn EngineRuntime>),
        ("process".to_owned(), inner.clone() as Arc<dyn EngineRuntime>),
    ]);
    assert_eq!(offered.keys().collect::<Vec<_>>(), ["docker"], "the process runtime is not offered by default");
    let docker = &offered["docker"];
    let refused = docker.prepare(&self::docker("evil/miner:latest"), &|_| {}).await.expect_err("refused");
    assert!(matches!(refused, EngineError::NotAllowed { .. }), "{refused:?}");
    assert!(docker.start(&self::docker("evil/miner:latest")).await.is_err());
    assert!(inner.0.lock().expect("not poisoned").is_empty(), "a refused image never reaches a pull");
    docker.prepare(&self::docker("vllm/vllm-openai:v1"), &|_| {}).await.expect("allowed");
    let _ = docker.start(&self::docker("vllm/vllm-openai:v1")).await;
    assert_eq!(*inner.0.lock().expect("not poisoned"), ["prepare", "start"]);
}

#[test]
fn not_offered_runtimes_name_what_would_offer_them() {
    assert!(not_offered("process").contains("process = true in [engines]"));
    assert!(not_offered("external").contains("[engines] external_urls"));
    assert!(not_offered("docker").contains("[engines] images"));
}

#[test]
fn the_example_config_file_shows_the_defaults() {
    let example = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/agent.example.toml"));
    assert_eq!(EnginePolicy::from_file(example).expect("the example is valid"), EnginePolicy::default());
}
