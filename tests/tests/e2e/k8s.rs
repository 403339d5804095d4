//! deploy/k8s/: every manifest passes `kubernetes-validate --strict` (the
//! API's own schemas, offline), and what the manifests name hangs together,
//! which no schema checks: the Secrets and ConfigMaps pods read exist (in the
//! manifests, or made by the `kubectl create` commands of docs/kubernetes.md)
//! with the keys they read; mounts name volumes; selectors select; Services
//! reach container ports; probes probe ports; the files and directories the
//! daemons' flags name are mounted, the controller's certificates among them;
//! the URLs agents use name a Service, resolve from the host's network and
//! are names `certs init --san` puts in the controller's certificate. Each
//! check is shown failing on a manifest broken in memory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize as _;
use serde_json::Value;

/// The namespace every object but the Namespace itself lives in.
pub(crate) const NAMESPACE: &str = "benchfleet";

/// Kubernetes versions the manifests are validated against besides the
/// newest the installed kubernetes-validate knows: the oldest supported.
const OLDEST_KUBERNETES: &str = "1.28.0";

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One document of a manifest file.
#[derive(Clone, Debug)]
pub(crate) struct Object {
    pub(crate) file: String,
    pub(crate) doc: Value,
}

impl Object {
    pub(crate) fn kind(&self) -> &str {
        self.doc["kind"].as_str().unwrap_or("")
    }

    pub(crate) fn name(&self) -> &str {
        self.doc["metadata"]["name"].as_str().unwrap_or("")
    }

    /// As the API server reads it: none given is `default`.
    pub(crate) fn namespace(&self) -> &str {
        self.doc["metadata"]["namespace"].as_str().unwrap_or("default")
    }

    fn what(&self) -> String {
        format!("{}: {} {}", self.file, self.kind(), self.name())
    }

    /// A workload's pod template: its spec and its labels.
    pub(crate) fn pod(&self) -> Option<(&Value, &Value)> {
        let template = match self.kind() {
            "Pod" => return Some((&self.doc["spec"], &self.doc["metadata"]["labels"])),
            "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => &self.doc["spec"]["template"],
            "CronJob" => &self.doc["spec"]["jobTemplate"]["spec"]["template"],
            _ => return None,
        };
        Some((&template["spec"], &template["metadata"]["labels"]))
    }
}

/// deploy/k8s/*.yaml, in the order `kubectl apply -f deploy/k8s/` applies them.
pub(crate) fn manifest_files() -> Vec<PathBuf> {
    let dir = root().join("deploy/k8s");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every document of every manifest file.
pub(crate) fn manifests() -> Vec<Object> {
    let files = manifest_files();
    assert!(!files.is_empty(), "deploy/k8s/ holds no .yaml file");
    files
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let file = format!("deploy/k8s/{}", path.file_name().expect("a file name").to_string_lossy());
            parse(&file, &text)
        })
        .collect()
}

fn parse(file: &str, text: &str) -> Vec<Object> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{file}: {e}")))
        .filter(|doc| !doc.is_null())
        .map(|doc| Object { file: file.to_owned(), doc })
        .collect()
}

/// What docs/kubernetes.md has the operator make with kubectl and `certs init`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Docs {
    /// (namespace, kind, name) of each `kubectl create secret generic` and
    /// `kubectl create configmap`, with the keys it gives.
    created: BTreeMap<(String, String, String), BTreeSet<String>>,
    /// The `--san` names of `benchfleet certs init`.
    sans: BTreeSet<String>,
}

pub(crate) fn docs_text() -> String {
    let path = root().join("docs/kubernetes.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The shell commands of the fenced code blocks, continuation lines joined,
/// each as its words up to a pipe, a comment or a `&`.
fn commands(markdown: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut in_code = false;
    let mut pending = String::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            pending.clear();
            continue;
        }
        if !in_code {
            continue;
        }
        let line = line.trim();
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let command = std::mem::take(&mut pending);
        let mut words = Vec::new();
        for word in command.split_whitespace() {
            if word.starts_with('#') || word == "|" || word == "&" || word == "&&" {
                break;
            }
            words.push(word.trim_matches(|c| c == '"' || c == '\'').to_owned());
        }
        if !words.is_empty() {
            out.push(words);
        }
    }
    out
}

/// The value of `--flag VALUE` or `--flag=VALUE` (and of `-n VALUE` for
/// kubectl's namespace), each time it is given.
fn flag_values(words: &[String], flags: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, word) in words.iter().enumerate() {
        for flag in flags {
            if word == flag {
                out.extend(words.get(i + 1).cloned());
            } else if let Some(value) = word.strip_prefix(&format!("{flag}=")) {
                out.push(value.to_owned());
            }
        }
    }
    out
}

pub(crate) fn docs(markdown: &str) -> Docs {
    let mut docs = Docs::default();
    for words in commands(markdown) {
        let at = |seq: &[&str]| words.windows(seq.len()).position(|w| w.iter().zip(seq).all(|(a, b)| a == b));
        if let Some(i) = at(&["certs", "init"]) {
            docs.sans.extend(flag_values(&words[i..], &["--san"]));
        }
        if !words.iter().any(|w| w == "kubectl") {
            continue;
        }
        let (kind, name) = if let Some(i) = at(&["create", "secret", "generic"]) {
            ("Secret", words.get(i + 3))
        } else if let Some(i) = at(&["create", "configmap"]) {
            ("ConfigMap", words.get(i + 2))
        } else {
            continue;
        };
        let Some(name) = name else { continue };
        let namespace = flag_values(&words, &["-n", "--namespace"]).pop().unwrap_or_else(|| "default".to_owned());
        let mut keys = BTreeSet::new();
        for source in flag_values(&words, &["--from-file"]) {
            // KEY=PATH, or PATH: the file's name is the key.
            let key = match source.split_once('=') {
                Some((key, _)) => key.to_owned(),
                None => source.rsplit('/').next().unwrap_or(&source).to_owned(),
            };
            keys.insert(key);
        }
        for literal in flag_values(&words, &["--from-literal"]) {
            keys.insert(literal.split_once('=').map_or(literal.clone(), |(k, _)| k.to_owned()));
        }
        docs.created.entry((namespace, kind.to_owned(), name.clone())).or_default().extend(keys);
    }
    docs
}

/// The files `benchfleet-controller` reads from `--pki-dir`.
fn controller_pki_files() -> [&'static str; 5] {
    use benchfleet_controller::pki;
    [pki::CA_CERT, pki::CA_KEY, pki::CONTROLLER_CERT, pki::CONTROLLER_KEY, pki::INGEST_KEY]
}

/// Flags whose value is a directory the daemon writes.
const WRITABLE_DIRS: &[&str] = &["--work-dir", "--data-dir", "--model-cache"];
/// Flags whose value is a file read from a mounted Secret or ConfigMap.
const MOUNTED_FILES: &[&str] = &["--token-file", "--config"];

fn strings(v: &Value) -> impl Iterator<Item = &str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str)
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned)))
        .collect()
}

fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Every container of a pod spec, init containers first.
fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers"].into_iter().flat_map(move |k| spec[k].as_array().into_iter().flatten())
}

/// Whether `port` (a number or a name) is one of the container's ports.
fn has_port(container: &Value, port: &Value) -> bool {
    container["ports"].as_array().into_iter().flatten().any(|p| match port {
        Value::String(name) => p["name"].as_str() == Some(name),
        Value::Number(n) => p["containerPort"].as_u64() == n.as_u64(),
        _ => false,
    })
}

/// The mount `path` lies under (the longest), and the path within it.
fn mount_of<'a>(container: &'a Value, path: &str) -> Option<(&'a Value, String)> {
    container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let at = m["mountPath"].as_str()?.trim_end_matches('/');
            let rest = path.strip_prefix(at)?;
            (rest.is_empty() || rest.starts_with('/')).then(|| (m, rest.trim_start_matches('/').to_owned()))
        })
        .max_by_key(|(m, _)| m["mountPath"].as_str().map_or(0, str::len))
}

/// `HOST` and `PORT` of `scheme://HOST:PORT/...`.
fn host_port(url: &str) -> Option<(String, u16)> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    let (host, port) = authority.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

/// Every problem with what the manifests name, as sentences naming the
/// object and the name at fault; none when all hangs together.
pub(crate) fn check(objects: &[Object], docs: &Docs) -> Vec<String> {
    let mut problems = Vec::new();
    // What exists: (namespace, kind, name) with the keys of Secrets and ConfigMaps.
    let mut keys: BTreeMap<(String, String, String), BTreeSet<String>> = docs.created.clone();
    let mut seen = BTreeSet::new();
    for o in objects {
        let id = (o.namespace().to_owned(), o.kind().to_owned(), o.name().to_owned());
        if !seen.insert(id.clone()) {
            problems.push(format!("{}: defined twice", o.what()));
        }
        let fields: &[&str] = match o.kind() {
            "Secret" => &["data", "stringData"],
            "ConfigMap" => &["data", "binaryData"],
            _ => &[],
        };
        let entry = keys.entry(id).or_default();
        for field in fields {
            entry.extend(o.doc[*field].as_object().into_iter().flatten().map(|(k, _)| k.clone()));
        }
    }
    let known = Known(keys);

    if !objects.iter().any(|o| o.kind() == "Namespace" && o.name() == NAMESPACE) {
        problems.push(format!("no manifest makes the Namespace {NAMESPACE}"));
    }
    for o in objects.iter().filter(|o| o.kind() != "Namespace") {
        if o.doc["metadata"]["namespace"].as_str() != Some(NAMESPACE) {
            problems.push(format!("{}: in namespace {}, not {NAMESPACE}", o.what(), o.namespace()));
        }
    }

    for o in objects {
        let Some((spec, template_labels)) = o.pod() else { continue };
        let pod = Pod::of(o, spec);
        check_workload(&pod, template_labels, &known, &mut problems);
        check_reads(&pod, &known, &mut problems);
        for c in containers(spec) {
            check_container(&pod, c, (objects, &known, docs), &mut problems);
        }
    }
    check_services(objects, &mut problems);
    problems
}

/// What exists: (namespace, kind, name), with the keys of Secrets and
/// ConfigMaps.
struct Known(BTreeMap<(String, String, String), BTreeSet<String>>);

impl Known {
    fn exists(&self, ns: &str, kind: &str, name: &str) -> bool {
        self.0.contains_key(&(ns.to_owned(), kind.to_owned(), name.to_owned()))
    }

    fn key_of(&self, ns: &str, kind: &str, name: &str) -> Option<&BTreeSet<String>> {
        self.0.get(&(ns.to_owned(), kind.to_owned(), name.to_owned()))
    }
}

/// A workload's pod: its spec, its volumes by name and its claim templates.
struct Pod<'a> {
    o: &'a Object,
    spec: &'a Value,
    ns: &'a str,
    volumes: BTreeMap<String, &'a Value>,
    claims: BTreeSet<&'a str>,
}

impl<'a> Pod<'a> {
    fn of(o: &'a Object, spec: &'a Value) -> Pod<'a> {
        let volumes = spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| Some((v["name"].as_str()?.to_owned(), v)))
            .collect();
        let claims = o.doc["spec"]["volumeClaimTemplates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["metadata"]["name"].as_str())
            .collect();
        Pod { o, spec, ns: o.namespace(), volumes, claims }
    }
}

/// The workload's selector selects its own pods; its service and service
/// account exist.
fn check_workload(pod: &Pod<'_>, template_labels: &Value, known: &Known, problems: &mut Vec<String>) {
    let (o, spec, ns) = (pod.o, pod.spec, pod.ns);
    let template_labels = labels(template_labels);
    // The workload's selector selects its own pods.
    if o.kind() != "Pod" {
        let selector = labels(&o.doc["spec"]["selector"]["matchLabels"]);
        if o.doc["spec"]["selector"]["matchExpressions"].is_array() {
            problems.push(format!("{}: selector.matchExpressions is not read by this check", o.what()));
        }
        if !selects(&selector, &template_labels) {
            problems.push(format!(
                "{}: selector {selector:?} does not select its pod template's labels {template_labels:?}",
                o.what()
            ));
        }
    }
    if o.kind() == "StatefulSet" {
        let service = o.doc["spec"]["serviceName"].as_str().unwrap_or("");
        if !known.exists(ns, "Service", service) {
            problems.push(format!("{}: serviceName {service:?} names no Service", o.what()));
        }
    }
    if let Some(account) = spec["serviceAccountName"].as_str()
        && !known.exists(ns, "ServiceAccount", account)
    {
        problems.push(format!("{}: serviceAccountName {account} names no ServiceAccount", o.what()));
    }
}

/// The Secrets and ConfigMaps the pod reads (volumes, env, envFrom) exist
/// and have the keys it reads.
fn check_reads(pod: &Pod<'_>, known: &Known, problems: &mut Vec<String>) {
    let (o, spec, ns, volumes) = (pod.o, pod.spec, pod.ns, &pod.volumes);
    // Volumes: the Secrets and ConfigMaps they read, with their keys.
    let mut reads = Vec::new();
    for volume in volumes.values() {
        for (kind, source, name_field) in [("Secret", "secret", "secretName"), ("ConfigMap", "configMap", "name")] {
            let s = &volume[source];
            if let Some(name) = s[name_field].as_str() {
                reads.push((format!("volume {}", volume["name"]), kind, name, strings_of(&s["items"], "key")));
            }
        }
        for p in volume["projected"]["sources"].as_array().into_iter().flatten() {
            for (kind, source) in [("Secret", "secret"), ("ConfigMap", "configMap")] {
                if let Some(name) = p[source]["name"].as_str() {
                    reads.push((
                        format!("volume {}", volume["name"]),
                        kind,
                        name,
                        strings_of(&p[source]["items"], "key"),
                    ));
                }
            }
        }
    }
    for c in containers(spec) {
        let cname = c["name"].as_str().unwrap_or("");
        for env in c["env"].as_array().into_iter().flatten() {
            for (kind, source) in [("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")] {
                let r = &env["valueFrom"][source];
                if let Some(name) = r["name"].as_str() {
                    let key = r["key"].as_str().unwrap_or("").to_owned();
                    reads.push((format!("container {cname}, env {}", env["name"]), kind, name, vec![key]));
                }
            }
        }
        for from in c["envFrom"].as_array().into_iter().flatten() {
            for (kind, source) in [("Secret", "secretRef"), ("ConfigMap", "configMapRef")] {
                if let Some(name) = from[source]["name"].as_str() {
                    reads.push((format!("container {cname}, envFrom"), kind, name, vec![]));
                }
            }
        }
    }
    for (place, kind, name, wanted) in &reads {
        match known.key_of(ns, kind, name) {
            None => problems.push(format!(
                "{} ({place}): the {kind} {name} is neither in deploy/k8s/ nor made by a `kubectl -n {ns} create` \
                 command of docs/kubernetes.md",
                o.what()
            )),
            Some(have) => {
                for key in wanted.iter().filter(|k| !have.contains(*k)) {
                    problems
                        .push(format!("{} ({place}): the {kind} {name} has no key {key} (it has {have:?})", o.what()));
                }
            }
        }
    }
}

/// What a container mounts, probes and is told on its command line.
fn check_container(
    pod: &Pod<'_>,
    c: &Value,
    (objects, known, docs): (&[Object], &Known, &Docs),
    problems: &mut Vec<String>,
) {
    let (o, spec, ns, volumes, claims) = (pod.o, pod.spec, pod.ns, &pod.volumes, &pod.claims);
    let dns_from_host = spec["hostNetwork"].as_bool() == Some(true);
    let cname = c["name"].as_str().unwrap_or("");
    let at = format!("{}, container {cname}", o.what());
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let name = m["name"].as_str().unwrap_or("");
        if !volumes.contains_key(name) && !claims.contains(name) {
            problems.push(format!("{at}: volumeMount {name} names no volume of its pod"));
        }
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        for handler in ["httpGet", "tcpSocket", "grpc"] {
            let port = &c[probe][handler]["port"];
            if !port.is_null() && !has_port(c, port) {
                problems.push(format!("{at}: {probe}'s port {port} is not a port of the container"));
            }
        }
    }
    let args: Vec<&str> = strings(&c["command"]).chain(strings(&c["args"])).collect();
    let words: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    let env: BTreeSet<&str> = c["env"].as_array().into_iter().flatten().filter_map(|e| e["name"].as_str()).collect();
    for arg in &args {
        let mut rest = *arg;
        while let Some(start) = rest.find("$(") {
            let Some(end) = rest[start..].find(')') else { break };
            let var = &rest[start + 2..start + end];
            if !env.contains(var) {
                problems.push(format!("{at}: $({var}) is not an environment variable of the container"));
            }
            rest = &rest[start + end..];
        }
    }
    if args.contains(&"--insecure") {
        problems.push(format!("{at}: --insecure (plain text, unauthenticated)"));
    }
    for flag in MOUNTED_FILES {
        for path in flag_values(&words, &[flag]) {
            match mount_of(c, &path) {
                None => problems.push(format!("{at}: {flag} {path} is in no volume mount")),
                Some((m, file)) => {
                    let volume = volumes.get(m["name"].as_str().unwrap_or("")).copied().unwrap_or(&Value::Null);
                    for (kind, source, name_field) in
                        [("Secret", "secret", "secretName"), ("ConfigMap", "configMap", "name")]
                    {
                        let Some(name) = volume[source][name_field].as_str() else { continue };
                        let files = mounted_files(&volume[source], known.key_of(ns, kind, name));
                        if !files.contains(&file) {
                            problems
                                .push(format!("{at}: {flag} {path}: the {kind} {name} mounted there has no {file}"));
                        }
                    }
                }
            }
        }
    }
    for flag in WRITABLE_DIRS {
        for path in flag_values(&words, &[flag]) {
            match mount_of(c, &path) {
                None => problems.push(format!("{at}: {flag} {path} is in no volume mount (the root is read-only)")),
                Some((m, _)) if m["readOnly"].as_bool() == Some(true) => {
                    problems.push(format!("{at}: {flag} {path} is mounted read-only"))
                }
                Some(_) => {}
            }
        }
    }
    for path in flag_values(&words, &["--pki-dir"]) {
        let volume = mount_of(c, &path)
            .filter(|(_, rest)| rest.is_empty())
            .and_then(|(m, _)| volumes.get(m["name"].as_str().unwrap_or("")).copied());
        let Some(secret) = volume.and_then(|v| v["secret"]["secretName"].as_str().map(|n| (v, n))) else {
            problems.push(format!("{at}: --pki-dir {path} is not where a Secret is mounted"));
            continue;
        };
        let (v, name) = secret;
        let files = mounted_files(&v["secret"], known.key_of(ns, "Secret", name));
        for file in controller_pki_files().into_iter().filter(|f| !files.contains(*f)) {
            problems.push(format!(
                "{at}: --pki-dir {path}: the controller reads {file}, which the Secret {name} mounted there lacks"
            ));
        }
    }
    for arg in &args {
        if !arg.contains("://") {
            continue;
        }
        let Some((host, port)) = host_port(arg) else { continue };
        let parts: Vec<&str> = host.split('.').collect();
        if parts.len() < 3 || parts[2] != "svc" {
            continue;
        }
        if dns_from_host && spec["dnsPolicy"].as_str() != Some("ClusterFirstWithHostNet") {
            problems.push(format!(
                "{at}: {arg}: a pod on the host's network resolves Service names only with dnsPolicy \
                 ClusterFirstWithHostNet"
            ));
        }
        let (service, service_ns) = (parts[0], parts[1]);
        let service_ports: Vec<u64> = objects
            .iter()
            .filter(|s| s.kind() == "Service" && s.name() == service && s.namespace() == service_ns)
            .flat_map(|s| s.doc["spec"]["ports"].as_array().into_iter().flatten().filter_map(|p| p["port"].as_u64()))
            .collect();
        if service_ports.is_empty() {
            problems.push(format!("{at}: {arg}: no Service {service} in namespace {service_ns}"));
        } else if !service_ports.contains(&u64::from(port)) {
            problems.push(format!("{at}: {arg}: the Service {service} has no port {port}"));
        }
        if arg.starts_with("http://") {
            problems.push(format!("{at}: {arg}: plain text to the controller"));
        } else if !docs.sans.contains(&host) {
            problems.push(format!(
                "{at}: {arg}: {host} is not among the names docs/kubernetes.md's `certs init --san` puts in the \
                 controller's certificate ({:?})",
                docs.sans
            ));
        }
    }
}

/// Services select a workload's pods and reach one of their ports.
fn check_services(objects: &[Object], problems: &mut Vec<String>) {
    for s in objects.iter().filter(|o| o.kind() == "Service") {
        let selector = labels(&s.doc["spec"]["selector"]);
        let selected: Vec<&Object> = objects
            .iter()
            .filter(|o| o.namespace() == s.namespace() && o.pod().is_some_and(|(_, l)| selects(&selector, &labels(l))))
            .collect();
        if selected.is_empty() {
            problems.push(format!("{}: selector {selector:?} selects no pod template", s.what()));
        }
        for port in s.doc["spec"]["ports"].as_array().into_iter().flatten() {
            let target = if port["targetPort"].is_null() { &port["port"] } else { &port["targetPort"] };
            for w in &selected {
                let (spec, _) = w.pod().expect("selected for its pod");
                if !spec["containers"].as_array().into_iter().flatten().any(|c| has_port(c, target)) {
                    problems.push(format!(
                        "{}: port {}'s targetPort {target} is not a container port of {}",
                        s.what(),
                        port["name"],
                        w.what()
                    ));
                }
            }
        }
    }
}

/// `field` of each element of an array (`items[].key`).
fn strings_of(items: &Value, field: &str) -> Vec<String> {
    items.as_array().into_iter().flatten().filter_map(|i| i[field].as_str().map(str::to_owned)).collect()
}

/// The files a Secret or ConfigMap volume source shows: its items' paths,
/// or every key of the object.
fn mounted_files(source: &Value, keys: Option<&BTreeSet<String>>) -> BTreeSet<String> {
    if source["items"].is_array() {
        strings_of(&source["items"], "path").into_iter().collect()
    } else {
        keys.cloned().unwrap_or_default()
    }
}

/// kubernetes-validate: $KUBERNETES_VALIDATE, else on PATH, else the virtual
/// environment scripts/test makes in target/ci-venv.
fn kubernetes_validate() -> PathBuf {
    if let Some(path) = std::env::var_os("KUBERNETES_VALIDATE") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("kubernetes-validate"))
        .find(|p| p.is_file());
    let venv = root().join("target/ci-venv/bin/kubernetes-validate");
    on_path.or_else(|| venv.is_file().then_some(venv)).unwrap_or_else(|| {
        panic!(
            "kubernetes-validate is not installed: scripts/test installs it in target/ci-venv (python3 -m venv \
             target/ci-venv && target/ci-venv/bin/pip install kubernetes-validate), or set KUBERNETES_VALIDATE"
        )
    })
}

#[test]
fn every_manifest_passes_kubernetes_validate_strict() {
    let tool = kubernetes_validate();
    let files: Vec<PathBuf> = manifest_files()
        .iter()
        .map(|f| f.strip_prefix(root()).map(Path::to_path_buf).unwrap_or_else(|_| f.clone()))
        .collect();
    let documents = manifests().len();
    for version in [None, Some(OLDEST_KUBERNETES)] {
        let mut command = Command::new(&tool);
        command.arg("--strict").current_dir(root());
        if let Some(v) = version {
            command.args(["-k", v]);
        }
        command.args(&files);
        let out = command.output().unwrap_or_else(|e| panic!("{}: {e}", tool.display()));
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let against = version.unwrap_or("the newest it knows");
        assert!(out.status.success(), "kubernetes-validate --strict (Kubernetes {against}) failed:\n{text}");
        // Every document was checked against a schema, none skipped.
        let passed = text.matches(" passed for resource ").count();
        assert_eq!(
            passed, documents,
            "kubernetes-validate (Kubernetes {against}) passed {passed} of {documents}:\n{text}"
        );
    }
}

#[test]
fn what_the_manifests_name_hangs_together() {
    let objects = manifests();
    let docs = docs(&docs_text());
    assert!(docs.created.keys().any(|(_, kind, _)| kind == "Secret"), "docs/kubernetes.md makes no Secret: {docs:?}");
    let problems = check(&objects, &docs);
    assert!(problems.is_empty(), "deploy/k8s/:\n{}", problems.join("\n"));
    // The workloads are there to check.
    for (kind, name) in [
        ("StatefulSet", "benchfleet-controller"),
        ("DaemonSet", "benchfleet-agent"),
        ("Service", "benchfleet-controller"),
    ] {
        assert!(objects.iter().any(|o| o.kind() == kind && o.name() == name), "no {kind} {name} in deploy/k8s/");
    }
}

#[test]
fn the_docs_commands_are_read_as_the_shell_reads_them() {
    let md = "text `kubectl create secret generic not-code`\n\n```sh\nkubectl -n ns create secret generic one \\\n  \
              --from-file=a=./x --from-file=dir/b.pem \\\n  --from-literal=c=v --dry-run=client -o yaml | kubectl \
              apply -f -\nkubectl create configmap two --from-literal k=v # a comment --from-literal=z=1\nbenchfleet \
              certs init --san one.ns.svc --san=two\n```\n";
    let d = docs(md);
    let key = |ns: &str, kind: &str, name: &str| (ns.to_owned(), kind.to_owned(), name.to_owned());
    let set = |keys: &[&str]| keys.iter().map(|k| (*k).to_owned()).collect::<BTreeSet<_>>();
    assert_eq!(d.created.get(&key("ns", "Secret", "one")), Some(&set(&["a", "b.pem", "c"])));
    assert_eq!(d.created.get(&key("default", "ConfigMap", "two")), Some(&set(&["k"])));
    assert_eq!(d.created.len(), 2, "{d:?}");
    assert_eq!(d.sans, set(&["one.ns.svc", "two"]));
}

fn object<'a>(objects: &'a mut [Object], kind: &str, name: &str) -> &'a mut Value {
    &mut objects
        .iter_mut()
        .find(|o| o.kind() == kind && o.name() == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
        .doc
}

/// The element of an array whose `name` is `name`.
fn named<'a>(list: &'a mut Value, name: &str) -> &'a mut Value {
    list.as_array_mut()
        .expect("an array")
        .iter_mut()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("nothing named {name}"))
}

fn controller(objects: &mut [Object]) -> &mut Value {
    object(objects, "StatefulSet", "benchfleet-controller")
}

fn agent(objects: &mut [Object]) -> &mut Value {
    object(objects, "DaemonSet", "benchfleet-agent")
}

fn pod(workload: &mut Value) -> &mut Value {
    &mut workload["spec"]["template"]["spec"]
}

/// The value after `flag` in a container's args.
fn arg<'a>(container: &'a mut Value, flag: &str) -> &'a mut Value {
    let args = container["args"].as_array_mut().expect("args");
    let at = args.iter().position(|a| a == flag).unwrap_or_else(|| panic!("no {flag}"));
    &mut args[at + 1]
}

type Breakage = (&'static str, fn(&mut Vec<Object>), &'static str);

/// Each check, failing: a manifest broken one way, and what the problem
/// must say.
const BREAKAGES: &[Breakage] = &[
    (
        "a misspelt Secret",
        |o| {
            named(&mut pod(controller(o))["volumes"], "pki")["secret"]["secretName"] = "benchfleet-controler-pki".into()
        },
        "Secret benchfleet-controler-pki is neither",
    ),
    (
        "a misspelt ConfigMap",
        |o| named(&mut pod(agent(o))["volumes"], "config")["configMap"]["name"] = "agent-config".into(),
        "ConfigMap agent-config is neither",
    ),
    (
        "a volume item's key missing",
        |o| named(&mut pod(agent(o))["volumes"], "join")["secret"]["items"][0]["key"] = "tokn".into(),
        "has no key tokn",
    ),
    (
        "an env secretKeyRef's key missing",
        |o| {
            named(&mut named(&mut pod(agent(o))["initContainers"], "join")["env"], "CA_HASH")["valueFrom"]["secretKeyRef"]
                ["key"] = "ca_hash".into()
        },
        "has no key ca_hash",
    ),
    (
        "an envFrom Secret missing",
        |o| {
            named(&mut pod(agent(o))["containers"], "agent")["envFrom"] =
                serde_json::json!([{"secretRef": {"name": "extra"}}])
        },
        "Secret extra is neither",
    ),
    (
        "a mount of no volume",
        |o| {
            named(&mut named(&mut pod(controller(o))["containers"], "controller")["volumeMounts"], "pki")["name"] =
                "pkis".into()
        },
        "volumeMount pkis names no volume",
    ),
    (
        "a Service selecting nothing",
        |o| {
            object(o, "Service", "benchfleet-controller")["spec"]["selector"]["app.kubernetes.io/name"] =
                "benchfleet-ctl".into()
        },
        "selects no pod template",
    ),
    (
        "a Service's named targetPort missing",
        |o| object(o, "Service", "benchfleet-controller")["spec"]["ports"][0]["targetPort"] = "grcp".into(),
        "targetPort \"grcp\" is not a container port",
    ),
    (
        "a Service's numbered targetPort missing",
        |o| object(o, "Service", "benchfleet-controller")["spec"]["ports"][1]["targetPort"] = 7079.into(),
        "targetPort 7079 is not a container port",
    ),
    (
        "a workload's selector not selecting its pods",
        |o| agent(o)["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = "agent".into(),
        "does not select its pod template",
    ),
    (
        "serviceName naming no Service",
        |o| controller(o)["spec"]["serviceName"] = "controller".into(),
        "serviceName \"controller\" names no Service",
    ),
    (
        "a probe's port missing",
        |o| {
            named(&mut pod(controller(o))["containers"], "controller")["livenessProbe"]["httpGet"]["port"] =
                "metric".into()
        },
        "livenessProbe's port \"metric\"",
    ),
    (
        "a numbered probe port missing",
        |o| named(&mut pod(agent(o))["containers"], "agent")["readinessProbe"]["httpGet"]["port"] = 7071.into(),
        "readinessProbe's port 7071",
    ),
    (
        "an object in another namespace",
        |o| object(o, "ConfigMap", "benchfleet-agent-config")["metadata"]["namespace"] = "default".into(),
        "in namespace default, not benchfleet",
    ),
    (
        "no namespace given",
        |o| {
            object(o, "ServiceAccount", "benchfleet-agent")["metadata"]
                .as_object_mut()
                .expect("metadata")
                .remove("namespace");
        },
        "ServiceAccount benchfleet-agent: in namespace default",
    ),
    (
        "a missing ServiceAccount",
        |o| pod(agent(o))["serviceAccountName"] = "agent".into(),
        "serviceAccountName agent names no ServiceAccount",
    ),
    (
        "the host's DNS on the host's network",
        |o| {
            pod(agent(o)).as_object_mut().expect("spec").remove("dnsPolicy");
        },
        "ClusterFirstWithHostNet",
    ),
    (
        "a URL of no Service",
        |o| {
            *arg(named(&mut pod(agent(o))["containers"], "agent"), "--controller") =
                "https://benchfleet-ctl.benchfleet.svc:7070".into()
        },
        "no Service benchfleet-ctl",
    ),
    (
        "a URL of no Service port",
        |o| {
            *arg(named(&mut pod(agent(o))["initContainers"], "join"), "--controller") =
                "https://benchfleet-controller.benchfleet.svc:7075".into()
        },
        "has no port 7075",
    ),
    (
        "a URL of a name not in the certificate",
        |o| {
            *arg(named(&mut pod(controller(o))["containers"], "controller"), "--advertise-url") =
                "https://benchfleet-controller.benchfleet.svc.lab.local:7070".into()
        },
        "benchfleet-controller.benchfleet.svc.lab.local is not among the names",
    ),
    (
        "a plain-text URL",
        |o| {
            *arg(named(&mut pod(agent(o))["containers"], "agent"), "--controller") =
                "http://benchfleet-controller.benchfleet.svc:7070".into()
        },
        "plain text to the controller",
    ),
    (
        "--insecure",
        |o| {
            named(&mut pod(controller(o))["containers"], "controller")["args"]
                .as_array_mut()
                .expect("args")
                .push("--insecure".into())
        },
        "--insecure",
    ),
    (
        "a file flag outside any mount",
        |o| *arg(named(&mut pod(agent(o))["initContainers"], "join"), "--token-file") = "/etc/join/token".into(),
        "--token-file /etc/join/token is in no volume mount",
    ),
    (
        "a file flag naming no item",
        |o| {
            *arg(named(&mut pod(agent(o))["containers"], "agent"), "--config") =
                "/etc/benchfleet/agent/config.toml".into()
        },
        "has no config.toml",
    ),
    (
        "a certificate file missing from the pki Secret",
        |o| {
            named(&mut pod(controller(o))["volumes"], "pki")["secret"]["items"]
                .as_array_mut()
                .expect("items")
                .retain(|i| i["key"] != "ingest.key");
        },
        "the controller reads ingest.key",
    ),
    (
        "--pki-dir where no Secret is",
        |o| *arg(named(&mut pod(controller(o))["containers"], "controller"), "--pki-dir") = "/etc/benchfleet".into(),
        "--pki-dir /etc/benchfleet is not where a Secret is mounted",
    ),
    (
        "a writable directory mounted read-only",
        |o| {
            named(&mut named(&mut pod(controller(o))["containers"], "controller")["volumeMounts"], "data")["readOnly"] =
                true.into()
        },
        "--data-dir /var/lib/benchfleet is mounted read-only",
    ),
    (
        "a writable directory on the read-only root",
        |o| *arg(named(&mut pod(agent(o))["containers"], "agent"), "--model-cache") = "/root/.cache/huggingface".into(),
        "--model-cache /root/.cache/huggingface is in no volume mount",
    ),
    (
        "an undefined $(VAR)",
        |o| {
            named(&mut pod(agent(o))["initContainers"], "join")["env"]
                .as_array_mut()
                .expect("env")
                .retain(|e| e["name"] != "CA_HASH");
        },
        "$(CA_HASH) is not an environment variable",
    ),
    (
        "an object defined twice",
        |o| {
            let again = o[0].clone();
            o.push(again);
        },
        "defined twice",
    ),
];

#[test]
fn each_check_fails_on_a_manifest_broken_in_memory() {
    let (objects, docs) = (manifests(), docs(&docs_text()));
    assert_eq!(check(&objects, &docs), Vec::<String>::new(), "the manifests as they are");
    for (what, breakage, says) in BREAKAGES {
        let mut broken = objects.clone();
        breakage(&mut broken);
        let problems = check(&broken, &docs);
        assert!(
            problems.iter().any(|p| p.contains(says)),
            "{what}: expected a problem saying {says:?}, got {problems:#?}"
        );
    }
}

#[test]
fn secrets_the_docs_do_not_make_and_names_certs_init_does_not_sign_are_caught() {
    let (objects, text) = (manifests(), docs_text());
    let cases = [
        ("benchfleet-hf-token --from", "benchfleet-hf-tokens --from", "Secret benchfleet-hf-token is neither"),
        ("--from-literal=ca-hash=", "--from-literal=cahash=", "has no key ca-hash"),
        (
            "-n benchfleet create secret generic benchfleet-join",
            "create secret generic benchfleet-join",
            "Secret benchfleet-join is neither",
        ),
        ("--from-file=ingest.key=", "--from-file=ingest=", "Secret benchfleet-controller-pki has no key ingest.key"),
        ("--san benchfleet-controller.benchfleet.svc \\", "\\", "is not among the names"),
    ];
    for (from, to, says) in cases {
        assert!(text.contains(from), "docs/kubernetes.md no longer holds {from:?}");
        let problems = check(&objects, &docs(&text.replace(from, to)));
        assert!(
            problems.iter().any(|p| p.contains(says)),
            "docs with {to:?} for {from:?}: expected {says:?}, got {problems:#?}"
        );
    }
}

/// The text of the file at `path` in `container`, where a ConfigMap of the
/// manifests is mounted.
fn config_map_file(objects: &[Object], spec: &Value, container: &Value, path: &str) -> String {
    let (mount, file) = mount_of(container, path).unwrap_or_else(|| panic!("{path} is in no mount"));
    let volume = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("no volume {}", mount["name"]));
    let source = &volume["configMap"];
    let name = source["name"].as_str().unwrap_or_else(|| panic!("{path}: volume {} is no ConfigMap", volume["name"]));
    let key = source["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["path"] == file.as_str())
        .and_then(|i| i["key"].as_str())
        .unwrap_or(&file);
    let map = objects.iter().find(|o| o.kind() == "ConfigMap" && o.name() == name).expect("the ConfigMap");
    map.doc["data"][key].as_str().unwrap_or_else(|| panic!("ConfigMap {name} has no {key}")).to_owned()
}

#[test]
fn the_daemons_take_the_manifests_arguments_and_config_files() {
    let objects = manifests();
    let tmp = tempfile::tempdir().expect("a temp dir");
    let mut ran = BTreeSet::new();
    for o in &objects {
        let Some((spec, _)) = o.pod() else { continue };
        for c in containers(spec) {
            let image = c["image"].as_str().unwrap_or_default();
            let binary = image.rsplit('/').next().unwrap_or_default().split([':', '@']).next().unwrap_or_default();
            let mut args: Vec<String> = strings(&c["args"]).map(str::to_owned).collect();
            // `join` reaches for the controller at once (deploy_flags checks
            // its flags).
            if !["benchfleet-controller", "benchfleet-agent"].contains(&binary)
                || args.first().is_some_and(|a| a == "join")
            {
                continue;
            }
            if let Some(at) = args.iter().position(|a| a == "--config") {
                let text = config_map_file(&objects, spec, c, &args[at + 1]);
                let file = tmp.path().join(format!("{binary}.toml"));
                std::fs::write(&file, &text).expect("write");
                args[at + 1] = file.display().to_string();
                if binary == "benchfleet-agent" {
                    // The tables the agent reads itself, as strictly as it does.
                    benchfleet_agent::policy::EnginePolicy::from_toml(&text, &file)
                        .unwrap_or_else(|e| panic!("{}: the agent's [engines]: {e}", o.what()));
                    benchfleet_agent::verdict::Policy::from_toml(&text, &file)
                        .unwrap_or_else(|e| panic!("{}: the agent's [gpu]: {e}", o.what()));
                }
            }
            let out = Command::new(crate::faults::bin(binary))
                .args(&args)
                .arg("--print-config")
                .env_remove("BENCHFLEET_AGENT_CONFIG")
                .env_remove("BENCHFLEET_CONTROLLER_CONFIG")
                .output()
                .expect("runs");
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            assert!(out.status.success(), "{}: {binary} {}:\n{text}", o.what(), args.join(" "));
            ran.insert(binary.to_owned());
        }
    }
    assert_eq!(ran.len(), 2, "ran {ran:?}");
}
