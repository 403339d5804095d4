//! From a submitted matrix to stored groups and jobs, and from a run whose
//! jobs all ended to its next round of search probes or its next greedy
//! stage: the parts of scheduling that read the matrix. Both run on the
//! driver's side, outside the scheduler.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use crate::sched::Targets;
use crate::store::{Store, StoreError, is_sha256};
use benchfleet_study::fleet::{FleetSpec, Per};
use benchfleet_study::greedy::{self, Plan, Stage};
use benchfleet_study::hostlist::HostList;
use benchfleet_study::matrix::{self, Matrix, Strategy};
use benchfleet_study::model::{
    Dataset, EngineConfig, FleetRun, Group, Job, Profile, Run, RunId, RunState, RuntimeKind,
};
use benchfleet_study::search::{self, Step};

/// A submission as the operator sends it: the matrix, and the SHA-256 of
/// every file it names (uploaded before).
#[derive(Clone, Debug, Default)]
pub struct Submission {
    pub matrix_name: String,
    pub matrix_yaml: String,
    pub files: BTreeMap<String, String>,
    pub runtime_override: String,
    /// Run it as a fleet check, per "host" or "gpu" (`benchfleet fleet
    /// check`); empty: as the matrix says.
    pub fleet_per: String,
    /// A fleet check's host list (`--hosts`); empty: every host.
    pub fleet_hosts: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// What the operator must fix.
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A validated run, with the groups and jobs of its first stage.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub run: Run,
    pub groups: Vec<Group>,
    pub jobs: Vec<Job>,
    /// The matrix's warnings, for the operator.
    pub warnings: Vec<String>,
    /// The greedy strategy: these are its first stage, the rest is planned
    /// from their results.
    pub greedy: bool,
    /// A fleet check: the groups are one template, made one per target by
    /// `pin` once the scheduler has said what the fleet is.
    pub fleet: Option<FleetAsk>,
}

/// What a fleet check asks of the fleet.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetAsk {
    pub per: Per,
    pub gpu: Option<String>,
    pub gpus_per_job: u32,
    pub runtime: RuntimeKind,
    /// The hosts it may run on; `None`: every host.
    pub hosts: Option<HostList>,
}

/// Validates a submission and builds its run; nothing is stored. Every file
/// the matrix names must have been uploaded.
pub fn prepare(
    store: &dyn Store,
    sub: &Submission,
    id: impl FnOnce() -> Result<RunId, StoreError>,
) -> Result<Prepared, SubmitError> {
    prepare_as(Some(store), sub, id)
}

/// As `prepare`, for a plan that is only shown: the files need not have
/// been uploaded.
pub fn prepare_dry(sub: &Submission, id: impl FnOnce() -> Result<RunId, StoreError>) -> Result<Prepared, SubmitError> {
    prepare_as(None, sub, id)
}

fn prepare_as(
    store: Option<&dyn Store>,
    sub: &Submission,
    id: impl FnOnce() -> Result<RunId, StoreError>,
) -> Result<Prepared, SubmitError> {
    for (path, sha) in &sub.files {
        if !is_sha256(sha) {
            return Err(SubmitError::Invalid(format!("file {path}: '{sha}' is not a SHA-256")));
        }
        if let Some(store) = store
            && !store.has_file(sha)?
        {
            return Err(SubmitError::Invalid(format!(
                "file {path} (SHA-256 {sha}) was not uploaded; upload it first (the CLI does)"
            )));
        }
    }
    let matrix = matrix::parse(&sub.matrix_name, &sub.matrix_yaml, &|path| sub.files.get(path).cloned())
        .map_err(|e| SubmitError::Invalid(e.to_string()))?;
    if let Some(store) = store {
        check_datasets(store, sub, &matrix)?;
    }
    let runtime_override = match sub.runtime_override.as_str() {
        "" => None,
        "process" => Some(RuntimeKind::Process),
        "docker" => Some(RuntimeKind::Docker),
        other => {
            return Err(SubmitError::Invalid(format!(
                "unknown runtime override '{other}'; expected process or docker"
            )));
        }
    };
    let per =
        match sub.fleet_per.as_str() {
            "" => None,
            other => Some(Per::parse(other).ok_or_else(|| {
                SubmitError::Invalid(format!("a fleet check runs per host or per gpu, not '{other}'"))
            })?),
        };
    let fleet = fleet_of(&matrix, per)?;
    let given = match sub.fleet_hosts.trim() {
        "" => fleet.as_ref().and_then(|f| f.hosts.as_deref()).unwrap_or_default(),
        given => given,
    };
    let hosts = match given {
        "" => None,
        _ if fleet.is_none() => {
            return Err(SubmitError::Invalid(
                "a host list is for a fleet check (`benchfleet fleet check --hosts`)".into(),
            ));
        }
        text => Some(HostList::parse(text).map_err(SubmitError::Invalid)?),
    };
    let stage = match matrix.strategy {
        Strategy::Grid | Strategy::Fleet => Stage {
            number: 1,
            repeats: vec![1..=matrix.repeats; matrix.configs.len()],
            configs: matrix.configs.clone(),
            profiles: matrix.profiles.clone(),
        },
        // Later stages are planned when this one ends.
        Strategy::Greedy => match greedy::plan(&matrix, &greedy::Results::default()).plan {
            Plan::Next(s) => s,
            Plan::Done(o) => return Err(SubmitError::Invalid(o.reason)),
        },
    };
    let run = Run {
        id: id()?,
        name: matrix.name.clone(),
        matrix_file: sub.matrix_name.clone(),
        matrix_yaml: sub.matrix_yaml.clone(),
        created_unix_ms: unix_ms(),
        state: RunState::Running,
        ended_unix_ms: None,
        note: None,
        files: sub.files.clone(),
        runtime_override,
        fleet: fleet.as_ref().map(|f| FleetRun { per: f.per, skipped: Vec::new() }),
    };
    let (groups, jobs) = expand(&run, &matrix, &stage, (0, 0));
    let greedy = matrix.strategy == Strategy::Greedy;
    let fleet = fleet.map(|f| FleetAsk {
        per: f.per,
        gpu: matrix.gpu.clone(),
        gpus_per_job: matrix.gpus_per_job,
        runtime: groups.first().map_or(RuntimeKind::Process, |g| g.config.runtime),
        hosts,
    });
    Ok(Prepared { run, groups, jobs, warnings: matrix.warnings, greedy, fleet })
}

/// The fleet check a submission asks: the matrix's `strategy: fleet`, or
/// `benchfleet fleet check` (per host or GPU) of a matrix that makes one
/// configuration at fixed loads.
fn fleet_of(matrix: &Matrix, per: Option<Per>) -> Result<Option<FleetSpec>, SubmitError> {
    let mut spec = match (matrix.fleet.clone(), per) {
        (None, None) => return Ok(None),
        (Some(spec), _) => spec,
        (None, Some(_)) => {
            let refuse = |why: String| Err(SubmitError::Invalid(format!("{}: {why}", matrix.file)));
            if matrix.strategy == Strategy::Greedy {
                return refuse("a greedy study cannot be a fleet check; write one configuration".to_owned());
            }
            if let Some((field, why)) = matrix::fleet_refusal(&matrix.configs, &matrix.profiles) {
                return refuse(format!("{field}: {why}"));
            }
            FleetSpec::default()
        }
    };
    if let Some(per) = per {
        spec.per = per;
    }
    Ok(Some(spec))
}

/// A fleet check's groups, one per target, each pinned to it, with the
/// template's jobs in repeat-major order (every profile's first repeat,
/// then the second...), so a target's repeats are spread over the check;
/// the hosts left out are the run's to report. No target is an error that
/// says why each host was left out.
pub fn pin(mut prepared: Prepared, targets: Targets) -> Result<Prepared, SubmitError> {
    if targets.targets.is_empty() {
        let why: Vec<String> = targets.skipped.iter().map(|s| format!("{}: {}", s.host, s.reason)).collect();
        let list = prepared.fleet.as_ref().and_then(|f| f.hosts.as_ref());
        return Err(SubmitError::Invalid(if let (true, Some(list)) = (why.is_empty(), list) {
            format!("no agent's name is on the host list '{list}'")
        } else if why.is_empty() {
            "no agent is connected to run the fleet check on".to_owned()
        } else {
            format!("no host can run the fleet check ({})", why.join("; "))
        }));
    }
    let Some(template) = prepared.groups.first().cloned() else {
        return Err(SubmitError::Invalid("the matrix makes no group to run".to_owned()));
    };
    let mut order: Vec<&Job> = prepared.jobs.iter().collect();
    order.sort_by_key(|j| (j.repeat, j.id));
    let (mut groups, mut jobs) = (Vec::new(), Vec::new());
    for (n, target) in targets.targets.into_iter().enumerate() {
        let mut group = Group { id: n as u64, jobs: Vec::new(), pin: Some(target), ..template.clone() };
        for j in &order {
            let id = jobs.len() as u64;
            group.jobs.push(id);
            jobs.push(Job::new(prepared.run.id, id, group.id, j.profile.clone(), j.repeat));
        }
        groups.push(group);
    }
    if let Some(f) = prepared.run.fleet.as_mut() {
        f.skipped = targets.skipped;
    }
    prepared.groups = groups;
    prepared.jobs = jobs;
    Ok(prepared)
}

/// Reads each ShareGPT file and trace the matrix names, as stored, with the
/// parser loadgen uses (and checks a trace holds the requests its profile
/// asks for): a broken one is the matrix's error, at the profile that names
/// it, before anything is stored (a client other than the CLI, which checks
/// them too, would otherwise meet it on an agent, with an engine started).
fn check_datasets(store: &dyn Store, sub: &Submission, matrix: &Matrix) -> Result<(), SubmitError> {
    let mut checked: Vec<(&Dataset, u64)> = Vec::new();
    for p in &matrix.profiles {
        let Some((file, sha256)) = p.dataset.file() else { continue };
        if checked.contains(&(&p.dataset, p.requests)) {
            continue;
        }
        checked.push((&p.dataset, p.requests));
        let Some((stored, _)) = store.open_file(sha256)? else {
            return Err(SubmitError::Invalid(format!("file {file} (SHA-256 {sha256}) was not uploaded")));
        };
        let reader = std::io::BufReader::with_capacity(1 << 20, stored);
        let (field, fault) = match &p.dataset {
            Dataset::Trace { format, .. } => {
                let read = benchfleet_core::trace::parse(reader, file, *format);
                let fault = match read {
                    Ok(trace) => trace.holds(p.requests).err(),
                    Err(e) => Some(error_chain(&e)),
                };
                ("dataset.trace.path", fault)
            }
            _ => ("dataset.sharegpt", benchfleet_core::sharegpt::parse(reader, file).err().map(|e| error_chain(&e))),
        };
        if let Some(message) = fault {
            let field = format!("profiles.{}.{field}", p.name);
            let e = matrix::field_error(&sub.matrix_name, &sub.matrix_yaml, &field, message);
            return Err(SubmitError::Invalid(e.to_string()));
        }
    }
    Ok(())
}

/// An error and its source, as one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    match e.source() {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
    }
}

/// What follows a run whose jobs all ended.
#[derive(Debug)]
pub enum Next {
    /// The next round of its searches' probes, or the greedy planner's next
    /// stage, stored.
    Stage { groups: Vec<Group>, jobs: Vec<Job> },
    /// Nothing: the run is finished.
    Finished,
}

/// Plans what follows a run whose jobs all ended, from the store alone (so
/// a restarted controller goes on where the last one stopped), and stores
/// it if there is anything: the next probes of every search not yet done,
/// else a greedy run's next stage.
pub fn next(store: &dyn Store, run_id: RunId) -> Result<Next, StoreError> {
    let Some(run) = store.run(run_id)? else { return Ok(Next::Finished) };
    let matrix = matrix::reparse(&run.matrix_file, &run.matrix_yaml, &|path| {
        Some(run.files.get(path).cloned().unwrap_or_default())
    })
    .map_err(|e| StoreError::Invalid(format!("the stored matrix of run {run_id} no longer parses: {e}")))?;
    let groups = store.groups(run_id)?;
    let jobs = store.jobs(run_id)?;
    // Ids continue after the run's existing ones.
    let first_group = groups.iter().map(|g| g.id + 1).max().unwrap_or(0);
    let first_job = jobs.iter().map(|j| j.id + 1).max().unwrap_or(0);
    let probes = next_probes(&matrix, &groups, &jobs);
    if !probes.is_empty() {
        let mut added = (Vec::new(), Vec::new());
        for (stage, work) in probes {
            let first = (first_group + added.0.len() as u64, first_job + added.1.len() as u64);
            let work: Repeated = work.into_iter().map(|(c, ps)| (c, ps, 1..=matrix.repeats)).collect();
            let (g, j) = groups_of(&run, &matrix, &work, stage, first);
            added.0.extend(g);
            added.1.extend(j);
        }
        let (groups, jobs) = added;
        store.add_groups(run_id, &groups, &jobs)?;
        tracing::info!(run = %run_id, groups = groups.len(), jobs = jobs.len(), "search probes scheduled");
        return Ok(Next::Stage { groups, jobs });
    }
    if matrix.strategy != Strategy::Greedy {
        return Ok(Next::Finished);
    }
    let results = greedy::Results::of(&groups, &jobs, &matrix);
    match greedy::plan(&matrix, &results).plan {
        Plan::Next(stage) => {
            let (groups, jobs) = expand(&run, &matrix, &stage, (first_group, first_job));
            store.add_groups(run_id, &groups, &jobs)?;
            tracing::info!(run = %run_id, stage = stage.number, groups = groups.len(), jobs = jobs.len(), "greedy stage scheduled");
            Ok(Next::Stage { groups, jobs })
        }
        Plan::Done(outcome) => {
            tracing::info!(run = %run_id, winner = ?outcome.winner, "greedy procedure done: {}", outcome.reason);
            Ok(Next::Finished)
        }
    }
}

/// The next probes of every search a configuration of the run has begun
/// and not finished, by stage (the stage its probes so far ran in): each
/// configuration with the probe profiles it runs next.
type Work = Vec<(EngineConfig, Vec<Profile>)>;

/// A stage's work, with the repeats each configuration runs.
type Repeated = Vec<(EngineConfig, Vec<Profile>, RangeInclusive<u32>)>;

fn next_probes(matrix: &Matrix, groups: &[Group], jobs: &[Job]) -> BTreeMap<u32, Work> {
    let mut by_stage: BTreeMap<u32, Work> = BTreeMap::new();
    let stage_of: std::collections::HashMap<u64, u32> = groups.iter().map(|g| (g.id, g.stage)).collect();
    for (g, config_jobs) in search::jobs_by_config(groups, jobs) {
        for (profile, s) in matrix.searches().filter(|(p, _)| g.config.runs(&p.name)) {
            let probes = search::probes_of(&profile.name, config_jobs.iter().copied());
            let Some(stage) =
                probes.iter().flat_map(|(_, js)| js).filter_map(|j| stage_of.get(&j.group)).max().copied()
            else {
                continue;
            };
            let Step::Probe(points) = search::state(s, &probes, matrix.min_success_rate).1 else { continue };
            let work = by_stage.entry(stage).or_default();
            let profiles = points.iter().map(|x| search::probe_profile(profile, s, *x));
            match work.iter_mut().find(|(c, _)| c.name == g.config.name) {
                Some((_, ps)) => ps.extend(profiles),
                None => work.push((g.config.clone(), profiles.collect())),
            }
        }
    }
    by_stage
}

/// The groups and jobs of a stage: one group per configuration, one job per
/// profile it runs and repeat the stage gives it (a search profile: one per
/// point of its first round, the two bounds); ids start at `first` (group,
/// job).
pub fn expand(run: &Run, matrix: &Matrix, stage: &Stage, first: (u64, u64)) -> (Vec<Group>, Vec<Job>) {
    let work: Repeated = stage
        .configs
        .iter()
        .zip(&stage.repeats)
        .map(|(c, repeats)| {
            let runs = stage.profiles.iter().filter(|p| c.runs(&p.name));
            (c.clone(), runs.flat_map(first_round).collect(), repeats.clone())
        })
        .collect();
    groups_of(run, matrix, &work, stage.number, first)
}

/// The jobs a profile starts with: itself, or a search's first probes.
fn first_round(p: &Profile) -> Vec<Profile> {
    match &p.search {
        None => vec![p.clone()],
        Some(s) => match search::step(s, &[]) {
            Step::Probe(points) => points.iter().map(|x| search::probe_profile(p, s, *x)).collect(),
            Step::Waiting | Step::Done(_) => Vec::new(),
        },
    }
}

/// One group per configuration, one job per profile given and repeat.
fn groups_of(run: &Run, matrix: &Matrix, work: &Repeated, stage: u32, first: (u64, u64)) -> (Vec<Group>, Vec<Job>) {
    let (mut groups, mut jobs) = (Vec::new(), Vec::new());
    for (n, (config, profiles, repeats)) in work.iter().enumerate() {
        let mut config = config.clone();
        if let Some(r) = run.runtime_override {
            config.runtime = r;
        }
        let mut group = Group {
            run: run.id,
            id: first.0 + n as u64,
            config,
            gpu: matrix.gpu.clone(),
            gpus_per_job: matrix.gpus_per_job,
            jobs: Vec::new(),
            stage,
            placement: None,
            failed_on: Vec::new(),
            pin: None,
        };
        for profile in profiles {
            for repeat in repeats.clone() {
                let id = first.1 + jobs.len() as u64;
                group.jobs.push(id);
                jobs.push(Job::new(run.id, id, group.id, profile.clone(), repeat));
            }
        }
        groups.push(group);
    }
    (groups, jobs)
}

pub fn unix_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SledStore;

    fn stored(store: &SledStore, bytes: &[u8]) -> String {
        use sha2::Digest as _;
        let sha: String = sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect();
        let mut w = store.new_file().expect("a file");
        w.write(bytes).expect("written");
        w.finish(&sha, bytes.len() as u64).expect("stored");
        sha
    }

    /// Marks every pending job of the run succeeded with a P99 TTFT that
    /// crosses 200 ms at a concurrency of 37.
    fn finish_probes(store: &SledStore, run: RunId) {
        use crate::records::Write;
        use benchfleet_study::model::JobState;
        let mut summaries = Vec::new();
        let mut done = Vec::new();
        for mut j in store.jobs(run).expect("jobs").into_iter().filter(|j| !j.state.is_terminal()) {
            let cap = j.profile.max_concurrency.expect("a probe's cap");
            let mut s = benchfleet_core::Summary { successful: 10, ..Default::default() };
            s.ttft_ms.p99 = if cap <= 37 { 150.0 } else { 250.0 };
            j.state = JobState::Succeeded;
            j.attempt = 1;
            summaries.push((j.key(), s));
            done.push(Write::Job(j));
        }
        store.commit_records(&crate::store::RecordCommit { summaries, ..Default::default() }).expect("summaries");
        store.apply(&done).expect("jobs");
    }

    #[test]
    fn a_search_goes_on_round_by_round_from_the_store_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let yaml = "name: s\nmodel: m\nhardware: { gpu: H200 }\nengines:\n  vllm: { runtime: process }\n\
                    variants:\n  fp8: { args: [--kv-cache-dtype=fp8] }\nprofiles:\n  \
                    cap: { dataset: { random: { input_tokens: 8, output_tokens: 8 } }, requests: 10, \
                    search: { max_concurrency: [1, 64], steps: 20, slo: { ttft_p99_ms: 200 } } }\n  \
                    fixed: { dataset: { random: { input_tokens: 8, output_tokens: 8 } }, requests: 10, \
                    max_concurrency: 4 }\nrepeats: 2\n";
        let sub = Submission { matrix_name: "s.yaml".into(), matrix_yaml: yaml.into(), ..Submission::default() };
        let run = {
            let store = SledStore::open(&dir.path().join("store")).expect("store");
            let prepared = prepare(&store, &sub, || Ok(RunId(1))).expect("valid");
            // Each configuration: the fixed profile, and the search's two
            // bounds, each twice.
            let names: Vec<String> =
                prepared.jobs.iter().filter(|j| j.group == 0).map(|j| j.profile.name.clone()).collect();
            assert_eq!(names, ["cap@c1", "cap@c1", "cap@c64", "cap@c64", "fixed", "fixed"]);
            assert_eq!(prepared.jobs.len(), 12);
            store.create_run(&prepared.run, &prepared.groups, &prepared.jobs).expect("stored");
            prepared.run.id
        };
        let mut rounds = Vec::new();
        loop {
            // A controller restarted between rounds: only the store is left.
            let store = SledStore::open(&dir.path().join("store")).expect("store");
            finish_probes(&store, run);
            match next(&store, run).expect("planned") {
                Next::Stage { groups, jobs } => {
                    assert_eq!(groups.len(), 2, "one group per configuration");
                    assert!(jobs.iter().all(|j| j.repeat <= 2) && jobs.len() == 4, "{jobs:?}");
                    rounds.push(jobs[0].profile.max_concurrency.expect("a cap"));
                }
                Next::Finished => break,
            }
        }
        assert_eq!(rounds, [32, 48, 40, 36, 38, 37]);
        let store = SledStore::open(&dir.path().join("store")).expect("store");
        let jobs = store.jobs(run).expect("jobs");
        assert_eq!(jobs.len(), 12 + 6 * 4, "every probe is kept");
        let ids: std::collections::BTreeSet<u64> = jobs.iter().map(|j| j.id).collect();
        assert_eq!(ids.len(), jobs.len(), "job ids are unique");
    }

    #[test]
    fn a_broken_dataset_is_the_matrix_s_error_before_anything_is_stored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(&dir.path().join("store")).expect("store");
        let yaml = "name: d\nmodel: m\nhardware: { gpu: H200 }\nengines:\n  vllm: {}\nprofiles:\n  \
                    chat: { dataset: { sharegpt: chat.json }, requests: 2 }\n";
        let submission = |sha: String| Submission {
            matrix_name: "d.yaml".into(),
            matrix_yaml: yaml.into(),
            runtime_override: String::new(),
            fleet_per: String::new(),
            fleet_hosts: String::new(),
            files: [("chat.json".to_owned(), sha)].into_iter().collect(),
        };
        let good = br#"[{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}]"#;
        assert!(prepare(&store, &submission(stored(&store, good)), || Ok(RunId(1))).is_ok());
        let broken = stored(&store, b"[{\"conversations\": [}]");
        match prepare(&store, &submission(broken), || Ok(RunId(2))) {
            Err(SubmitError::Invalid(why)) => assert!(
                why.starts_with(
                    "d.yaml:7: profiles.chat.dataset.sharegpt: the ShareGPT file chat.json is not valid JSON at line 1"
                ),
                "{why}"
            ),
            other => panic!("accepted: {:?}", other.map(|p| p.run.id)),
        }
        assert!(store.runs().expect("runs").is_empty(), "nothing stored");
    }

    #[test]
    fn a_broken_or_short_trace_is_the_matrix_s_error_before_anything_is_stored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(&dir.path().join("store")).expect("store");
        let submission = |sha: String, requests: u32| Submission {
            matrix_name: "t.yaml".into(),
            matrix_yaml: format!(
                "name: t\nmodel: m\nhardware: {{ gpu: H200 }}\nengines:\n  vllm: {{}}\nprofiles:\n  \
                 replay: {{ dataset: {{ trace: {{ path: t.jsonl }} }}, requests: {requests} }}\n"
            ),
            runtime_override: String::new(),
            fleet_per: String::new(),
            fleet_hosts: String::new(),
            files: [("t.jsonl".to_owned(), sha)].into_iter().collect(),
        };
        let line = r#"{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [1]}"#;
        let good = stored(&store, format!("{line}\n{line}\n").as_bytes());
        assert!(prepare(&store, &submission(good.clone(), 2), || Ok(RunId(1))).is_ok());
        let broken = stored(&store, format!("{line}\n{{\"timestamp\": 3}}\n").as_bytes());
        for (sub, said) in [
            (
                submission(good, 3),
                "t.yaml:7: profiles.replay.dataset.trace.path: 3 requests asked of the trace t.jsonl, which has 2",
            ),
            (submission(broken, 1), "t.yaml:7: profiles.replay.dataset.trace.path: t.jsonl line 2: no output_length"),
        ] {
            match prepare(&store, &sub, || Ok(RunId(2))) {
                Err(SubmitError::Invalid(why)) => assert!(why.starts_with(said), "{why}"),
                other => panic!("accepted: {:?}", other.map(|p| p.run.id)),
            }
        }
        assert!(store.runs().expect("runs").is_empty(), "nothing stored");
    }

    #[test]
    fn a_fleet_check_s_host_list_is_the_matrix_s_unless_the_command_gives_one() {
        let yaml = "name: f\nmodel: m\nstrategy: fleet\nfleet: { hosts: 'gpu[01-04]' }\nhardware: { gpu: H200 }\n\
                    engines:\n  vllm: {}\nprofiles:\n  p: { dataset: { random: { input_tokens: 8, output_tokens: 8 } }, requests: 2 }\n";
        let sub = |hosts: &str| Submission {
            matrix_name: "f.yaml".into(),
            matrix_yaml: yaml.into(),
            fleet_hosts: hosts.into(),
            ..Submission::default()
        };
        let hosts = |hosts: &str| {
            let prepared = prepare_dry(&sub(hosts), || Ok(RunId(1))).expect("valid");
            let list = prepared.fleet.expect("a fleet check").hosts.expect("a host list");
            ["gpu01", "gpu04", "gpu05", "cpu01"].into_iter().filter(|h| list.matches(h)).collect::<Vec<_>>()
        };
        assert_eq!(hosts(""), ["gpu01", "gpu04"], "the matrix's");
        assert_eq!(hosts("cpu*"), ["cpu01"], "the command's");
        let bad = prepare_dry(&sub("gpu[9-1]"), || Ok(RunId(1))).map(|_| ()).expect_err("refused").to_string();
        assert!(bad.contains("the range runs backwards"), "{bad}");
    }
}
