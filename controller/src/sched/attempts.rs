//! Attempts: an agent's reports on them (fenced: a stale one changes
//! nothing), how one ends and what becomes of its job (final, or pending for
//! another attempt under the cap), a group's end on its agent, and the
//! abandonment of a placed group's attempts.

use std::collections::BTreeSet;

use benchfleet_core::telemetry::Telemetry;

use super::{Charge, Command, Fence, GroupKey, Need, Now, Reported, Scheduler, ToAgent, Update};
use crate::records::Write;
use benchfleet_study::model::{AgentId, AttemptInfo, AttemptKey, AttemptOutcome, FailureKind, Group, JobState, RunId};

impl Scheduler {
    /// The job an agent's message names, if the message is current: the
    /// session is the agent's, the attempt is the job's current one, granted
    /// under that epoch to that agent, and not ended.
    fn current(&self, agent: AgentId, session: u64, fence: Fence) -> Option<(RunId, u64)> {
        if !self.session_is(agent, session) {
            return None;
        }
        let key = (fence.key.run, fence.key.job);
        let j = &self.jobs.get(&key)?.job;
        let current = j.attempt == fence.key.attempt
            && j.epoch == fence.epoch
            && j.agent == Some(agent)
            && j.state.is_active()
            && j.current().is_some_and(|a| a.outcome == AttemptOutcome::Running);
        current.then_some(key)
    }

    /// An agent's report on one attempt; `false` when it was stale and
    /// changed nothing.
    pub fn job_update(&mut self, now: Now, agent: AgentId, session: u64, mut u: Update) -> bool {
        let Some(key) = self.current(agent, session, u.fence) else { return false };
        let Some(entry) = self.jobs.get_mut(&key) else { return false };
        let job = &mut entry.job;
        if u.log_tail.is_some() {
            job.log_tail = u.log_tail.clone();
        }
        if u.engine_startup_s.is_some() {
            job.engine_startup_s = u.engine_startup_s;
        }
        if !u.gpu_fingerprint.is_empty() {
            job.gpu_fingerprint = u.gpu_fingerprint.clone();
        }
        if u.prefix_cache.is_some() {
            job.prefix_cache = u.prefix_cache.clone();
        }
        if u.engine_version.is_some() {
            job.engine_version = u.engine_version.clone();
        }
        if u.image_digest.is_some() {
            job.image_digest = u.image_digest.clone();
        }
        if !u.loadgen_args.is_empty() {
            job.loadgen_args = u.loadgen_args.clone();
        }
        if u.loadgen_version.is_some() {
            job.loadgen_version = u.loadgen_version.clone();
        }
        if let Some(t) = u.telemetry.take() {
            let Telemetry { summary, series } = *t;
            job.telemetry = Some(summary);
            // Written with the job's own update, in the same transaction.
            self.out.push(Command::Persist(Write::Telemetry(job.key(), series)));
        }
        match u.state {
            Reported::StartingEngine | Reported::Running => {
                job.state = if u.state == Reported::Running { JobState::Running } else { JobState::StartingEngine };
                if u.pull_progress.is_some() {
                    job.pull_progress = u.pull_progress;
                }
                entry.active_since.get_or_insert(now.at);
                self.persist_job(key);
            }
            Reported::Succeeded if entry.has_summary => {
                self.end_attempt(key, AttemptOutcome::Succeeded, "", false, FailureKind::Attempt, now);
            }
            Reported::Succeeded => {
                let reason = "loadgen finished, but its summary never reached the controller";
                self.end_attempt(key, AttemptOutcome::Failed, reason, true, FailureKind::Attempt, now);
            }
            Reported::Failed(kind) => {
                let reason = u.error.unwrap_or_else(|| "failed (the agent gave no reason)".to_owned());
                let group = (key.0, self.jobs[&key].job.group);
                if kind != FailureKind::Host
                    && let Some(g) = self.groups.get_mut(&group)
                    && !g.group.failed_on.contains(&agent)
                {
                    g.group.failed_on.push(agent);
                    self.persist_group(group);
                }
                self.end_attempt(key, AttemptOutcome::Failed, &reason, kind == FailureKind::Attempt, kind, now);
            }
        }
        true
    }

    /// loadgen's summary of an attempt was stored.
    pub fn summary_stored(&mut self, key: AttemptKey) {
        if let Some(j) = self.jobs.get_mut(&(key.run, key.job))
            && j.job.attempt == key.attempt
        {
            j.has_summary = true;
        }
    }

    /// Ends a job's current attempt and decides what becomes of the job:
    /// final, or pending for another attempt.
    pub(super) fn end_attempt(
        &mut self,
        key: (RunId, u64),
        outcome: AttemptOutcome,
        reason: &str,
        charged: bool,
        kind: FailureKind,
        now: Now,
    ) {
        let (cap, max) = (self.config.attempt_cap, self.config.max_attempts);
        // A failure of the attempt's own is tried again only on an agent it
        // has not failed on: with none left, it is final.
        let nowhere_else = outcome == AttemptOutcome::Failed
            && kind == FailureKind::Attempt
            && self
                .jobs
                .get(&key)
                .and_then(|j| self.groups.get(&(key.0, j.job.group)))
                .is_some_and(|g| !self.capable_elsewhere(&g.group));
        let Some(entry) = self.jobs.get_mut(&key) else { return };
        let job = &mut entry.job;
        let was_active = job.state.is_active();
        let log_tail = job.log_tail.clone();
        if let Some(a) = job.current_mut()
            && a.outcome == AttemptOutcome::Running
        {
            a.outcome = outcome;
            a.ended_unix_ms = Some(now.unix_ms);
            a.reason = (!reason.is_empty()).then(|| reason.to_owned());
            a.charged = charged;
            a.log_tail = log_tail;
        }
        entry.active_since = None;
        job.pull_progress = None;
        let next = match outcome {
            AttemptOutcome::Succeeded => {
                job.error = None;
                JobState::Succeeded
            }
            AttemptOutcome::Cancelled => JobState::Cancelled,
            AttemptOutcome::Running => return,
            AttemptOutcome::Failed | AttemptOutcome::Abandoned => {
                let since = &job.attempts[(job.retry_base as usize).min(job.attempts.len())..];
                let failed: Vec<&AttemptInfo> = since.iter().filter(|a| a.charged).collect();
                if kind == FailureKind::Config {
                    job.error = Some(reason.to_owned());
                    JobState::Failed
                } else if failed.len() as u32 >= cap || nowhere_else {
                    let hosts: BTreeSet<AgentId> = failed.iter().map(|a| a.agent).collect();
                    job.error = Some(if hosts.len() > 1 {
                        format!("failed on {} hosts: {reason}", hosts.len())
                    } else if failed.len() > 1 {
                        format!("failed {} times on {}: {reason}", failed.len(), failed[0].agent_name)
                    } else {
                        reason.to_owned()
                    });
                    JobState::Failed
                } else if since.len() as u32 >= max {
                    job.error = Some(format!("gave up after {} attempts: {reason}", since.len()));
                    JobState::Failed
                } else {
                    job.error = Some(format!("attempt {} {}: {reason}", job.attempt, outcome.as_str()));
                    JobState::Pending
                }
            }
        };
        job.state = next;
        if was_active {
            self.out.push(Command::CloseFence(AttemptKey {
                run: key.0,
                job: key.1,
                attempt: self.jobs[&key].job.attempt,
            }));
        }
        self.persist_job(key);
        if next.is_terminal() {
            self.job_ended(key.0);
        }
    }

    fn job_ended(&mut self, run: RunId) {
        let Some(r) = self.runs.get_mut(&run) else { return };
        r.open = r.open.saturating_sub(1);
        if r.open == 0 && !r.run.is_over() {
            self.out.push(Command::RunEnded(run));
        }
    }

    /// The agent is done with a group: its GPUs are free. Jobs it did not
    /// report on run again.
    pub fn group_done(&mut self, now: Now, agent: AgentId, session: u64, run: RunId, group: u64, epoch: u64) -> bool {
        let key = (run, group);
        let placed_here = self
            .groups
            .get(&key)
            .and_then(|g| g.group.placement.as_ref())
            .is_some_and(|p| p.agent == agent && p.epoch == epoch);
        if !self.session_is(agent, session) || !placed_here {
            return false;
        }
        let left: Vec<u64> = self.group_jobs(key).filter(|j| j.job.state.is_active()).map(|j| j.job.id).collect();
        for job in left {
            let reason = "the agent ended the group without running this job";
            self.end_attempt((run, job), AttemptOutcome::Failed, reason, false, FailureKind::Host, now);
        }
        self.release(key, agent, now);
        true
    }

    /// A group leaves its agent: GPUs free, queued again if jobs are left.
    pub(super) fn release(&mut self, key: GroupKey, agent: AgentId, now: Now) {
        if let Some(g) = self.groups.get_mut(&key) {
            g.group.placement = None;
        }
        if let Some(a) = self.agents.get_mut(&agent) {
            a.groups.remove(&key);
        }
        self.persist_group(key);
        self.enqueue(key);
        self.refresh(agent, now);
        self.forget_if_over(key.0);
    }

    /// Gives up a placed group's active attempts and queues it again; the
    /// agent, if it still listens, is told to stop it.
    pub(super) fn abandon_group(&mut self, key: GroupKey, reason: &str, charge: Charge, now: Now) {
        self.abandon(key, reason, charge, true, now);
    }

    /// `abandon_group`, telling the agent to stop the group only with
    /// `tell`: an agent that came back without it does not hold it.
    pub(super) fn abandon(&mut self, key: GroupKey, reason: &str, charge: Charge, tell: bool, now: Now) {
        let Some(placement) = self.groups.get(&key).and_then(|g| g.group.placement.clone()) else { return };
        let active: Vec<(u64, bool)> = self
            .group_jobs(key)
            .filter(|j| j.job.state.is_active())
            .map(|j| (j.job.id, j.job.state != JobState::Assigned))
            .collect();
        for (job, begun) in active {
            let charged = match charge {
                Charge::Begun => begun,
                Charge::Only(j) => j == job,
                Charge::Nobody => false,
            };
            self.end_attempt((key.0, job), AttemptOutcome::Abandoned, reason, charged, FailureKind::Attempt, now);
        }
        if let Some(session) = self.agents.get(&placement.agent).and_then(|a| a.session.as_ref()).map(|s| s.epoch)
            && tell
        {
            self.out.push(Command::Send {
                agent: placement.agent,
                session,
                msg: ToAgent::Cancel { run: key.0, group: key.1, reason: reason.to_owned() },
            });
        }
        self.release(key, placement.agent, now);
    }

    /// Whether some known agent on which the group has not failed could
    /// run it (now or once it is back).
    fn capable_elsewhere(&self, g: &Group) -> bool {
        let need = Need::of(g);
        self.agents.values().any(|a| !a.lost && !g.failed_on.contains(&a.rec.id) && need.could_run(&a.rec))
    }
}
