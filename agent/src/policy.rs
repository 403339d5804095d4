//! What engines this agent runs: the `[engines]` table of its config file
//! (which images, whether local commands, which external URLs, which
//! engine flags) and the one check every launch passes before anything is
//! pulled or started. A matrix comes from whoever may submit one; the host
//! is the operator's. A refusal says what was refused and which key allows
//! it, and is the configuration's fault: the job is not tried elsewhere.
//!
//! The binary offers only the runtimes its policy allows (`offered`), so
//! the controller places no group on an agent that would refuse its runtime,
//! and each offered runtime checks every launch first (`Checked`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::engine::{Engine, EngineError, EngineRuntime};
use crate::job::EngineLaunch;
use crate::verdict::PolicyError;

/// The images an agent runs when its config file names none.
pub const DEFAULT_IMAGES: [&str; 2] = ["vllm/vllm-openai", "lmsysorg/sglang"];

/// The simulator's image (`deploy/build-sim-image.sh`), allowed with
/// `--sim-engines`: as Docker reads it, `docker.io/library/benchfleet-sim`,
/// a name only Docker itself publishes under, so a pull cannot fetch
/// someone else's image by it.
pub const SIMULATOR_IMAGE: &str = "benchfleet-sim";

/// The `[engines]` table of the agent's config file (see
/// `deploy/agent.example.toml`). The defaults run the vLLM and SGLang images and
/// nothing else.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnginePolicy {
    /// The images the docker runtime may run: a repository, which allows
    /// it and what lies under it (by whole path components) at any tag or
    /// digest; `name:tag`, that tag only; `name@sha256:…`, that digest only.
    pub images: Vec<ImageRule>,
    /// Whether engines may run as local commands (the `process` runtime).
    pub process: bool,
    /// The URLs at which the `external` runtime may use an engine someone
    /// else started; none by default.
    pub external_urls: Vec<ExternalUrl>,
    /// Whether an engine may be given `--trust-remote-code`, which runs the
    /// Python code of the model's repository.
    pub trust_remote_code: bool,
    /// Names of the agent's environment variables that process engines get
    /// besides `PATH`, `HOME`, `LANG`, `LC_ALL` and `TMPDIR` (e.g.
    /// `LD_LIBRARY_PATH`): the rest of the agent's environment stays with it.
    pub process_env: Vec<String>,
    /// `--sim-engines`: engines are the simulator, so the process runtime
    /// is offered and the simulator's image allowed. Not from the file.
    #[serde(skip)]
    pub simulator: bool,
}

impl Default for EnginePolicy {
    fn default() -> Self {
        EnginePolicy {
            images: DEFAULT_IMAGES.iter().map(|i| ImageRule::parse(i).expect("the default images parse")).collect(),
            process: false,
            external_urls: Vec::new(),
            trust_remote_code: false,
            process_env: Vec::new(),
            simulator: false,
        }
    }
}

impl EnginePolicy {
    /// Reads the `[engines]` table of an agent config file; the defaults
    /// where the file has none. Other tables belong to other parts of the
    /// agent.
    pub fn from_file(path: &Path) -> Result<EnginePolicy, PolicyError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| PolicyError::Read { path: path.to_owned(), source })?;
        EnginePolicy::from_toml(&text, path)
    }

    /// Parses the `[engines]` table of an agent config file's text; `path`
    /// names it in errors. A key it does not know is an error that names it.
    pub fn from_toml(text: &str, path: &Path) -> Result<EnginePolicy, PolicyError> {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            engines: EnginePolicy,
        }
        let file: File =
            toml::from_str(text).map_err(|e| PolicyError::Parse { path: path.to_owned(), message: e.to_string() })?;
        if let Some(bad) = file.engines.process_env.iter().find(|n| n.is_empty() || n.contains(['=', '\0'])) {
            return Err(PolicyError::Parse {
                path: path.to_owned(),
                message: format!("[engines] process_env: '{bad}' is not the name of an environment variable"),
            });
        }
        Ok(file.engines)
    }

    /// Whether the agent offers `runtime` to the controller at all.
    pub fn offers(&self, runtime: &str) -> bool {
        match runtime {
            "docker" => !self.images.is_empty() || self.simulator,
            "process" => self.process || self.simulator,
            "external" => !self.external_urls.is_empty(),
            _ => false,
        }
    }

    /// The runtimes the agent offers, by name, of those it could: each
    /// checks its launches against this policy first. Those the policy does
    /// not offer are left out, so the controller is never told of them.
    pub fn offered(
        self: &Arc<Self>,
        runtimes: impl IntoIterator<Item = (String, Arc<dyn EngineRuntime>)>,
    ) -> HashMap<String, Arc<dyn EngineRuntime>> {
        runtimes
            .into_iter()
            .filter(|(name, _)| self.offers(name))
            .map(|(name, runtime)| {
                let checked: Arc<dyn EngineRuntime> = Arc::new(Checked { policy: self.clone(), runtime });
                (name, checked)
            })
            .collect()
    }

    /// The values of `process_env` in the agent's environment (those set).
    pub fn passed_env(&self) -> Vec<(String, String)> {
        self.process_env.iter().filter_map(|name| Some((name.clone(), std::env::var(name).ok()?))).collect()
    }

    /// Whether this agent may start `launch`: its runtime, image or URL,
    /// model and flags. Called before anything is pulled or started.
    pub fn check(&self, launch: &EngineLaunch) -> Result<(), EngineError> {
        match launch.runtime.as_str() {
            "docker" => self.check_image(&launch.image)?,
            "process" if !self.offers("process") => {
                return Err(refused(
                    "the process runtime (engines run as local commands)",
                    "set process = true in [engines] in the agent's config file (or run the agent with --sim-engines)",
                ));
            }
            "process" => {}
            "external" => self.check_url(launch.url.as_deref())?,
            other => {
                return Err(refused(format!("the runtime '{other}'"), "the runtimes are docker, process and external"));
            }
        }
        if launch.model.starts_with('-') {
            return Err(refused(
                format!("the model name '{}'", launch.model),
                "a model is named by its repository or path, never by a flag",
            ));
        }
        launch.args.iter().try_for_each(|arg| self.check_arg(arg))
    }

    fn check_image(&self, image: &str) -> Result<(), EngineError> {
        if image.is_empty() {
            return Err(refused("a docker engine without an image", "name its image in the matrix's engine"));
        }
        let reference = ImageRef::parse(image)
            .map_err(|why| refused(format!("image '{image}'"), format!("it is not an image reference: {why}")))?;
        let simulator =
            self.simulator.then(|| ImageRule::parse(SIMULATOR_IMAGE).expect("the simulator's image parses"));
        if self.images.iter().chain(&simulator).any(|rule| rule.allows(&reference)) {
            return Ok(());
        }
        Err(refused(format!("image '{image}'"), "add it to [engines] images in the agent's config file"))
    }

    fn check_url(&self, url: Option<&str>) -> Result<(), EngineError> {
        let Some(url) = url else {
            return Err(refused("an external engine without a url", "name its url in the matrix's engine"));
        };
        let allowed = normal_url(url).is_ok_and(|normal| self.external_urls.iter().any(|u| u.normal == normal));
        if allowed {
            return Ok(());
        }
        Err(refused(
            format!("the external engine at '{url}'"),
            "add its URL to [engines] external_urls in the agent's config file",
        ))
    }

    fn check_arg(&self, arg: &str) -> Result<(), EngineError> {
        let Some(flag) = flag_name(arg) else { return Ok(()) };
        if !self.trust_remote_code && sets(&flag, "--trust-remote-code") {
            return Err(refused(
                format!("the engine argument '{arg}' (it runs the Python code of the model's repository)"),
                "set trust_remote_code = true in [engines] in the agent's config file",
            ));
        }
        if sets(&flag, "--host") || sets(&flag, "--port") {
            return Err(refused(
                format!("the engine argument '{arg}'"),
                "the agent chooses the engine's host and port, and no key changes that; \
                 remove it from the matrix's engine args",
            ));
        }
        Ok(())
    }
}

fn refused(what: impl Into<String>, allow: impl Into<String>) -> EngineError {
    EngineError::NotAllowed { what: what.into(), allow: allow.into() }
}

/// The flag an argument sets as the engines' argparse reads it (vLLM takes
/// `_` for `-`), without a value: `--trust_remote_code=1` is
/// `--trust-remote-code`. None for an argument that is no `--` flag.
fn flag_name(arg: &str) -> Option<String> {
    let name = arg.strip_prefix("--")?;
    let name = name.split_once('=').map_or(name, |(name, _)| name);
    Some(format!("--{}", name.replace('_', "-")))
}

/// Whether `flag` sets `target`: it is `target`, or an abbreviation that
/// argparse expands to it (`--trust-rem`, `--po`). Shorter ones are
/// ambiguous and refused by the engine anyway.
fn sets(flag: &str, target: &str) -> bool {
    flag.len() > 2 && target.starts_with(flag)
}

/// A runtime the agent offers: every launch passes its policy's check
/// first, so nothing refused is ever pulled or started.
struct Checked {
    policy: Arc<EnginePolicy>,
    runtime: Arc<dyn EngineRuntime>,
}

#[tonic::async_trait]
impl EngineRuntime for Checked {
    async fn prepare(
        &self,
        launch: &EngineLaunch,
        progress: &(dyn Fn(String) + Send + Sync),
    ) -> Result<(), EngineError> {
        self.policy.check(launch)?;
        self.runtime.prepare(launch, progress).await
    }

    async fn start(&self, launch: &EngineLaunch) -> Result<Box<dyn Engine>, EngineError> {
        // Again, for a caller that did not prepare: `start` pulls too.
        self.policy.check(launch)?;
        self.runtime.start(launch).await
    }
}

/// Why a group's runtime is not among those the agent offers, for the
/// operator: which key or flag would offer it.
pub fn not_offered(runtime: &str) -> &'static str {
    match runtime {
        "process" => {
            "an agent runs engines as local commands only with process = true in [engines] in its config file, \
             or with --sim-engines"
        }
        "external" => "an agent uses external engines only at the URLs in [engines] external_urls in its config file",
        "docker" => {
            "an agent runs containers only with a Docker daemon (--docker) and images allowed in [engines] images \
             in its config file"
        }
        _ => "the runtimes are docker, process and external",
    }
}

/// An image reference as Docker reads it: `vllm/vllm-openai:v1` is the
/// repository `docker.io/vllm/vllm-openai` at the tag `v1`, `ubuntu` is
/// `docker.io/library/ubuntu`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ImageRef {
    /// Registry and path, e.g. `docker.io/vllm/vllm-openai`.
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
}

impl ImageRef {
    fn parse(reference: &str) -> Result<ImageRef, String> {
        let (rest, digest) = match reference.split_once('@') {
            Some((rest, digest)) => (rest, Some(digest)),
            None => (reference, None),
        };
        // A tag follows the last `:` of the last path component; a `:`
        // before a `/` is a registry's port.
        let last = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last..].rfind(':') {
            Some(i) => (&rest[..last + i], Some(&rest[last + i + 1..])),
            None => (rest, None),
        };
        let (registry, path) = match name.split_once('/') {
            Some((first, path)) if first.contains(['.', ':']) || first == "localhost" => (first, path),
            _ => ("docker.io", name),
        };
        let registry = registry.to_ascii_lowercase();
        let registry = if registry == "index.docker.io" { "docker.io".to_owned() } else { registry };
        if registry.is_empty() {
            return Err("it names no registry".to_owned());
        }
        if let Some(bad) = path.split('/').find(|c| {
            c.is_empty() || !c.chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._-".contains(ch))
        }) {
            return Err(format!("the path component '{bad}' is not lowercase letters, digits and . _ -"));
        }
        if let Some(tag) = tag
            && (tag.is_empty()
                || tag.len() > 128
                || !tag.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)))
        {
            return Err(format!("the tag '{tag}' is not 1 to 128 letters, digits and . _ -"));
        }
        if let Some(digest) = digest {
            let valid = digest.split_once(':').is_some_and(|(algorithm, hex)| {
                !algorithm.is_empty()
                    && algorithm.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && hex.len() >= 32
                    && hex.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
            });
            if !valid {
                return Err(format!("the digest '{digest}' is not ALGORITHM:HEX, e.g. sha256:<64 hex digits>"));
            }
        }
        // An official image of Docker Hub lives under `library/`.
        let path =
            if registry == "docker.io" && !path.contains('/') { format!("library/{path}") } else { path.to_owned() };
        Ok(ImageRef {
            repository: format!("{registry}/{path}"),
            tag: tag.map(str::to_owned),
            digest: digest.map(str::to_owned),
        })
    }
}

/// One entry of `[engines] images`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct ImageRule {
    /// As the config file says it, for messages.
    entry: String,
    repository: String,
    pin: Pin,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Pin {
    /// The repository, and repositories under it, at any tag or digest.
    Prefix,
    /// The repository at this tag, pulled by the tag.
    Tag(String),
    /// The repository at exactly this digest.
    Digest(String),
}

impl ImageRule {
    fn parse(entry: &str) -> Result<ImageRule, String> {
        let reference = ImageRef::parse(entry)?;
        let pin = match (reference.tag, reference.digest) {
            (_, Some(digest)) => {
                let sha256 = digest.strip_prefix("sha256:").is_some_and(|hex| hex.len() == 64);
                if !sha256 {
                    return Err(format!("the digest '{digest}' is not sha256:<64 hex digits>"));
                }
                Pin::Digest(digest)
            }
            (Some(tag), None) => Pin::Tag(tag),
            (None, None) => Pin::Prefix,
        };
        Ok(ImageRule { entry: entry.to_owned(), repository: reference.repository, pin })
    }

    /// Whether this entry allows the image. A repository allows itself and
    /// the repositories under it on whole path components: `vllm/vllm-openai`
    /// does not allow `vllm/vllm-openai-evil`.
    fn allows(&self, image: &ImageRef) -> bool {
        match &self.pin {
            Pin::Prefix => {
                image.repository == self.repository
                    || image.repository.strip_prefix(&self.repository).is_some_and(|rest| rest.starts_with('/'))
            }
            // With a digest, Docker pulls the digest whatever the tag says.
            Pin::Tag(tag) => {
                image.repository == self.repository && image.tag.as_ref() == Some(tag) && image.digest.is_none()
            }
            Pin::Digest(digest) => image.repository == self.repository && image.digest.as_ref() == Some(digest),
        }
    }
}

impl TryFrom<String> for ImageRule {
    type Error = String;
    fn try_from(entry: String) -> Result<Self, String> {
        ImageRule::parse(&entry).map_err(|why| {
            format!(
                "[engines] images: '{entry}' is not an image reference ({why}); \
                 name a repository (vllm/vllm-openai), a tag (vllm/vllm-openai:v0.9.1) \
                 or a digest (vllm/vllm-openai@sha256:…)"
            )
        })
    }
}

impl std::fmt::Display for ImageRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.entry)
    }
}

/// One entry of `[engines] external_urls`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct ExternalUrl {
    entry: String,
    /// `scheme://host:port/path`, without a trailing slash.
    normal: String,
}

impl TryFrom<String> for ExternalUrl {
    type Error = String;
    fn try_from(entry: String) -> Result<Self, String> {
        match normal_url(&entry) {
            Ok(normal) => Ok(ExternalUrl { entry, normal }),
            Err(why) => Err(format!("[engines] external_urls: '{entry}' {why}")),
        }
    }
}

/// A URL as its scheme, host, port (the scheme's own when it names none)
/// and path without a trailing slash: `http://Host:80/v1/` is
/// `http://host:80/v1`. One with a user, a query or a fragment is refused:
/// an engine's base URL has none.
fn normal_url(text: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(text.trim()).map_err(|e| format!("is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("is not an http or https URL".to_owned());
    }
    let host = url.host_str().ok_or("names no host")?;
    let port = url.port_or_known_default().ok_or("names no port")?;
    if !url.username().is_empty() || url.password().is_some() || url.query().is_some() || url.fragment().is_some() {
        return Err("has a user, a query or a fragment; an engine's URL is scheme://host:port/path".to_owned());
    }
    Ok(format!("{}://{host}:{port}{}", url.scheme(), url.path().trim_end_matches('/')))
}

#[cfg(test)]
mod tests;
