//! Runs: a run taken in (restored from the store, submitted, or a greedy
//! run's next stage), finished, cancelled by an operator or retried, and
//! forgotten once it is over and none of its groups holds GPUs.

use std::collections::{BTreeSet, HashMap};

use super::{Charge, Command, GroupEntry, JobEntry, Now, RunData, RunEntry, SchedError, Scheduler, ToAgent};
use crate::records::Write;
use benchfleet_study::model::{
    AttemptKey, AttemptOutcome, FailureKind, Group, Job, JobState, Note, Placement, Run, RunId, RunState,
};

impl Scheduler {
    /// Adds a run and its groups and jobs (from the store, or newly
    /// submitted); groups placed on a known agent stay placed there.
    pub(super) fn insert_run(&mut self, data: RunData, now: Now) {
        let RunData { run, groups, jobs, summaries } = data;
        let id = run.id;
        let summaries: BTreeSet<AttemptKey> = summaries.into_iter().collect();
        let mut entry = RunEntry { run, groups: Vec::new(), open: 0 };
        for job in jobs {
            if !job.state.is_terminal() {
                entry.open += 1;
            }
            let has_summary = summaries.contains(&job.key());
            self.jobs.insert((id, job.id), JobEntry { job, active_since: None, has_summary });
        }
        let ended = entry.open == 0 && !entry.run.is_over();
        self.runs.insert(id, entry);
        for group in groups {
            self.add_group(group, now);
        }
        if ended {
            self.out.push(Command::RunEnded(id));
        }
    }

    fn add_group(&mut self, group: Group, now: Now) {
        let key = (group.run, group.id);
        if let Some(r) = self.runs.get_mut(&group.run) {
            r.groups.push(group.id);
        }
        let placed = group.placement.as_ref().map(|p| p.agent).filter(|a| self.agents.contains_key(a));
        self.groups.insert(key, GroupEntry { group, queued: false, order: None });
        match placed {
            Some(agent) => {
                // A restored placement: its active attempts take records
                // again until the agent says whether it still runs them.
                if let Some(a) = self.agents.get_mut(&agent) {
                    a.groups.insert(key);
                }
                for fence in self.active_fences(key) {
                    self.out.push(Command::OpenFence(fence));
                }
            }
            None => {
                if self.groups.get(&key).is_some_and(|g| g.group.placement.is_some()) {
                    // Placed on an agent the store does not know: lost.
                    self.abandon_group(key, "its agent is unknown to this controller", Charge::Nobody, now);
                } else {
                    // Attempts left active without a placement cannot go on.
                    let stray: Vec<u64> =
                        self.group_jobs(key).filter(|j| j.job.state.is_active()).map(|j| j.job.id).collect();
                    for job in stray {
                        self.end_attempt(
                            (key.0, job),
                            AttemptOutcome::Abandoned,
                            "the controller lost track of it",
                            false,
                            FailureKind::Host,
                            now,
                        );
                    }
                    self.enqueue(key);
                }
            }
        }
    }

    /// A newly submitted run (already stored) joins the queue.
    pub fn submit(&mut self, now: Now, run: Run, groups: Vec<Group>, jobs: Vec<Job>) {
        self.insert_run(RunData { run, groups, jobs, summaries: Vec::new() }, now);
    }

    /// A greedy run's next stage (already stored).
    pub fn add_stage(&mut self, now: Now, run: RunId, groups: Vec<Group>, jobs: Vec<Job>) {
        let Some(r) = self.runs.get_mut(&run) else { return };
        r.open += jobs.iter().filter(|j| !j.state.is_terminal()).count();
        for job in jobs {
            self.jobs.insert((run, job.id), JobEntry { job, active_since: None, has_summary: false });
        }
        for g in groups {
            self.add_group(g, now);
        }
    }

    /// The run is over: every job ended and no stage is left.
    pub fn finish_run(&mut self, now: Now, run: RunId) {
        let Some(r) = self.runs.get_mut(&run) else { return };
        if r.run.is_over() || r.open > 0 {
            return;
        }
        r.run.state = RunState::Finished;
        r.run.ended_unix_ms = Some(now.unix_ms);
        self.persist(Write::Run(self.runs[&run].run.clone()));
        self.forget_if_over(run);
    }

    /// Cancels a run: queued groups leave the queue, running ones are told
    /// to stop (their GPUs stay held until the agent says it is done), and
    /// every job not yet ended is cancelled.
    pub fn cancel(&mut self, now: Now, run: RunId, note: Note) -> Result<(), SchedError> {
        let Some(r) = self.runs.get_mut(&run) else {
            return Err(SchedError::NotRunning(run));
        };
        if r.run.is_over() {
            return Err(SchedError::RunOver(run));
        }
        r.run.state = RunState::Cancelled;
        r.run.ended_unix_ms = Some(now.unix_ms);
        let reason = format!("run cancelled {note}");
        r.run.note = Some(note);
        let groups = r.groups.clone();
        self.persist(Write::Run(self.runs[&run].run.clone()));
        for g in groups {
            let key = (run, g);
            if let Some(entry) = self.groups.get_mut(&key) {
                entry.queued = false;
            }
            let open: Vec<u64> =
                self.group_jobs(key).filter(|j| !j.job.state.is_terminal()).map(|j| j.job.id).collect();
            for job in open {
                let jk = (run, job);
                if self.jobs[&jk].job.state.is_active() {
                    self.end_attempt(jk, AttemptOutcome::Cancelled, &reason, false, FailureKind::Host, now);
                } else if let Some(e) = self.jobs.get_mut(&jk) {
                    e.job.state = JobState::Cancelled;
                    e.job.error = Some(reason.clone());
                    self.persist_job(jk);
                }
            }
            let placement = self.groups.get(&key).and_then(|g| g.group.placement.clone());
            if let Some(p) = placement
                && let Some(session) = self.agents.get(&p.agent).and_then(|a| a.session.as_ref()).map(|s| s.epoch)
            {
                self.out.push(Command::Send {
                    agent: p.agent,
                    session,
                    msg: ToAgent::Cancel { run, group: g, reason: reason.clone() },
                });
            }
        }
        if let Some(r) = self.runs.get_mut(&run) {
            r.open = 0;
        }
        self.forget_if_over(run);
        Ok(())
    }

    /// Runs a finished (or cancelled) run's failed and cancelled jobs again,
    /// each with a fresh attempt cap; returns how many.
    pub fn retry(&mut self, now: Now, data: RunData) -> Result<u64, SchedError> {
        let id = data.run.id;
        if self.runs.get(&id).is_some_and(|r| !r.run.is_over()) {
            return Err(SchedError::StillRunning(id));
        }
        let again =
            data.jobs.iter().filter(|j| matches!(j.state, JobState::Failed | JobState::Cancelled)).count() as u64;
        if again == 0 {
            return Err(SchedError::NothingToRetry(id));
        }
        // A cancelled run's groups may still be stopping on their agents:
        // those placements are kept.
        let placements: HashMap<u64, Option<Placement>> = self
            .runs
            .get(&id)
            .map(|r| {
                r.groups
                    .iter()
                    .map(|g| (*g, self.groups.get(&(id, *g)).and_then(|e| e.group.placement.clone())))
                    .collect()
            })
            .unwrap_or_default();
        self.forget(id);
        let RunData { mut run, mut groups, mut jobs, summaries } = data;
        run.state = RunState::Running;
        run.ended_unix_ms = None;
        run.note = None;
        for j in jobs.iter_mut().filter(|j| matches!(j.state, JobState::Failed | JobState::Cancelled)) {
            j.state = JobState::Pending;
            j.error = None;
            j.retry_base = j.attempts.len() as u32;
        }
        for g in &mut groups {
            if let Some(p) = placements.get(&g.id) {
                g.placement = p.clone();
            }
            g.failed_on.clear();
        }
        self.persist(Write::Run(run.clone()));
        for j in jobs.iter().filter(|j| j.state == JobState::Pending) {
            self.persist(Write::Job(j.clone()));
        }
        for g in &groups {
            self.persist(Write::Group(g.clone()));
        }
        self.insert_run(RunData { run, groups, jobs, summaries }, now);
        Ok(again)
    }

    /// Drops an over run from memory once none of its groups holds GPUs.
    pub(super) fn forget_if_over(&mut self, run: RunId) {
        let Some(r) = self.runs.get(&run) else { return };
        if !r.run.is_over() {
            return;
        }
        let placed = r.groups.iter().any(|g| self.groups.get(&(run, *g)).is_some_and(|e| e.group.placement.is_some()));
        if !placed {
            self.forget(run);
        }
    }

    fn forget(&mut self, run: RunId) {
        let Some(r) = self.runs.remove(&run) else { return };
        for g in r.groups {
            if let Some(e) = self.groups.remove(&(run, g)) {
                for j in e.group.jobs {
                    self.jobs.remove(&(run, j));
                }
            }
        }
    }
}
