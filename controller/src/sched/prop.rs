//! Property tests: random sequences of what a fleet does (agents connect,
//! beat, hang, crash and come back, report successes and failures, finish
//! groups; operators submit, cancel and drain; the controller restarts)
//! against the scheduler, with simulated agents that obey the protocol.
//! After every step: no GPU is held by two groups, no job counts twice, a
//! final state never changes, a success has its summary, and the memory
//! matches what was persisted (so a restart from the store is the same
//! scheduler). At the end, once the fleet behaves, every job reaches a
//! final state.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::tests::{World, h200s};
use super::*;
use benchfleet_study::model::{AttemptOutcome, JobState, Note};

#[derive(Clone, Debug)]
enum Action {
    Connect(usize),
    Beat(usize),
    Disconnect(usize),
    Crash(usize),
    Advance(u64),
    /// Agent, group (index among those it holds), what happens to its next job.
    Step(usize, usize, u8),
    Submit(u64, u64, u32),
    Cancel(u64),
    Drain(usize, bool),
    RestartController,
    /// The agent sends news of an attempt it held once (a message delayed
    /// in the network, or an agent that missed being told to stop).
    Stale(usize, proptest::sample::Index),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => (0..AGENTS).prop_map(Action::Connect),
        6 => (0..AGENTS).prop_map(Action::Beat),
        1 => (0..AGENTS).prop_map(Action::Disconnect),
        1 => (0..AGENTS).prop_map(Action::Crash),
        3 => (50u64..1500).prop_map(Action::Advance),
        8 => (0..AGENTS, 0usize..3, 0u8..6).prop_map(|(a, g, o)| Action::Step(a, g, o)),
        2 => (1u64..4, 1u64..4, 1u32..3).prop_map(|(g, j, n)| Action::Submit(g, j, n)),
        1 => (1u64..5).prop_map(Action::Cancel),
        1 => (0..AGENTS, any::<bool>()).prop_map(|(a, d)| Action::Drain(a, d)),
        1 => Just(Action::RestartController),
        2 => (0..AGENTS, any::<proptest::sample::Index>()).prop_map(|(a, i)| Action::Stale(a, i)),
    ]
}

const AGENTS: usize = 3;

/// An agent that follows the protocol.
#[derive(Clone, Debug, Default)]
struct SimAgent {
    instance: u32,
    welcome: Option<Welcome>,
    /// Groups it runs, with the index of the next job to run.
    held: Vec<(Assignment, usize)>,
    /// Every attempt it was ever given.
    history: Vec<Fence>,
}

struct Sim {
    w: World,
    agents: Vec<SimAgent>,
    /// How much of `w.sent` the agents have read.
    delivered: usize,
    next_run: u64,
    /// Final states seen in the store, which must never change.
    terminal: BTreeMap<(RunId, u64), JobState>,
    /// How each ended attempt ended, which must never change either.
    ended: BTreeMap<AttemptKey, AttemptOutcome>,
    last_epoch: u64,
}

impl Sim {
    fn new() -> Sim {
        Sim {
            w: World::new(),
            agents: vec![SimAgent::default(); AGENTS],
            delivered: 0,
            next_run: 1,
            terminal: BTreeMap::new(),
            ended: BTreeMap::new(),
            last_epoch: 0,
        }
    }

    fn name(i: usize) -> String {
        format!("agent-{i}")
    }

    /// Delivers what the scheduler sent and closed to the agents.
    fn deliver(&mut self) {
        while self.delivered < self.w.sent.len() {
            let (agent, session, msg) = self.w.sent[self.delivered].clone();
            self.delivered += 1;
            let Some(i) = self
                .agents
                .iter()
                .position(|a| a.welcome.as_ref().is_some_and(|w| w.agent == agent && w.epoch == session))
            else {
                continue;
            };
            match msg {
                ToAgent::Assign(a) => {
                    self.agents[i].history.extend(a.jobs.iter().map(|j| j.fence));
                    self.agents[i].held.push((*a, 0));
                }
                ToAgent::Cancel { run, group, .. } => {
                    if let Some(pos) = self.agents[i].held.iter().position(|(a, _)| (a.run, a.group) == (run, group)) {
                        let (a, _) = self.agents[i].held.remove(pos);
                        let w = self.agents[i].welcome.clone().expect("connected");
                        self.w.done(&w, &a);
                    }
                }
                ToAgent::HeartbeatAck { .. } => {}
            }
        }
        for (agent, session) in std::mem::take(&mut self.w.closed) {
            for a in &mut self.agents {
                if a.welcome.as_ref().is_some_and(|w| w.agent == agent && w.epoch == session) {
                    a.welcome = None;
                }
            }
        }
    }

    fn connect(&mut self, i: usize) {
        if self.agents[i].welcome.is_some() {
            return;
        }
        let claims = self.agents[i]
            .held
            .iter()
            .map(|(a, _)| Claim { run: a.run, group: a.group, attempts: a.jobs.iter().map(|j| j.fence).collect() })
            .collect();
        let instance = format!("i{}", self.agents[i].instance);
        if let Ok(w) = self.w.hello(&Self::name(i), &instance, h200s(2), claims) {
            assert!(w.epoch > self.last_epoch, "epochs strictly increase: {} after {}", w.epoch, self.last_epoch);
            self.last_epoch = w.epoch;
            self.agents[i].held.retain(|(a, _)| w.keep.contains(&(a.run, a.group)));
            self.agents[i].welcome = Some(w);
        }
        self.deliver();
    }

    fn step(&mut self, i: usize, g: usize, outcome: u8) {
        let Some(w) = self.agents[i].welcome.clone() else { return };
        if self.agents[i].held.is_empty() {
            return;
        }
        let g = g % self.agents[i].held.len();
        let (a, next) = self.agents[i].held[g].clone();
        if next >= a.jobs.len() {
            self.agents[i].held.remove(g);
            self.w.done(&w, &a);
            self.deliver();
            return;
        }
        let fence = a.jobs[next].fence;
        let ended = match outcome {
            0 => {
                self.w.update(&w, fence, Reported::StartingEngine);
                false
            }
            1 => {
                self.w.update(&w, fence, Reported::Running);
                false
            }
            2 | 3 => {
                self.w.update(&w, fence, Reported::Running);
                self.w.s.summary_stored(fence.key);
                self.w.store.summaries.push(fence.key);
                self.w.update(&w, fence, Reported::Succeeded);
                true
            }
            4 => {
                self.w.update(&w, fence, Reported::Failed(FailureKind::Attempt));
                true
            }
            _ => {
                self.w.update(&w, fence, Reported::Failed(FailureKind::Host));
                true
            }
        };
        if ended {
            self.agents[i].held[g].1 += 1;
        }
        self.deliver();
    }

    fn apply(&mut self, action: &Action) {
        match *action {
            Action::Connect(i) => self.connect(i),
            Action::Beat(i) => {
                if let Some(w) = self.agents[i].welcome.clone() {
                    self.w.beat(&w);
                }
            }
            Action::Disconnect(i) => {
                if let Some(w) = self.agents[i].welcome.take() {
                    let now = self.w.now();
                    self.w.s.session_closed(now, w.agent, w.epoch);
                    self.w.settle();
                }
            }
            Action::Crash(i) => {
                if let Some(w) = self.agents[i].welcome.take() {
                    let now = self.w.now();
                    self.w.s.session_closed(now, w.agent, w.epoch);
                    self.w.settle();
                }
                self.agents[i].instance += 1;
                self.agents[i].held.clear();
            }
            Action::Advance(ms) => self.w.advance(ms),
            Action::Step(i, g, o) => self.step(i, g, o),
            Action::Submit(groups, jobs, gpus) => {
                if self.next_run <= 4 {
                    self.w.submit(self.next_run, groups, jobs, "H200", gpus);
                    self.next_run += 1;
                }
            }
            Action::Cancel(run) => {
                let now = self.w.now();
                let note = Note { by: "prop".into(), reason: String::new(), at_unix_ms: 0 };
                if self.w.s.cancel(now, RunId(run), note).is_ok() {
                    self.w.settle();
                }
            }
            Action::Drain(i, drain) => {
                let now = self.w.now();
                let name = Self::name(i);
                let _ = if drain {
                    self.w.s.drain(now, &name, Note { by: "prop".into(), reason: String::new(), at_unix_ms: 0 })
                } else {
                    self.w.s.undrain(now, &name)
                };
                self.w.settle();
            }
            Action::Stale(i, pick) => {
                let Some(w) = self.agents[i].welcome.clone() else { return };
                let history = &self.agents[i].history;
                if history.is_empty() {
                    return;
                }
                let fence = history[pick.index(history.len())];
                // Its records are refused by the ingest fence, so no
                // summary is stored for it.
                self.w.update(&w, fence, Reported::Running);
                self.w.update(&w, fence, Reported::Succeeded);
                self.w.update(&w, fence, Reported::Failed(FailureKind::Config));
                if let Some(a) = self.agents[i]
                    .held
                    .iter()
                    .find(|(a, _)| a.jobs.iter().any(|j| j.fence == fence))
                    .map(|(a, _)| a.clone())
                {
                    self.w.done(&w, &a);
                    self.agents[i].held.retain(|(h, _)| (h.run, h.group) != (a.run, a.group));
                }
            }
            Action::RestartController => {
                self.w.restart();
                self.delivered = 0;
                for a in &mut self.agents {
                    a.welcome = None;
                }
            }
        }
        self.deliver();
    }

    fn check(&mut self) {
        let store = &self.w.store;
        // No GPU held twice.
        let mut held = BTreeSet::new();
        for g in store.groups.values() {
            if let Some(p) = &g.placement {
                for gpu in &p.gpus {
                    assert!(held.insert((p.agent, gpu.clone())), "{gpu} of {} given to two groups", p.agent);
                }
            }
        }
        for (key, job) in &store.jobs {
            let numbers: Vec<u32> = job.attempts.iter().map(|a| a.number).collect();
            assert_eq!(numbers, (1..=numbers.len() as u32).collect::<Vec<_>>(), "attempts of {key:?}");
            assert_eq!(job.attempt, numbers.last().copied().unwrap_or(0));
            let succeeded = job.attempts.iter().filter(|a| a.outcome == AttemptOutcome::Succeeded).count();
            assert!(succeeded <= 1, "{key:?} succeeded {succeeded} times");
            if job.state == JobState::Succeeded {
                assert!(store.summaries.contains(&job.key()), "{key:?} succeeded without its summary");
                assert_eq!(succeeded, 1);
            }
            if job.state.is_terminal() {
                let was = *self.terminal.entry(*key).or_insert(job.state);
                assert_eq!(was, job.state, "{key:?} left its final state");
            }
            for a in &job.attempts {
                let key = AttemptKey { run: job.run, job: job.id, attempt: a.number };
                if a.outcome != AttemptOutcome::Running {
                    let was = *self.ended.entry(key).or_insert(a.outcome);
                    assert_eq!(was, a.outcome, "{key} changed how it ended");
                } else {
                    assert!(!self.ended.contains_key(&key), "{key} ended, then ran again");
                    assert_eq!(a.number, job.attempt, "{key} runs but is not the current attempt");
                    assert!(job.state.is_active(), "{key} runs but its job is {:?}", job.state);
                }
            }
            if job.state.is_active() {
                let g = &store.groups[&(job.run, job.group)];
                assert!(
                    g.placement.as_ref().is_some_and(|p| Some(p.agent) == job.agent && p.epoch == job.epoch),
                    "{key:?} active without its group placed on its agent: {job:?} {g:?}"
                );
            }
        }
        // What the scheduler holds is what it persisted.
        for run in store.runs.keys() {
            if let Some((r, jobs, groups)) = self.w.s.run_jobs(*run) {
                assert_eq!(&r, &store.runs[run]);
                for j in jobs {
                    assert_eq!(j, &store.jobs[&(j.run, j.id)], "job in memory and in the store");
                }
                for g in groups {
                    assert_eq!(g, &store.groups[&(g.run, g.id)], "group in memory and in the store");
                }
            }
        }
    }

    /// The fleet behaves: every agent connects, beats and runs everything
    /// it is given to success. Every job must reach a final state.
    fn finish(&mut self) {
        for i in 0..AGENTS {
            let now = self.w.now();
            let _ = self.w.s.undrain(now, &Self::name(i));
        }
        self.w.settle();
        for _ in 0..400 {
            for i in 0..AGENTS {
                self.connect(i);
                if let Some(w) = self.agents[i].welcome.clone() {
                    self.w.beat(&w);
                }
                self.step(i, 0, 2);
            }
            self.w.advance(100);
            self.deliver();
            self.check();
            if self.w.store.runs.values().all(Run::is_over) {
                break;
            }
        }
        let open: Vec<&Job> = self.w.store.jobs.values().filter(|j| !j.state.is_terminal()).collect();
        assert!(open.is_empty(), "jobs that never ended: {open:#?}");
        assert!(self.w.store.runs.values().all(Run::is_over), "runs that never ended");
    }
}

proptest! {
    #[test]
    fn the_fleet_never_double_counts_and_always_finishes(actions in proptest::collection::vec(action(), 1..120)) {
        let mut sim = Sim::new();
        sim.apply(&Action::Submit(2, 2, 1));
        for a in &actions {
            sim.apply(a);
            sim.check();
        }
        sim.finish();
    }
}
