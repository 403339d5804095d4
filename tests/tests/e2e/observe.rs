//! What Prometheus and Grafana are given: deploy/prometheus/prometheus.yml
//! (promtool's own check where promtool is installed; its jobs and targets
//! against the manifests' metrics ports; its kubernetes_sd example against
//! the pods of deploy/k8s/) and deploy/grafana/benchfleet.json (every panel
//! queries the templated Prometheus data source; `dashboard_metrics`, the
//! metric names its queries read, which a live scrape can be held to).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::k8s;

/// PromQL's aggregation operators: a name, never a metric, whether its
/// parenthesis follows at once or after `by (...)`.
const AGGREGATIONS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];
/// Keywords followed by a list of label names.
const GROUPING: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];
/// Other keywords and literals.
const KEYWORDS: &[&str] = &["bool", "and", "or", "unless", "offset", "atan2", "inf", "nan"];

/// The index after the bracket that closes the one at `open`, skipping
/// string literals.
fn after_closing(c: &[char], open: usize, close: char) -> usize {
    let mut i = open + 1;
    while i < c.len() {
        match c[i] {
            '"' | '\'' | '`' => i = after_string(c, i),
            ch if ch == close => return i + 1,
            _ => i += 1,
        }
    }
    i
}

fn after_string(c: &[char], open: usize) -> usize {
    let quote = c[open];
    let mut i = open + 1;
    while i < c.len() && c[i] != quote {
        i += if c[i] == '\\' && quote != '`' { 2 } else { 1 };
    }
    i + 1
}

fn is_name_char(ch: char) -> bool {
    ch.is_ascii_alphanumeric() || ch == '_' || ch == ':'
}

/// The metric names a PromQL expression selects, each with whether it is
/// read inside `histogram_quantile(...)`. Not metrics: functions and
/// aggregations (a name before `(`), keywords, label names (in `{...}` and
/// in `by`/`without`/`on`/`ignoring`/`group_left`/`group_right` lists),
/// strings, numbers and durations, ranges (`[...]`), Grafana's variables
/// (`$name`, `${name}`) and comments.
pub(crate) fn promql_names(expr: &str) -> Vec<(String, bool)> {
    let c: Vec<char> = expr.chars().collect();
    let mut calls: Vec<String> = Vec::new();
    let mut found = Vec::new();
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '"' | '\'' | '`' => i = after_string(&c, i),
            '#' => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '{' => i = after_closing(&c, i, '}'),
            '[' => i = after_closing(&c, i, ']'),
            '(' => {
                calls.push(String::new());
                i += 1;
            }
            ')' => {
                calls.pop();
                i += 1;
            }
            '$' => {
                i += 1;
                if c.get(i) == Some(&'{') {
                    i = after_closing(&c, i, '}');
                } else {
                    while i < c.len() && is_name_char(c[i]) {
                        i += 1;
                    }
                }
            }
            ch if ch.is_ascii_digit() || (ch == '.' && c.get(i + 1).is_some_and(char::is_ascii_digit)) => {
                while i < c.len() && (c[i].is_ascii_alphanumeric() || c[i] == '.' || c[i] == '_') {
                    i += 1;
                }
            }
            ch if ch.is_ascii_alphabetic() || ch == '_' || ch == ':' => {
                let start = i;
                while i < c.len() && is_name_char(c[i]) {
                    i += 1;
                }
                let word: String = c[start..i].iter().collect();
                let mut next = i;
                while next < c.len() && c[next].is_whitespace() {
                    next += 1;
                }
                let call = c.get(next) == Some(&'(');
                if GROUPING.contains(&word.as_str()) {
                    if call {
                        i = after_closing(&c, next, ')');
                    }
                } else if call {
                    calls.push(word);
                    i = next + 1;
                } else if !AGGREGATIONS.contains(&word.as_str()) && !KEYWORDS.contains(&word.as_str()) {
                    let in_quantile = calls.iter().any(|f| f == "histogram_quantile");
                    found.push((word, in_quantile));
                }
            }
            _ => i += 1,
        }
    }
    found
}

/// The metric names these expressions read: as the exposition's samples
/// name them (a counter's `_total` kept), except a histogram's, named by
/// its family (the name its `# TYPE` line gives): `_bucket`, `_sum` and
/// `_count` are taken off a name whose `_bucket` series some expression
/// reads inside `histogram_quantile`, and off no other.
pub(crate) fn metric_names<'a>(exprs: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
    let names: Vec<(String, bool)> = exprs.into_iter().flat_map(promql_names).collect();
    let histograms: BTreeSet<&str> =
        names.iter().filter(|(_, q)| *q).filter_map(|(n, _)| n.strip_suffix("_bucket")).collect();
    names
        .iter()
        .map(|(name, _)| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix).filter(|base| histograms.contains(base)))
                .unwrap_or(name)
                .to_owned()
        })
        .collect()
}

/// The PromQL a templating variable's query runs: `label_values(SELECTOR,
/// LABEL)`'s selector (`label_values(LABEL)` reads no metric), or
/// `query_result(EXPR)`'s expression.
fn variable_query(query: &str) -> Option<String> {
    let query = query.trim();
    if let Some(inner) = query.strip_prefix("label_values(").and_then(|q| q.strip_suffix(')')) {
        return inner.rsplit_once(',').map(|(selector, _)| selector.to_owned());
    }
    query.strip_prefix("query_result(").and_then(|q| q.strip_suffix(')')).map(str::to_owned)
}

/// Every panel's queries, rows' nested panels included.
fn panel_exprs(panels: &Value, out: &mut Vec<String>) {
    for panel in panels.as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.extend(target["expr"].as_str().map(str::to_owned));
        }
        panel_exprs(&panel["panels"], out);
    }
}

/// The metric names a Grafana dashboard's queries read: its panels' and
/// its query variables' (see `metric_names` for how histograms are named).
pub(crate) fn dashboard_metrics(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let dashboard: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut exprs = Vec::new();
    panel_exprs(&dashboard["panels"], &mut exprs);
    for variable in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if variable["type"] == "query" {
            let query = variable["query"]["query"].as_str().or_else(|| variable["query"].as_str()).unwrap_or("");
            exprs.extend(variable_query(query));
        }
    }
    metric_names(exprs.iter().map(String::as_str))
}

fn dashboard_path() -> PathBuf {
    k8s::root().join("deploy/grafana/benchfleet.json")
}

fn prometheus_path() -> PathBuf {
    k8s::root().join("deploy/prometheus/prometheus.yml")
}

#[test]
fn promql_metric_names_are_what_selects_series() {
    let names = |e: &str| metric_names([e]).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names("histogram_quantile(0.99, sum by (le) (rate(commit_seconds_bucket{job=\"c\"}[$__rate_interval])))"),
        ["commit_seconds"]
    );
    assert_eq!(
        names(
            "sum without (gpu) (temp{a=\"b}\", c=~\"$x\"}) / on(instance) group_left(model) up_total offset 5m > bool \
             0.5e3"
        ),
        ["temp", "up_total"]
    );
    // Nothing says x is a histogram: x_count and x_sum stay as they are.
    assert_eq!(names("rate(x_sum[1m]) / rate(x_count[1m]) + x_bucket"), ["x_bucket", "x_count", "x_sum"]);
    assert_eq!(
        names("histogram_quantile(0.5, rate(h_bucket[5m])) + rate(h_sum[5m]) / rate(h_count[5m]) - h_total"),
        ["h", "h_total"]
    );
    assert_eq!(names("count(up) and topk(3, y) unless z @ start() or sum(w) by (l)"), ["up", "w", "y", "z"]);
    assert_eq!(names("label_replace(a, \"dst\", \"$1\", \"src\", \"(.*)\") * ${factor} + $offset"), ["a"]);
    assert_eq!(names("# a comment names no metric\nb:recorded:rate5m"), ["b:recorded:rate5m"]);
    assert_eq!(names("max_over_time(c[1h:5m]) == inf or nan"), ["c"]);
    assert_eq!(variable_query("label_values(up{job=\"a\"}, instance)").as_deref(), Some("up{job=\"a\"}"));
    assert_eq!(variable_query("label_values(instance)"), None);
    assert_eq!(variable_query("query_result(topk(5, q))").as_deref(), Some("topk(5, q)"));
}

/// Every panel but a row, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            if p["type"] != "row" {
                out.push(p);
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

#[test]
fn every_dashboard_panel_queries_the_templated_prometheus_data_source() {
    let text = std::fs::read_to_string(dashboard_path()).expect("deploy/grafana/benchfleet.json");
    let dashboard: Value = serde_json::from_str(&text).expect("deploy/grafana/benchfleet.json is JSON");
    assert!(
        dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion {}",
        dashboard["schemaVersion"]
    );
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string());
    let variables: BTreeMap<&str, &Value> = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| Some((v["name"].as_str()?, v)))
        .collect();
    let source = variables.get("datasource").expect("a templating variable `datasource`");
    assert_eq!((&source["type"], &source["query"]), (&Value::from("datasource"), &Value::from("prometheus")));
    let templated = |d: &Value| d["type"] == "prometheus" && d["uid"] == "${datasource}";
    for v in variables.values().filter(|v| v["type"] == "query") {
        assert!(templated(&v["datasource"]), "variable {}: datasource {}", v["name"], v["datasource"]);
    }
    let panels = panels(&dashboard);
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let mut ids = BTreeSet::new();
    for p in &panels {
        let title = p["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "a panel without a title: {p}");
        assert!(ids.insert(p["id"].as_u64().expect("a panel id")), "{title}: id {} twice", p["id"]);
        assert!(p["gridPos"]["w"].is_u64() && p["gridPos"]["h"].is_u64(), "{title}: no gridPos");
        assert!(templated(&p["datasource"]), "{title}: datasource {}", p["datasource"]);
        let targets =
            p["targets"].as_array().filter(|t| !t.is_empty()).unwrap_or_else(|| panic!("{title}: no targets"));
        let mut refs = BTreeSet::new();
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "{title}: a target without expr");
            assert!(!promql_names(expr).is_empty(), "{title}: {expr} reads no metric");
            assert!(templated(&t["datasource"]), "{title}: target datasource {}", t["datasource"]);
            assert!(refs.insert(t["refId"].as_str().expect("a refId")), "{title}: refId {} twice", t["refId"]);
        }
    }
}

/// The metrics the dashboard shows: the controller's (controller/src/metrics.rs)
/// and the agents' (agent `--metrics-listen`).
const DASHBOARD_METRICS: &[&str] = &[
    "benchfleet_agent_gpu_power_watts",
    "benchfleet_agent_gpu_sm_clock_hertz",
    "benchfleet_agent_gpu_temperature_celsius",
    "benchfleet_agent_gpu_throttle_active",
    "benchfleet_agent_gpu_usable",
    "benchfleet_agent_groups_running",
    "benchfleet_agent_session_connected",
    "benchfleet_agents",
    "benchfleet_ingested_records_total",
    "benchfleet_jobs",
    "benchfleet_lease_losses_held",
    "benchfleet_queue_groups",
    "benchfleet_record_commit_seconds",
    "benchfleet_refused_batches_total",
    "benchfleet_runs_in_progress",
    "benchfleet_store_bytes",
];

#[test]
fn the_dashboard_reads_the_fleets_metrics_and_no_other() {
    let names = dashboard_metrics(&dashboard_path());
    let expected: BTreeSet<String> = DASHBOARD_METRICS.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(names, expected);
}

/// promtool: $PROMTOOL, else on PATH, else where scripts/test unpacks it
/// (target/ci-tools, from Debian's package without installing it).
fn promtool() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PROMTOOL") {
        return Some(PathBuf::from(path));
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("promtool"))
        .chain([k8s::root().join("target/ci-tools/usr/bin/promtool")])
        .find(|p| p.is_file())
}

fn promtool_check(tool: &Path, file: &Path) -> (bool, String) {
    let out = Command::new(tool)
        .args(["check", "config"])
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", tool.display()));
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).expect("YAML")
}

/// The `metrics` port of the named workload's containers.
fn metrics_port(objects: &[k8s::Object], name: &str) -> u64 {
    objects
        .iter()
        .filter(|o| o.name() == name)
        .find_map(|o| o.pod())
        .into_iter()
        .flat_map(|(spec, _)| spec["containers"].as_array().into_iter().flatten())
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .find(|p| p["name"] == "metrics")
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no metrics port on {name}"))
}

#[test]
fn prometheus_yml_is_valid_and_scrapes_the_controller_and_the_agents() {
    let path = prometheus_path();
    match promtool() {
        Some(tool) => {
            let (ok, out) = promtool_check(&tool, &path);
            assert!(ok, "promtool check config {}:\n{out}", path.display());
        }
        None => eprintln!("promtool is not installed (scripts/test installs it): checking the file's shape only"),
    }
    let config = yaml(&std::fs::read_to_string(&path).expect("prometheus.yml"));
    let jobs = config["scrape_configs"].as_array().expect("scrape_configs");
    let mut ports: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for job in jobs {
        let name = job["job_name"].as_str().filter(|n| !n.is_empty()).expect("every scrape config has a job_name");
        let targets: Vec<&str> = job["static_configs"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["targets"].as_array().into_iter().flatten())
            .map(|t| t.as_str().expect("a target is a string"))
            .collect();
        assert!(!targets.is_empty(), "{name}: no targets");
        for target in targets {
            let (host, port) = target.rsplit_once(':').unwrap_or_else(|| panic!("{name}: {target} is not HOST:PORT"));
            assert!(!host.is_empty(), "{name}: {target}");
            ports.entry(name).or_default().insert(port.parse().unwrap_or_else(|_| panic!("{name}: {target}")));
        }
    }
    // The ports the daemons serve /metrics on in deploy/k8s/.
    let objects = k8s::manifests();
    for (job, workload) in
        [("benchfleet-controller", "benchfleet-controller"), ("benchfleet-agent", "benchfleet-agent")]
    {
        let port = metrics_port(&objects, workload);
        assert_eq!(ports.get(job), Some(&BTreeSet::from([port])), "job {job}'s targets' ports: {ports:?}");
    }
}

/// A regular expression made of literal characters and groups of literal
/// alternatives (`benchfleet-(controller|agent)`), as the strings it
/// matches whole (Prometheus anchors relabelling regexes).
fn alternatives(regex: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::from([String::new()]);
    let mut rest = regex;
    while !rest.is_empty() {
        let (choices, tail): (Vec<&str>, &str) = if let Some(group) = rest.strip_prefix('(') {
            let (inside, tail) = group.split_once(')').unwrap_or_else(|| panic!("{regex}: an unclosed group"));
            (inside.split('|').collect(), tail)
        } else {
            let end = rest.find('(').unwrap_or(rest.len());
            (vec![&rest[..end]], &rest[end..])
        };
        for choice in &choices {
            assert!(
                choice.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
                "{regex}: this check reads only literal alternatives"
            );
        }
        out = out.iter().flat_map(|head| choices.iter().map(move |c| format!("{head}{c}"))).collect();
        rest = tail;
    }
    out
}

/// The example between its BEGIN and END lines, uncommented.
fn kubernetes_sd_example() -> String {
    let text = std::fs::read_to_string(prometheus_path()).expect("prometheus.yml");
    let begin = text.find("# BEGIN kubernetes_sd example\n").expect("a BEGIN kubernetes_sd example line");
    let end = text.find("# END kubernetes_sd example").expect("an END kubernetes_sd example line");
    text[begin..end]
        .lines()
        .skip(1)
        .map(|l| l.strip_prefix("# ").or_else(|| l.strip_prefix('#')).unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_kubernetes_sd_example_finds_the_manifests_pods_by_their_metrics_port() {
    let example = kubernetes_sd_example();
    if let Some(tool) = promtool() {
        let file = tempfile::NamedTempFile::new().expect("a temp file");
        std::fs::write(file.path(), &example).expect("write");
        let (ok, out) = promtool_check(&tool, file.path());
        // Some distributions build Prometheus without Kubernetes discovery.
        if out.contains("kubernetes_sd_configs not found") {
            eprintln!("this promtool has no Kubernetes discovery: checking the example's shape only");
        } else {
            assert!(ok, "promtool check config, the kubernetes_sd example:\n{out}\n{example}");
        }
    }
    let config = yaml(&example);
    let job = &config["scrape_configs"][0];
    let sd = &job["kubernetes_sd_configs"][0];
    assert_eq!(sd["role"], "pod", "{example}");
    assert!(
        sd["namespaces"]["names"].as_array().is_some_and(|n| n.iter().any(|n| n == k8s::NAMESPACE)),
        "the example looks in namespace {}",
        sd["namespaces"]["names"]
    );
    let keep = |label: &str| -> BTreeSet<String> {
        let rules: Vec<&Value> = job["relabel_configs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["action"] == "keep" && r["source_labels"] == serde_json::json!([label]))
            .collect();
        assert_eq!(rules.len(), 1, "one keep rule on {label}: {example}");
        alternatives(rules[0]["regex"].as_str().expect("a regex"))
    };
    let names = keep("__meta_kubernetes_pod_label_app_kubernetes_io_name");
    let ports = keep("__meta_kubernetes_pod_container_port_name");
    let objects = k8s::manifests();
    let mut found = BTreeSet::new();
    for o in &objects {
        let Some((spec, labels)) = o.pod() else { continue };
        let name = labels["app.kubernetes.io/name"].as_str().unwrap_or_default();
        let port_names: BTreeSet<String> = spec["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .filter_map(|p| p["name"].as_str().map(str::to_owned))
            .collect();
        assert!(names.contains(name), "{}: the example keeps {names:?}, not {name}", o.file);
        assert_eq!(port_names.intersection(&ports).count(), 1, "{}: ports {port_names:?}, kept {ports:?}", o.file);
        found.insert(name.to_owned());
    }
    assert_eq!(found, BTreeSet::from(["benchfleet-agent".to_owned(), "benchfleet-controller".to_owned()]));
}
