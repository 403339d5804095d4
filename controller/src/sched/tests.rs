//! The scheduler's scenarios, in virtual time: placement, leases, claims,
//! restarts, the attempt cap, cancellation, drain, deadlines, and what an
//! operator is told while a run waits.

use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use benchfleet_study::model::{AttemptOutcome, Dataset, JobState, Note, Pin, RunState, RuntimeKind};

/// A scheduler in virtual time, and a store that keeps what it asked to
/// write.
pub(super) struct World {
    pub s: Scheduler,
    pub t0: Instant,
    pub ms: u64,
    pub store: FakeStore,
    /// Everything sent, in order.
    pub sent: Vec<(AgentId, u64, ToAgent)>,
    pub closed: Vec<(AgentId, u64)>,
    pub ended: Vec<RunId>,
}

/// What the scheduler persisted, as a store would hold it.
#[derive(Clone, Debug, Default)]
pub(super) struct FakeStore {
    pub counters: Counters,
    pub agents: BTreeMap<AgentId, AgentRecord>,
    pub runs: BTreeMap<RunId, Run>,
    pub groups: BTreeMap<(RunId, u64), Group>,
    pub jobs: BTreeMap<(RunId, u64), Job>,
    pub summaries: Vec<AttemptKey>,
    pub telemetry: BTreeMap<AttemptKey, Vec<benchfleet_core::telemetry::Series>>,
}

impl FakeStore {
    pub fn apply(&mut self, w: Write) {
        match w {
            Write::Agent(a) => {
                self.agents.insert(a.id, a);
            }
            Write::Run(r) => {
                self.runs.insert(r.id, r);
            }
            Write::Group(g) => {
                self.groups.insert((g.run, g.id), g);
            }
            Write::Job(j) => {
                self.jobs.insert((j.run, j.id), j);
            }
            Write::Counters(c) => self.counters = c,
            Write::Telemetry(key, series) => {
                self.telemetry.insert(key, series);
            }
        }
    }

    pub fn run_data(&self) -> Vec<RunData> {
        self.runs
            .values()
            .filter(|r| !r.is_over() || self.groups.values().any(|g| g.run == r.id && g.placement.is_some()))
            .map(|r| RunData {
                run: r.clone(),
                groups: self.groups.values().filter(|g| g.run == r.id).cloned().collect(),
                jobs: self.jobs.values().filter(|j| j.run == r.id).cloned().collect(),
                summaries: self.summaries.iter().copied().filter(|k| k.run == r.id).collect(),
            })
            .collect()
    }
}

pub(super) fn config() -> SchedConfig {
    SchedConfig {
        heartbeat_interval: Duration::from_millis(100),
        suspect_after: Duration::from_millis(300),
        lease_ttl: Duration::from_secs(1),
        restart_grace: Duration::from_secs(2),
        attempt_cap: 3,
        max_attempts: 10,
        attempt_deadline: Duration::from_secs(60),
        mass_silence_min_agents: 3,
        mass_silence_max_hold: Duration::from_secs(30),
    }
}

impl World {
    pub fn new() -> World {
        let t0 = Instant::now();
        World {
            s: Scheduler::new(config(), Now { at: t0, unix_ms: 0 }),
            t0,
            ms: 0,
            store: FakeStore::default(),
            sent: Vec::new(),
            closed: Vec::new(),
            ended: Vec::new(),
        }
    }

    pub fn now(&self) -> Now {
        Now { at: self.t0 + Duration::from_millis(self.ms), unix_ms: self.ms as i64 }
    }

    /// Carries out commands as the driver would (planning: a run whose
    /// jobs ended is finished).
    pub fn settle(&mut self) {
        let now = self.now();
        self.s.dispatch(now);
        loop {
            let commands = self.s.take_commands();
            if commands.is_empty() {
                return;
            }
            for c in commands {
                match c {
                    Command::Persist(w) => self.store.apply(w),
                    Command::Send { agent, session, msg } => self.sent.push((agent, session, msg)),
                    Command::CloseSession { agent, session, .. } => self.closed.push((agent, session)),
                    Command::RunEnded(run) => {
                        self.ended.push(run);
                        self.s.finish_run(now, run);
                    }
                    Command::OpenFence(_) | Command::CloseFence(_) | Command::Purge(_) => {}
                }
            }
            self.s.dispatch(now);
        }
    }

    pub fn advance(&mut self, ms: u64) {
        self.ms += ms;
        let now = self.now();
        self.s.tick(now);
        self.settle();
    }

    pub fn hello(
        &mut self,
        name: &str,
        instance: &str,
        gpus: Vec<GpuState>,
        claims: Vec<Claim>,
    ) -> Result<Welcome, Refused> {
        self.hello_priced(name, instance, gpus, claims, None)
    }

    /// `hello` from an agent that says what its GPU-hour costs.
    pub fn hello_priced(
        &mut self,
        name: &str,
        instance: &str,
        gpus: Vec<GpuState>,
        claims: Vec<Claim>,
        price: Option<benchfleet_core::cost::Price>,
    ) -> Result<Welcome, Refused> {
        let now = self.now();
        let hello = Hello {
            name: name.into(),
            hostname: format!("{name}.lab"),
            instance: instance.into(),
            gpus,
            runtimes: vec!["process".into()],
            claims,
            peer: "127.0.0.1:5000".into(),
            price,
            ..Hello::default()
        };
        let w = self.s.hello(now, hello);
        self.settle();
        w
    }

    pub fn beat(&mut self, w: &Welcome) {
        let now = self.now();
        self.s.heartbeat(now, w.agent, w.epoch, 1);
        self.settle();
    }

    /// Assignments sent to an agent's session, in order.
    pub fn assigned(&self, w: &Welcome) -> Vec<Assignment> {
        self.sent
            .iter()
            .filter(|(a, s, _)| *a == w.agent && *s == w.epoch)
            .filter_map(|(_, _, m)| match m {
                ToAgent::Assign(a) => Some((**a).clone()),
                _ => None,
            })
            .collect()
    }

    pub fn cancels(&self, w: &Welcome) -> Vec<(RunId, u64)> {
        self.sent
            .iter()
            .filter(|(a, s, _)| *a == w.agent && *s == w.epoch)
            .filter_map(|(_, _, m)| match m {
                ToAgent::Cancel { run, group, .. } => Some((*run, *group)),
                _ => None,
            })
            .collect()
    }

    pub fn submit(&mut self, run: u64, groups: u64, jobs_per_group: u64, gpu: &str, gpus: u32) -> RunId {
        self.submit_pinned(run, groups, jobs_per_group, (gpu, gpus), &[])
    }

    /// A run whose group `g` is pinned to `pins[g]` (a fleet check's), where given.
    pub fn submit_pinned(
        &mut self,
        run: u64,
        groups: u64,
        jobs_per_group: u64,
        (gpu, gpus): (&str, u32),
        pins: &[Pin],
    ) -> RunId {
        let id = RunId(run);
        let r = Run {
            id,
            name: format!("run {run}"),
            matrix_file: "m.yaml".into(),
            matrix_yaml: String::new(),
            created_unix_ms: 0,
            state: RunState::Running,
            ended_unix_ms: None,
            note: None,
            files: Default::default(),
            runtime_override: None,
            fleet: None,
        };
        let mut gs = Vec::new();
        let mut js = Vec::new();
        for g in 0..groups {
            let ids: Vec<u64> = (0..jobs_per_group).map(|j| g * jobs_per_group + j).collect();
            for &j in &ids {
                js.push(Job::new(id, j, g, profile(), 1));
            }
            gs.push(Group {
                run: id,
                id: g,
                config: EngineConfig::test(&format!("config-{g}"), &[]),
                gpu: (!gpu.is_empty()).then(|| gpu.to_owned()),
                gpus_per_job: gpus,
                jobs: ids,
                stage: 1,
                placement: None,
                failed_on: Vec::new(),
                pin: pins.get(g as usize).cloned(),
            });
        }
        for g in &gs {
            self.store.apply(Write::Group(g.clone()));
        }
        for j in &js {
            self.store.apply(Write::Job(j.clone()));
        }
        self.store.apply(Write::Run(r.clone()));
        let now = self.now();
        self.s.submit(now, r, gs, js);
        self.settle();
        id
    }

    pub fn update(&mut self, w: &Welcome, fence: Fence, state: Reported) -> bool {
        let now = self.now();
        let mut u = Update::new(fence, state);
        if let Reported::Failed(_) = state {
            u.error = Some("engine crashed".into());
        }
        let applied = self.s.job_update(now, w.agent, w.epoch, u);
        self.settle();
        applied
    }

    /// Runs a job to success as an agent with loadgen would.
    pub fn succeed(&mut self, w: &Welcome, fence: Fence) {
        assert!(self.update(w, fence, Reported::Running), "running {fence:?}");
        self.s.summary_stored(fence.key);
        self.store.summaries.push(fence.key);
        assert!(self.update(w, fence, Reported::Succeeded), "succeeded {fence:?}");
    }

    pub fn done(&mut self, w: &Welcome, a: &Assignment) -> bool {
        let now = self.now();
        let r = self.s.group_done(now, w.agent, w.epoch, a.run, a.group, a.epoch);
        self.settle();
        r
    }

    pub fn job(&self, run: RunId, job: u64) -> &Job {
        &self.store.jobs[&(run, job)]
    }

    /// A controller restart: a new scheduler from what was stored.
    pub fn restart(&mut self) {
        let now = self.now();
        let (s, first) = Scheduler::restore(
            config(),
            now,
            self.store.counters,
            self.store.agents.values().cloned().collect(),
            self.store.run_data(),
        );
        self.s = s;
        self.sent.clear();
        for c in first {
            if let Command::Persist(w) = c {
                self.store.apply(w);
            }
        }
        self.settle();
    }
}

fn profile() -> Profile {
    Profile::new("p", Dataset::Random { input_tokens: 4, output_tokens: 2, seed: 0 }, 1)
}

pub(super) fn gpu(index: u32, name: &str) -> GpuState {
    GpuState { index, uuid: format!("GPU-{index}"), name: name.into(), usable: true, ..GpuState::default() }
}

pub(super) fn h200s(n: u32) -> Vec<GpuState> {
    (0..n).map(|i| gpu(i, "NVIDIA H200")).collect()
}

fn claims(assigned: &[Assignment]) -> Vec<Claim> {
    assigned
        .iter()
        .map(|a| Claim { run: a.run, group: a.group, attempts: a.jobs.iter().map(|j| j.fence).collect() })
        .collect()
}

#[test]
fn groups_run_side_by_side_on_their_own_gpus_of_the_right_model() {
    let mut w = World::new();
    let gpus = vec![gpu(0, "NVIDIA H200"), gpu(1, "NVIDIA A100-SXM4-80GB"), gpu(2, "NVIDIA H200")];
    let a = w.hello("host-1", "i1", gpus, Vec::new()).expect("welcome");
    let run = w.submit(1, 3, 1, "H200", 1);
    let first = w.assigned(&a);
    assert_eq!(first.len(), 2, "two H200s, two groups at once");
    assert_eq!(first.iter().map(|g| g.gpus.clone()).collect::<Vec<_>>(), [vec!["GPU-0"], vec!["GPU-2"]]);
    w.succeed(&a, first[0].jobs[0].fence);
    assert!(w.done(&a, &first[0]));
    let all = w.assigned(&a);
    assert_eq!(all.len(), 3);
    assert_eq!((all[2].group, all[2].gpus.as_slice()), (2, &["GPU-0".to_owned()][..]));
    assert_eq!(w.job(run, 0).state, JobState::Succeeded);
}

#[test]
fn each_attempt_keeps_the_gpu_hour_price_its_agent_said() {
    let mut w = World::new();
    let price = benchfleet_core::cost::Price { gpu_hour: 2.75, currency: "EUR".into() };
    let a = w.hello_priced("host-1", "i1", h200s(1), Vec::new(), Some(price.clone())).expect("welcome");
    let b = w.hello("host-2", "i2", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit(1, 2, 1, "H200", 1);
    let (on_a, on_b) = (w.assigned(&a), w.assigned(&b));
    assert_eq!((on_a.len(), on_b.len()), (1, 1));
    let price_of = |w: &World, group: u64| {
        let job = (0..2).map(|j| w.job(run, j)).find(|j| j.group == group).expect("the group's job");
        job.attempts.last().and_then(|a| a.price.clone())
    };
    assert_eq!(price_of(&w, on_a[0].group), Some(price));
    assert_eq!(price_of(&w, on_b[0].group), None, "an agent that says none leaves the matrix's");
}

#[test]
fn a_second_agent_with_the_same_name_is_refused_naming_the_first() {
    let mut w = World::new();
    let a = w.hello("gpu-01", "first", h200s(1), Vec::new()).expect("welcome");
    let refused = w.hello("gpu-01", "clone", h200s(1), Vec::new()).expect_err("a clone is refused");
    assert!(
        refused.0.contains("already holds the name 'gpu-01'") && refused.0.contains(&a.agent.to_string()),
        "{refused}"
    );
    w.beat(&a);
    assert!(w.closed.is_empty(), "the first keeps its session");
    // The same process may replace its own session.
    let again = w.hello("gpu-01", "first", h200s(1), Vec::new()).expect("the same instance reconnects");
    assert_eq!(again.agent, a.agent);
    assert!(again.epoch > a.epoch);
    assert_eq!(w.closed, [(a.agent, a.epoch)]);
}

#[test]
fn a_lost_lease_reruns_the_group_elsewhere_and_fences_the_old_attempt() {
    let mut w = World::new();
    let a = w.hello("a", "ia", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit(1, 1, 2, "H200", 1);
    let old = w.assigned(&a).remove(0);
    w.succeed(&a, old.jobs[0].fence);
    assert!(w.update(&a, old.jobs[1].fence, Reported::Running));
    let b = w.hello("b", "ib", h200s(1), Vec::new()).expect("welcome");
    for _ in 0..12 {
        w.beat(&b);
        w.advance(100);
    }
    // a is silent past its lease; its running attempt is abandoned.
    let new = w.assigned(&b);
    assert_eq!(new.len(), 1, "the group runs again on b");
    assert_eq!(new[0].jobs.len(), 1, "the job that succeeded is not run again");
    assert_eq!((new[0].jobs[0].fence.key.job, new[0].jobs[0].fence.key.attempt), (1, 2));
    let job = w.job(run, 1);
    assert_eq!(job.attempts[0].outcome, AttemptOutcome::Abandoned);
    assert!(job.attempts[0].reason.as_deref().is_some_and(|r| r.contains("lost its lease")), "{job:?}");
    // The old attempt's news changes nothing.
    assert!(!w.update(&a, old.jobs[1].fence, Reported::Succeeded));
    assert_eq!(w.job(run, 0).state, JobState::Succeeded);
    w.succeed(&b, new[0].jobs[0].fence);
    assert!(w.done(&b, &new[0]));
    assert_eq!(w.store.runs[&run].state, RunState::Finished);
}

#[test]
fn an_agent_that_reconnects_within_its_lease_keeps_its_groups() {
    let mut w = World::new();
    let a = w.hello("a", "ia", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit(1, 1, 1, "H200", 1);
    let g = w.assigned(&a);
    assert!(w.update(&a, g[0].jobs[0].fence, Reported::Running));
    let now = w.now();
    w.s.session_closed(now, a.agent, a.epoch);
    w.advance(500);
    let back = w.hello("a", "ia", h200s(1), claims(&g)).expect("welcome");
    assert_eq!(back.keep, [(run, 0)]);
    assert!(w.assigned(&back).is_empty(), "nothing assigned again");
    w.succeed(&back, g[0].jobs[0].fence);
    assert_eq!(w.job(run, 0).state, JobState::Succeeded);
    assert_eq!(w.job(run, 0).attempts.len(), 1);
}

#[test]
fn a_restarted_agent_that_claims_nothing_loses_what_it_ran() {
    let mut w = World::new();
    let a = w.hello("a", "ia", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit(1, 1, 1, "H200", 1);
    let g = w.assigned(&a);
    assert!(w.update(&a, g[0].jobs[0].fence, Reported::Running));
    let now = w.now();
    w.s.session_closed(now, a.agent, a.epoch);
    let back = w.hello("a", "new-process", h200s(1), Vec::new()).expect("welcome");
    assert!(back.keep.is_empty());
    let again = w.assigned(&back);
    assert_eq!(again.len(), 1, "assigned again at once, as a new attempt");
    assert_eq!(again[0].jobs[0].fence.key.attempt, 2);
    assert!(w.job(run, 0).attempts[0].reason.as_deref().is_some_and(|r| r.contains("came back without it")));
}

#[test]
fn a_restarted_controller_lets_running_attempts_go_on() {
    let mut w = World::new();
    let a = w.hello("a", "ia", h200s(1), Vec::new()).expect("welcome");
    let idle = w.hello("idle", "ii", Vec::new(), Vec::new()).expect("welcome");
    let run = w.submit(1, 1, 2, "H200", 1);
    let g = w.assigned(&a);
    w.succeed(&a, g[0].jobs[0].fence);
    assert!(w.update(&a, g[0].jobs[1].fence, Reported::Running));
    w.restart();
    // Within the grace nobody is lost, though nobody has spoken yet.
    w.advance(1500);
    assert_eq!(w.job(run, 1).state, JobState::Running);
    let back = w.hello("a", "ia", h200s(1), claims(&g)).expect("welcome");
    assert_eq!(back.agent, a.agent, "the agent keeps its id");
    assert!(back.epoch > a.epoch.max(idle.epoch), "epochs never repeat across restarts");
    assert_eq!(back.keep, [(run, 0)]);
    for _ in 0..20 {
        w.beat(&back);
        w.advance(100);
    }
    w.succeed(&back, g[0].jobs[1].fence);
    assert!(w.done(&back, &g[0]));
    assert_eq!(w.store.runs[&run].state, RunState::Finished);
    assert_eq!(w.job(run, 1).attempts.len(), 1, "no attempt was thrown away");
}

#[test]
fn an_agent_that_does_not_come_back_after_a_restart_is_lost_after_the_grace() {
    let mut w = World::new();
    let a = w.hello("a", "ia", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit(1, 1, 1, "H200", 1);
    let g = w.assigned(&a);
    assert!(w.update(&a, g[0].jobs[0].fence, Reported::Running));
    w.restart();
    let b = w.hello("b", "ib", h200s(1), Vec::new()).expect("welcome");
    for _ in 0..15 {
        w.beat(&b);
        w.advance(100);
    }
    assert!(w.assigned(&b).is_empty(), "still within the grace");
    for _ in 0..10 {
        w.beat(&b);
        w.advance(100);
    }
    let moved = w.assigned(&b);
    assert_eq!(moved.len(), 1);
    assert!(w.job(run, 0).attempts[0].reason.as_deref().is_some_and(|r| r.contains("restart grace")));
}

#[test]
fn when_most_agents_go_silent_at_once_nobody_is_lost_for_a_while() {
    let mut w = World::new();
    let agents: Vec<Welcome> =
        (0..4).map(|i| w.hello(&format!("a{i}"), "i", h200s(1), Vec::new()).expect("welcome")).collect();
    let run = w.submit(1, 4, 1, "H200", 1);
    for a in &agents {
        assert_eq!(w.assigned(a).len(), 1);
    }
    // Only a0 is heard from: 3 of 4 are silent.
    for _ in 0..30 {
        w.beat(&agents[0]);
        w.advance(100);
    }
    assert!(w.store.jobs.values().all(|j| j.attempts.len() == 1 && j.state == JobState::Assigned), "no one lost");
    // Past the longest hold, leases are enforced.
    for _ in 0..300 {
        w.beat(&agents[0]);
        w.advance(100);
    }
    let lost = (1..4).filter(|j| w.job(run, *j).attempts[0].outcome == AttemptOutcome::Abandoned).count();
    assert_eq!(lost, 3);
}

#[test]
fn a_job_that_keeps_failing_fails_for_good_naming_the_hosts() {
    let mut w = World::new();
    let agents: Vec<Welcome> =
        (0..3).map(|i| w.hello(&format!("host-{i}"), "i", h200s(1), Vec::new()).expect("welcome")).collect();
    let run = w.submit(1, 1, 1, "H200", 1);
    let mut hosts = Vec::new();
    for _ in 0..3 {
        let (agent, g) = agents
            .iter()
            .find_map(|a| {
                w.assigned(a)
                    .into_iter()
                    .find(|g| g.jobs[0].fence.key.attempt as usize == hosts.len() + 1)
                    .map(|g| (a.clone(), g))
            })
            .expect("assigned");
        hosts.push(agent.agent);
        assert!(w.update(&agent, g.jobs[0].fence, Reported::StartingEngine));
        assert!(w.update(&agent, g.jobs[0].fence, Reported::Failed(FailureKind::Attempt)));
        assert!(w.done(&agent, &g));
    }
    hosts.sort();
    hosts.dedup();
    assert_eq!(hosts.len(), 3, "each retry went to another host");
    let job = w.job(run, 0);
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.error.as_deref(), Some("failed on 3 hosts: engine crashed"));
    assert_eq!(w.store.runs[&run].state, RunState::Finished);
}

#[test]
fn a_bad_configuration_is_not_retried() {
    let mut w = World::new();
    let a = w.hello("a", "i", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit(1, 1, 1, "H200", 1);
    let g = w.assigned(&a).remove(0);
    assert!(w.update(&a, g.jobs[0].fence, Reported::Failed(FailureKind::Config)));
    assert!(w.done(&a, &g));
    assert_eq!(w.job(run, 0).state, JobState::Failed);
    assert_eq!(w.assigned(&a).len(), 1);
}

#[test]
fn success_without_a_stored_summary_is_a_failed_attempt() {
    let mut w = World::new();
    let a = w.hello("a", "i", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit(1, 1, 1, "H200", 1);
    let g = w.assigned(&a).remove(0);
    assert!(w.update(&a, g.jobs[0].fence, Reported::Running));
    assert!(w.update(&a, g.jobs[0].fence, Reported::Succeeded));
    assert_eq!(w.job(run, 0).state, JobState::Pending);
    assert!(w.job(run, 0).error.as_deref().is_some_and(|e| e.contains("summary never reached")));
}

#[test]
fn cancel_stops_running_groups_and_holds_their_gpus_until_they_stop() {
    let mut w = World::new();
    let a = w.hello("a", "i", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit(1, 2, 1, "H200", 1);
    let g = w.assigned(&a).remove(0);
    let note = Note { by: "ops".into(), reason: "wrong model".into(), at_unix_ms: 0 };
    let now = w.now();
    w.s.cancel(now, run, note.clone()).expect("cancelled");
    w.settle();
    assert_eq!(w.s.cancel(now, run, note), Err(SchedError::RunOver(run)), "held until its group stops");
    assert_eq!(w.cancels(&a), [(run, g.group)]);
    assert!(w.store.jobs.values().all(|j| j.state == JobState::Cancelled));
    assert_eq!(w.store.runs[&run].state, RunState::Cancelled);
    assert!(w.ended.is_empty(), "a cancelled run is not planned");
    // Another run waits for the GPU until the engine is stopped.
    let other = w.submit(2, 1, 1, "H200", 1);
    assert_eq!(w.assigned(&a).len(), 1);
    assert!(w.done(&a, &g));
    let next = w.assigned(&a);
    assert_eq!((next.len(), next[1].run), (2, other));
    let now = w.now();
    let again = w.s.cancel(now, run, Note { by: String::new(), reason: String::new(), at_unix_ms: 0 });
    assert_eq!(again, Err(SchedError::NotRunning(run)), "forgotten once its GPUs are free");
    assert_eq!(again.expect_err("refused").to_string(), format!("run {run} is not running"));
}

#[test]
fn a_drained_agent_finishes_its_work_and_gets_no_more() {
    let mut w = World::new();
    let a = w.hello("a", "i", h200s(2), Vec::new()).expect("welcome");
    w.submit(1, 1, 1, "H200", 1);
    let g = w.assigned(&a).remove(0);
    let now = w.now();
    w.s.drain(now, "a", Note { by: "ops".into(), reason: "maintenance".into(), at_unix_ms: 0 }).expect("drained");
    w.settle();
    let run2 = w.submit(2, 1, 1, "H200", 1);
    assert_eq!(w.assigned(&a).len(), 1, "no new work");
    assert!(w.s.waiting(run2, w.now())[0].contains("drained"), "{:?}", w.s.waiting(run2, w.now()));
    w.succeed(&a, g.jobs[0].fence);
    assert!(w.store.agents[&a.agent].drain.is_some());
    let now = w.now();
    w.s.undrain(now, &a.agent.to_string()).expect("undrained");
    w.settle();
    assert_eq!(w.assigned(&a).len(), 2);
    let nobody = w.s.drain(now, "nobody", Note { by: String::new(), reason: String::new(), at_unix_ms: 0 });
    assert_eq!(nobody, Err(SchedError::NoSuchAgent("nobody".into())));
    assert_eq!(
        nobody.expect_err("refused").to_string(),
        "no agent named 'nobody' or with that id; `benchfleet agents` lists them"
    );
    assert_eq!(w.s.undrain(now, "agent-99"), Err(SchedError::NoSuchAgent("agent-99".into())));
}

#[test]
fn an_attempt_past_its_deadline_is_abandoned_and_only_it_is_charged() {
    let mut w = World::new();
    let a = w.hello("a", "i", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit(1, 1, 2, "H200", 1);
    let g = w.assigned(&a).remove(0);
    assert!(w.update(&a, g.jobs[0].fence, Reported::Running));
    for _ in 0..121 {
        w.beat(&a);
        w.advance(500);
    }
    assert_eq!(w.cancels(&a), [(run, 0)]);
    let late = w.job(run, 0);
    assert!(late.attempts[0].charged && late.attempts[0].reason.as_deref().is_some_and(|r| r.contains("deadline")));
    assert!(!w.job(run, 1).attempts[0].charged, "the job that never started is not charged");
}

#[test]
fn a_run_that_cannot_be_placed_says_why() {
    let mut w = World::new();
    let run = w.submit(1, 1, 1, "A100", 1);
    assert_eq!(
        w.s.submit_warnings(run, w.now()),
        ["waiting for an agent: none has connected (each job needs an A100)"]
    );
    let a = w.hello("a", "i", h200s(1), Vec::new()).expect("welcome");
    assert_eq!(w.s.submit_warnings(run, w.now()), ["no agent has an A100"]);
    let two = w.submit(2, 1, 1, "H200", 2);
    assert_eq!(w.s.waiting(two, w.now()), ["no agent has 2 H200s"]);
    let mut bad = gpu(0, "NVIDIA H200");
    bad.usable = false;
    bad.reasons = vec!["ECC uncorrectable errors: 3".into()];
    let now = w.now();
    w.s.gpu_report(now, a.agent, a.epoch, vec![bad]);
    let three = w.submit(3, 1, 1, "H200", 1);
    assert_eq!(
        w.s.waiting(three, w.now()),
        ["no agent has an H200 that passes its GPU checks (a GPU 0: ECC uncorrectable errors: 3)"]
    );
}

#[test]
fn retry_runs_failed_jobs_again_with_a_fresh_cap() {
    let mut w = World::new();
    let a = w.hello("a", "i", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit(1, 1, 2, "H200", 1);
    let g = w.assigned(&a).remove(0);
    let now = w.now();
    assert_eq!(w.s.retry(now, w.store.run_data_of(run)), Err(SchedError::StillRunning(run)));
    w.succeed(&a, g.jobs[0].fence);
    assert!(w.update(&a, g.jobs[1].fence, Reported::Failed(FailureKind::Config)));
    assert!(w.done(&a, &g));
    assert_eq!(w.store.runs[&run].state, RunState::Finished);
    let data = w.store.run_data_of(run);
    let now = w.now();
    assert_eq!(w.s.retry(now, data).expect("retried"), 1);
    w.settle();
    let again = w.assigned(&a);
    assert_eq!(again.len(), 2);
    assert_eq!(again[1].jobs.iter().map(|j| (j.fence.key.job, j.fence.key.attempt)).collect::<Vec<_>>(), [(1, 2)]);
    assert_eq!(w.store.runs[&run].state, RunState::Running);
    // Once every job has succeeded there is nothing to retry.
    w.succeed(&a, again[1].jobs[0].fence);
    assert!(w.done(&a, &again[1]));
    assert_eq!(w.store.runs[&run].state, RunState::Finished);
    let now = w.now();
    let nothing = w.s.retry(now, w.store.run_data_of(run));
    assert_eq!(nothing, Err(SchedError::NothingToRetry(run)));
    assert_eq!(
        nothing.expect_err("refused").to_string(),
        format!("run {run} has no failed or cancelled jobs to retry")
    );
}

impl FakeStore {
    fn run_data_of(&self, run: RunId) -> RunData {
        RunData {
            run: self.runs[&run].clone(),
            groups: self.groups.values().filter(|g| g.run == run).cloned().collect(),
            jobs: self.jobs.values().filter(|j| j.run == run).cloned().collect(),
            summaries: self.summaries.iter().copied().filter(|k| k.run == run).collect(),
        }
    }
}

#[test]
fn a_failure_is_final_once_no_other_agent_could_run_the_job() {
    let mut w = World::new();
    let a = w.hello("only", "i", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit(1, 1, 1, "H200", 1);
    let g = w.assigned(&a).remove(0);
    assert!(w.update(&a, g.jobs[0].fence, Reported::Running));
    assert!(w.update(&a, g.jobs[0].fence, Reported::Failed(FailureKind::Attempt)));
    assert!(w.done(&a, &g));
    assert_eq!(w.job(run, 0).state, JobState::Failed, "not tried again on the host it failed on");
    assert_eq!(w.assigned(&a).len(), 1);
    // With another capable agent known, it would have waited for it.
    let mut w = World::new();
    let a = w.hello("first", "i", h200s(1), Vec::new()).expect("welcome");
    let _b = w.hello("second", "i", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit(1, 1, 1, "H200", 1);
    let (agent, g) =
        [a.clone(), _b.clone()].into_iter().find_map(|x| w.assigned(&x).pop().map(|g| (x, g))).expect("placed");
    assert!(w.update(&agent, g.jobs[0].fence, Reported::Failed(FailureKind::Attempt)));
    assert!(w.done(&agent, &g));
    assert_eq!(w.job(run, 0).state, JobState::Assigned, "tried again on the other agent");
    assert_ne!(w.job(run, 0).agent, Some(agent.agent));
}

#[test]
fn a_job_s_telemetry_goes_on_the_job_and_its_series_to_the_store_only_from_its_current_attempt() {
    use benchfleet_core::telemetry::{Series, Telemetry, TelemetrySummary};
    let mut w = World::new();
    let a = w.hello("a", "i", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit(1, 1, 1, "H200", 1);
    let g = w.assigned(&a).remove(0);
    let fence = g.jobs[0].fence;
    assert!(w.update(&a, fence, Reported::Running));
    w.s.summary_stored(fence.key);
    let series = vec![Series { name: "gpu_power_w".into(), gpu: "GPU-1".into(), points: vec![(0, 650.0)] }];
    let telemetry = Telemetry { summary: TelemetrySummary { engine_scrapes: 3, ..Default::default() }, series };
    let report = |fence: Fence| Update {
        engine_version: Some("0.17.1".into()),
        loadgen_args: vec!["--base-url".into(), "http://127.0.0.1:20001".into()],
        loadgen_version: Some("benchfleet-loadgen 0.1.0".into()),
        telemetry: Some(Box::new(telemetry.clone())),
        ..Update::new(fence, Reported::Succeeded)
    };
    // A stale attempt's report changes nothing.
    let stale = Fence { epoch: fence.epoch + 1, ..fence };
    let now = w.now();
    assert!(!w.s.job_update(now, a.agent, a.epoch, report(stale)));
    w.settle();
    assert!(w.store.telemetry.is_empty());
    let now = w.now();
    assert!(w.s.job_update(now, a.agent, a.epoch, report(fence)));
    w.settle();
    let job = w.job(run, 0);
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(
        (job.engine_version.as_deref(), job.loadgen_version.as_deref()),
        (Some("0.17.1"), Some("benchfleet-loadgen 0.1.0"))
    );
    assert_eq!(job.loadgen_args.len(), 2);
    assert_eq!(job.telemetry.as_ref().map(|t| t.engine_scrapes), Some(3));
    assert_eq!(w.store.telemetry.get(&fence.key), Some(&telemetry.series));
}

fn pin(w: &Welcome, host: &str) -> Pin {
    Pin { agent: w.agent, host: host.into(), gpus: Vec::new(), label: host.into() }
}

#[test]
fn a_fleet_target_whose_agent_is_gone_fails_instead_of_waiting_for_it() {
    let mut w = World::new();
    let a = w.hello("a", "ia", h200s(1), Vec::new()).expect("welcome");
    let b = w.hello("b", "ib", h200s(1), Vec::new()).expect("welcome");
    let run = w.submit_pinned(1, 2, 2, ("H200", 1), &[pin(&a, "a"), pin(&b, "b")]);
    let (on_a, on_b) = (w.assigned(&a).remove(0), w.assigned(&b).remove(0));
    w.succeed(&a, on_a.jobs[0].fence);
    assert!(w.update(&b, on_b.jobs[0].fence, Reported::Running));
    // b is killed: silent past its lease. Its target cannot run elsewhere.
    for _ in 0..12 {
        w.beat(&a);
        w.advance(100);
    }
    for job in [2, 3] {
        let j = w.job(run, job);
        assert_eq!(j.state, JobState::Failed, "{j:?}");
        assert!(j.error.as_deref().is_some_and(|e| e.contains("agent b is gone")), "{j:?}");
    }
    assert!(w.assigned(&a).len() == 1, "b's target never moves to a");
    w.succeed(&a, on_a.jobs[1].fence);
    assert!(w.done(&a, &on_a));
    assert_eq!(w.store.runs[&run].state, RunState::Finished, "the check ends with the answer it has");
    assert_eq!(w.store.jobs[&(run, 2)].state, JobState::Failed, "stored");
}

#[test]
fn a_fleet_target_of_an_agent_drained_before_it_ran_fails_and_its_current_work_goes_on() {
    let mut w = World::new();
    let a = w.hello("a", "ia", h200s(1), Vec::new()).expect("welcome");
    w.submit(1, 1, 1, "H200", 1);
    let busy = w.assigned(&a).remove(0);
    let check = w.submit_pinned(2, 1, 2, ("H200", 1), &[pin(&a, "a")]);
    assert_eq!(w.assigned(&a).len(), 1, "the check's group waits for the GPU");
    let now = w.now();
    w.s.drain(now, "a", Note { by: "ops".into(), reason: "bad fan".into(), at_unix_ms: 0 }).expect("drained");
    w.beat(&a);
    w.advance(100);
    let j = w.job(check, 0);
    assert_eq!(j.state, JobState::Failed);
    assert_eq!(j.error.as_deref(), Some("agent a was drained (by ops: bad fan) before this target ran"));
    assert_eq!(w.store.runs[&check].state, RunState::Finished);
    w.succeed(&a, busy.jobs[0].fence);
    assert_eq!(w.job(RunId(1), 0).state, JobState::Succeeded, "the drained agent's own work finishes");
}

#[test]
fn a_fleet_target_waits_for_its_agent_to_come_back_within_its_lease() {
    let mut w = World::new();
    let a = w.hello("a", "ia", h200s(1), Vec::new()).expect("welcome");
    let b = w.hello("b", "ib", h200s(1), Vec::new()).expect("welcome");
    // a restarts (SIGTERM, then back): it closed its session before the
    // check was submitted.
    let now = w.now();
    w.s.session_closed(now, a.agent, a.epoch);
    w.settle();
    let run = w.submit_pinned(1, 2, 1, ("H200", 1), &[pin(&a, "a"), pin(&b, "b")]);
    for _ in 0..5 {
        w.beat(&b);
        w.advance(100);
    }
    assert_eq!(w.job(run, 0).state, JobState::Pending, "half a lease: still waiting for a");
    let back = w.hello("a", "ia2", h200s(1), Vec::new()).expect("welcome back");
    let g = w.assigned(&back);
    assert_eq!(g.len(), 1, "its target runs on it");
    w.succeed(&back, g[0].jobs[0].fence);
    assert_eq!(w.job(run, 0).state, JobState::Succeeded);
}

#[test]
fn a_fleet_target_whose_gpu_fails_its_checks_fails_with_the_reason() {
    let mut w = World::new();
    let a = w.hello("a", "ia", h200s(2), Vec::new()).expect("welcome");
    w.submit(1, 1, 1, "H200", 2);
    let busy = w.assigned(&a).remove(0);
    let uuid = h200s(2)[1].uuid.clone();
    let target = Pin { gpus: vec![uuid.clone()], label: "a GPU 1".into(), ..pin(&a, "a") };
    let run = w.submit_pinned(2, 1, 1, ("H200", 1), &[target]);
    let mut gpus = h200s(2);
    gpus[1].usable = false;
    gpus[1].reasons = vec!["XID 79 during the watch".into()];
    let now = w.now();
    w.s.gpu_report(now, a.agent, a.epoch, gpus);
    w.beat(&a);
    w.advance(100);
    let j = w.job(run, 0);
    assert_eq!(j.state, JobState::Failed);
    assert_eq!(j.error.as_deref(), Some("agent a's GPUs fail their checks (GPU 1: XID 79 during the watch)"));
    w.succeed(&a, busy.jobs[0].fence);
}

#[test]
fn fleet_targets_are_every_eligible_host_or_gpu_set_and_the_rest_say_why() {
    use benchfleet_study::fleet::Per;
    use benchfleet_study::hostlist::HostList;
    let mut w = World::new();
    let _a = w.hello("gpu01", "i1", h200s(4), Vec::new()).expect("welcome");
    let _b = w.hello("gpu02", "i2", h200s(4), Vec::new()).expect("welcome");
    let mut failing = h200s(4);
    failing[3].usable = false;
    failing[3].reasons = vec!["XID 79 during the watch".into()];
    let _c = w.hello("gpu03", "i3", failing, Vec::new()).expect("welcome");
    let _d = w.hello("gpu04", "i4", h200s(1), Vec::new()).expect("welcome");
    let now = w.now();
    w.s.drain(now, "gpu02", Note { by: "ops".into(), reason: "bad fan".into(), at_unix_ms: 0 }).expect("drained");
    let targets = |per, gpus, hosts: Option<&str>| {
        let list = hosts.map(|h| HostList::parse(h).expect("list"));
        let t = w.s.fleet_targets(w.now(), per, (Some("H200"), gpus), RuntimeKind::Process, list.as_ref());
        let labels: Vec<String> = t.targets.iter().map(|p| p.label.clone()).collect();
        let skipped: Vec<String> = t.skipped.iter().map(|s| format!("{}: {}", s.host, s.reason)).collect();
        (labels, skipped)
    };
    let (on, off) = targets(Per::Host, 2, None);
    assert_eq!(on, ["gpu01", "gpu03"]);
    assert_eq!(
        off,
        [
            "gpu02: drained by ops: bad fan",
            "gpu03: GPU 3: XID 79 during the watch",
            "gpu04: has 1 GPU of the model, the check needs 2 H200s"
        ]
    );
    let (on, _) = targets(Per::Gpu, 1, None);
    assert_eq!(
        on,
        [
            "gpu01 GPU 0",
            "gpu01 GPU 1",
            "gpu01 GPU 2",
            "gpu01 GPU 3",
            "gpu03 GPU 0",
            "gpu03 GPU 1",
            "gpu03 GPU 2",
            "gpu04 GPU 0"
        ]
    );
    let (on, _) = targets(Per::Gpu, 2, None);
    assert_eq!(on, ["gpu01 GPUs 0+1", "gpu01 GPUs 2+3", "gpu03 GPUs 0+1"], "disjoint sets of usable GPUs");
    let (on, off) = targets(Per::Host, 1, Some("gpu0[1-3],!gpu03"));
    assert_eq!(
        (on, off),
        (vec!["gpu01".to_owned()], vec!["gpu02: drained by ops: bad fan".to_owned()]),
        "only the list's hosts"
    );
}
