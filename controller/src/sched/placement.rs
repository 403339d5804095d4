//! Placement: what a group needs of an agent, the queue (one per kind of
//! need, so an unplaceable backlog costs one check per kind, not per group),
//! the choice of an agent and its GPUs, the assignment itself, and why
//! groups wait (for `watch`, a submission's warnings and `submit --dry-run`).

use std::collections::BTreeSet;

use super::{AgentEntry, AssignedJob, Assignment, Command, Fence, GroupKey, Liveness, Now, Scheduler, ToAgent};
use crate::records::{AgentRecord, GpuState};
use benchfleet_study::fleet::{Per, Skipped};
use benchfleet_study::hostlist::HostList;
use benchfleet_study::model::{
    AgentId, AttemptInfo, AttemptOutcome, FailureKind, Group, Job, JobState, Pin, Placement, Run, RunId, RuntimeKind,
};

/// What a group needs of an agent.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Need {
    pub(super) gpu: Option<String>,
    pub(super) gpus: u32,
    pub(super) runtime: RuntimeKind,
    /// A fleet check's group: this agent only (and these GPUs, when named).
    pub(super) pin: Option<(AgentId, Vec<String>)>,
}

impl Need {
    pub(super) fn of(g: &Group) -> Need {
        Need {
            gpu: g.gpu.as_ref().map(|m| m.to_ascii_lowercase()),
            gpus: g.gpus_per_job,
            runtime: g.config.runtime,
            pin: g.pin.as_ref().map(|p| (p.agent, p.gpus.clone())),
        }
    }

    /// The agent's GPUs of the wanted model, usable or not.
    pub(super) fn gpus<'a>(&'a self, a: &'a AgentRecord) -> impl Iterator<Item = &'a GpuState> {
        of_model(&a.gpus, self.gpu.as_deref())
    }

    /// Whether the agent could ever run such a group: the runtime, and
    /// enough GPUs of the model (whether free or passing their checks now).
    pub(super) fn could_run(&self, a: &AgentRecord) -> bool {
        self.pin.as_ref().is_none_or(|(id, _)| *id == a.id)
            && a.runtimes.iter().any(|r| r == self.runtime.as_str())
            && self.gpus(a).count() >= self.gpus as usize
    }

    /// "an A100", "2 H200s", "a GPU".
    pub(super) fn describe(&self) -> String {
        let model = self.gpu.as_deref().map_or("GPU".to_owned(), str::to_uppercase);
        if self.gpus > 1 {
            return format!("{} {model}s", self.gpus);
        }
        let vowel_sound = model.starts_with(['A', 'E', 'F', 'H', 'I', 'L', 'M', 'N', 'O', 'R', 'S', 'X']);
        format!("{} {model}", if vowel_sound { "an" } else { "a" })
    }
}

/// The GPUs of a model (all of them without one).
fn of_model<'a>(gpus: &'a [GpuState], model: Option<&'a str>) -> impl Iterator<Item = &'a GpuState> {
    gpus.iter().filter(move |g| model.is_none_or(|m| benchfleet_core::gpu::model_matches(&g.name, m)))
}

impl Scheduler {
    /// Queues a group that has jobs left to run.
    pub(super) fn enqueue(&mut self, key: GroupKey) {
        let has_pending = self.group_jobs(key).any(|j| j.job.state == JobState::Pending);
        let Some(g) = self.groups.get_mut(&key) else { return };
        if g.queued || g.group.placement.is_some() || !has_pending {
            return;
        }
        g.queued = true;
        let order = *g.order.get_or_insert_with(|| {
            self.queued_seq += 1;
            self.queued_seq
        });
        let q = self.queue.entry(Need::of(&g.group)).or_default();
        let at = q.partition_point(|(o, _)| *o < order);
        q.insert(at, (order, key));
    }

    /// Usable GPUs of the wanted model that no placed group holds, by index.
    pub(super) fn free_gpus(&self, a: &AgentEntry, model: Option<&str>) -> Vec<String> {
        let taken: BTreeSet<&str> = a
            .groups
            .iter()
            .filter_map(|k| self.groups.get(k))
            .filter_map(|g| g.group.placement.as_ref())
            .flat_map(|p| p.gpus.iter().map(String::as_str))
            .collect();
        let mut gpus: Vec<&GpuState> =
            of_model(&a.rec.gpus, model).filter(|g| g.usable && !taken.contains(g.uuid.as_str())).collect();
        gpus.sort_by_key(|g| g.index);
        gpus.into_iter().map(|g| g.uuid.clone()).collect()
    }

    /// Hands queued groups to agents that can run them, oldest first.
    pub fn dispatch(&mut self, now: Now) {
        if self.placeable.is_empty() {
            return;
        }
        let mut needs: Vec<(u64, Need)> =
            self.queue.iter().filter_map(|(n, q)| q.front().map(|(seq, _)| (*seq, n.clone()))).collect();
        needs.sort();
        for (_, need) in needs {
            if self.blocked.get(&need) == Some(&self.capacity) {
                continue;
            }
            loop {
                if self.placeable.is_empty() {
                    return;
                }
                let Some(&(_, key)) = self.queue.get(&need).and_then(|q| q.front()) else { break };
                let live = self.groups.get(&key).is_some_and(|g| g.queued && g.group.placement.is_none());
                let pending = self.group_jobs(key).any(|j| j.job.state == JobState::Pending);
                if !live || !pending {
                    self.pop(&need);
                    if let Some(g) = self.groups.get_mut(&key) {
                        g.queued = false;
                    }
                    continue;
                }
                let Some((agent, gpus)) = self.find_place(key, &need, now) else {
                    self.blocked.insert(need.clone(), self.capacity);
                    break;
                };
                self.pop(&need);
                self.place(key, agent, gpus, now);
            }
        }
    }

    /// A fleet check's queued groups whose agent can no longer run them
    /// fail instead of waiting for ever: the agent is gone (lost its lease,
    /// or left and did not come back within one), drained, or the GPUs the
    /// target names fail their checks. A target that cannot run is an
    /// answer of the check, and its run ends with the others.
    pub(super) fn fail_stranded_pins(&mut self, now: Now) {
        let stranded: Vec<(Need, String)> = self
            .queue
            .keys()
            .filter_map(|n| {
                let (agent, gpus) = n.pin.as_ref()?;
                Some((n.clone(), self.why_stranded(*agent, gpus, n, now)?))
            })
            .collect();
        for (need, why) in stranded {
            let keys = self.queue.remove(&need).unwrap_or_default();
            for (_, key) in keys {
                if let Some(g) = self.groups.get_mut(&key) {
                    g.queued = false;
                }
                let left: Vec<u64> =
                    self.group_jobs(key).filter(|j| !j.job.state.is_terminal()).map(|j| j.job.id).collect();
                for job in left {
                    self.end_attempt((key.0, job), AttemptOutcome::Failed, &why, false, FailureKind::Config, now);
                }
                self.forget_if_over(key.0);
            }
        }
    }

    /// Why a pinned need can never be placed on its agent, if so.
    fn why_stranded(&self, agent: AgentId, gpus: &[String], need: &Need, now: Now) -> Option<String> {
        let Some(a) = self.agents.get(&agent) else {
            return Some(format!("its agent (id {agent}) is no longer known to the controller"));
        };
        let name = &a.rec.name;
        if let Some(note) = &a.rec.drain {
            return Some(format!("agent {name} was drained ({note}) before this target ran"));
        }
        // While most of the fleet is silent the controller may be the one
        // cut off: nobody is declared gone then, as for leases.
        let expired = a.last_heard.map_or(self.grace_until, |t| t + self.config.lease_ttl) <= now.at;
        if a.lost || (a.session.is_none() && self.holding.is_none() && expired) {
            return Some(format!(
                "agent {name} is gone (no heartbeat within its lease) and this target runs only there"
            ));
        }
        let (usable, failing): (Vec<&GpuState>, Vec<&GpuState>) =
            need.gpus(&a.rec).filter(|g| gpus.is_empty() || gpus.contains(&g.uuid)).partition(|g| g.usable);
        (a.session.is_some() && usable.len() < need.gpus as usize && !failing.is_empty()).then(|| {
            let why: Vec<String> =
                failing.iter().map(|g| format!("GPU {}: {}", g.index, g.reasons.join("; "))).collect();
            format!("agent {name}'s GPUs fail their checks ({})", why.join("; "))
        })
    }

    fn pop(&mut self, need: &Need) {
        if let Some(q) = self.queue.get_mut(need) {
            q.pop_front();
            if q.is_empty() {
                self.queue.remove(need);
            }
        }
    }

    /// An agent for a group, preferring one it has not failed on.
    fn find_place(&self, key: GroupKey, need: &Need, now: Now) -> Option<(AgentId, Vec<String>)> {
        let failed_on = &self.groups.get(&key)?.group.failed_on;
        let model = self.groups.get(&key)?.group.gpu.clone();
        let fits = |id: &AgentId| -> Option<Vec<String>> {
            let a = self.agents.get(id)?;
            if !self.may_take_work(a, now.at) || !a.rec.runtimes.iter().any(|r| r == need.runtime.as_str()) {
                return None;
            }
            let free = self.free_gpus(a, model.as_deref());
            match &need.pin {
                Some((pinned, _)) if pinned != id => None,
                Some((_, gpus)) if !gpus.is_empty() => gpus.iter().all(|g| free.contains(g)).then(|| gpus.clone()),
                _ => (free.len() >= need.gpus as usize).then(|| free.into_iter().take(need.gpus as usize).collect()),
            }
        };
        let fresh =
            self.placeable.iter().filter(|id| !failed_on.contains(id)).find_map(|id| fits(id).map(|g| (*id, g)));
        fresh.or_else(|| {
            self.placeable.iter().filter(|id| failed_on.contains(id)).find_map(|id| fits(id).map(|g| (*id, g)))
        })
    }

    fn place(&mut self, key: GroupKey, agent: AgentId, gpus: Vec<String>, now: Now) {
        let Some(a) = self.agents.get_mut(&agent) else { return };
        let Some(session) = a.session.as_ref().map(|s| s.epoch) else { return };
        let price = a.session.as_ref().and_then(|s| s.price.clone());
        let agent_name = a.rec.name.clone();
        a.groups.insert(key);
        let Some(g) = self.groups.get_mut(&key) else { return };
        g.queued = false;
        g.group.placement = Some(Placement { agent, gpus: gpus.clone(), epoch: session, since_unix_ms: now.unix_ms });
        let config = g.group.config.clone();
        let job_ids = g.group.jobs.clone();
        let mut jobs = Vec::new();
        for id in job_ids {
            let jk = (key.0, id);
            let Some(e) = self.jobs.get_mut(&jk) else { continue };
            if e.job.state != JobState::Pending {
                continue;
            }
            let j = &mut e.job;
            j.attempt += 1;
            j.epoch = session;
            j.state = JobState::Assigned;
            j.agent = Some(agent);
            j.error = None;
            j.log_tail = None;
            j.engine_startup_s = None;
            j.gpu_fingerprint.clear();
            j.pull_progress = None;
            j.prefix_cache = None;
            j.engine_version = None;
            j.image_digest = None;
            j.loadgen_args.clear();
            j.loadgen_version = None;
            j.telemetry = None;
            j.attempts.push(AttemptInfo {
                number: j.attempt,
                epoch: session,
                agent,
                agent_name: agent_name.clone(),
                started_unix_ms: now.unix_ms,
                ended_unix_ms: None,
                outcome: AttemptOutcome::Running,
                reason: None,
                charged: false,
                log_tail: None,
                price: price.clone(),
            });
            e.has_summary = false;
            e.active_since = None;
            let fence = Fence { key: j.key(), epoch: session };
            jobs.push(AssignedJob { fence, profile: j.profile.clone(), repeat: j.repeat });
            self.persist_job(jk);
            if fence.key.attempt > 1 {
                self.out.push(Command::Purge(fence.key));
            }
            self.out.push(Command::OpenFence(fence));
        }
        self.persist_group(key);
        tracing::info!(run = %key.0, group = key.1, %agent, name = %agent_name, ?gpus, "group assigned");
        self.out.push(Command::Send {
            agent,
            session,
            msg: ToAgent::Assign(Box::new(Assignment { run: key.0, group: key.1, epoch: session, config, jobs, gpus })),
        });
        self.refresh(agent, now);
    }

    /// Why a run's queued groups wait, one line per kind of need.
    pub fn waiting(&self, run: RunId, now: Now) -> Vec<String> {
        self.waits(run, now).into_iter().map(|(why, _)| why).collect()
    }

    /// Where a run's groups would go if it were submitted now, on a copy of
    /// the scheduler (nothing here changes, nothing is sent): each group's
    /// agent and GPU indices, or why it would wait, after the groups already
    /// queued took their turn.
    pub fn dry_run(&self, now: Now, run: Run, groups: Vec<Group>, jobs: Vec<Job>) -> DryRun {
        let id = run.id;
        let mut copy = self.clone();
        copy.out.clear();
        copy.submit(now, run, groups, jobs);
        copy.dispatch(now);
        let mut placed = Vec::new();
        for command in &copy.out {
            if let Command::Send { agent, msg: ToAgent::Assign(a), .. } = command
                && a.run == id
                && let Some(entry) = copy.agents.get(agent)
            {
                let gpus = a
                    .gpus
                    .iter()
                    .filter_map(|uuid| entry.rec.gpus.iter().find(|g| &g.uuid == uuid).map(|g| g.index))
                    .collect();
                placed.push(DryPlacement { group: a.group, agent: entry.rec.name.clone(), gpus });
            }
        }
        DryRun { placed, waiting: copy.waiting(id, now) }
    }

    /// Warnings for a run just submitted: groups that no agent can take now
    /// for another reason than that their GPUs are busy.
    pub fn submit_warnings(&self, run: RunId, now: Now) -> Vec<String> {
        self.waits(run, now).into_iter().filter(|(_, busy)| !busy).map(|(why, _)| why).collect()
    }

    /// Why each kind of need of the run waits, and whether only because
    /// the GPUs it could use are busy.
    fn waits(&self, run: RunId, now: Now) -> Vec<(String, bool)> {
        let mut needs: Vec<Need> = self
            .runs
            .get(&run)
            .map(|r| {
                r.groups
                    .iter()
                    .filter_map(|g| self.groups.get(&(run, *g)))
                    .filter(|g| g.queued)
                    .map(|g| Need::of(&g.group))
                    .collect()
            })
            .unwrap_or_default();
        needs.sort();
        needs.dedup();
        needs.iter().map(|n| self.why_waiting(n, now)).collect()
    }

    /// What keeps groups of a need from being placed, and whether it is only
    /// that the GPUs are busy.
    fn why_waiting(&self, need: &Need, now: Now) -> (String, bool) {
        let why = |s: String| (s, false);
        let what = need.describe();
        let with_runtime: Vec<&AgentEntry> = self
            .agents
            .values()
            .filter(|a| need.pin.as_ref().is_none_or(|(id, _)| *id == a.rec.id))
            .filter(|a| a.rec.runtimes.iter().any(|r| r == need.runtime.as_str()))
            .collect();
        let capable: Vec<&AgentEntry> = with_runtime.iter().copied().filter(|a| need.could_run(&a.rec)).collect();
        if self.agents.is_empty() {
            return why(format!("waiting for an agent: none has connected (each job needs {what})"));
        }
        if with_runtime.is_empty() {
            return why(format!("no agent runs engines with the {} runtime", need.runtime.as_str()));
        }
        if capable.is_empty() {
            return why(format!("no agent has {what}"));
        }
        let names = |v: &[&AgentEntry]| v.iter().map(|a| a.rec.name.as_str()).collect::<Vec<_>>().join(", ");
        let live: Vec<&AgentEntry> =
            capable.iter().copied().filter(|a| self.liveness_of(a, now.at) == Liveness::Ready).collect();
        if live.is_empty() {
            return why(format!("the agents with {what} ({}) are not connected", names(&capable)));
        }
        let open: Vec<&AgentEntry> = live.iter().copied().filter(|a| a.rec.drain.is_none() && !a.leaving).collect();
        if open.is_empty() {
            return why(format!("the agents with {what} ({}) are drained or shutting down", names(&live)));
        }
        let usable = |a: &AgentEntry| need.gpus(&a.rec).filter(|g| g.usable).count() >= need.gpus as usize;
        if !open.iter().any(|a| usable(a)) {
            let reasons: Vec<String> = open
                .iter()
                .flat_map(|a| {
                    a.rec
                        .gpus
                        .iter()
                        .filter(|g| !g.usable)
                        .map(move |g| format!("{} GPU {}: {}", a.rec.name, g.index, g.reasons.join("; ")))
                })
                .collect();
            return why(format!("no agent has {what} that passes its GPU checks ({})", reasons.join("; ")));
        }
        (format!("waiting for free GPUs: every agent with {what} is busy"), true)
    }
}

impl Scheduler {
    /// What a fleet check would run on now: every agent that may take work
    /// with `gpus` usable GPUs of the model (per GPU: each disjoint set of
    /// `gpus` of them), and every other agent with the reason it is left
    /// out. Agents not on the host list `hosts` are not considered.
    pub fn fleet_targets(
        &self,
        now: Now,
        per: Per,
        (model, gpus): (Option<&str>, u32),
        runtime: RuntimeKind,
        hosts: Option<&HostList>,
    ) -> Targets {
        let need = Need { gpu: model.map(str::to_ascii_lowercase), gpus, runtime, pin: None };
        let mut out = Targets::default();
        let mut agents: Vec<&AgentEntry> =
            self.agents.values().filter(|a| hosts.is_none_or(|h| h.matches(&a.rec.name))).collect();
        agents.sort_by(|a, b| a.rec.name.cmp(&b.rec.name));
        for a in agents {
            let host = a.rec.name.clone();
            let skip = |reason: String| Skipped { host: host.clone(), reason };
            let liveness = self.liveness_of(a, now.at);
            let reason = if liveness != Liveness::Ready {
                Some(liveness.as_str().to_owned())
            } else if let Some(note) = &a.rec.drain {
                Some(format!("drained {note}"))
            } else if a.leaving {
                Some("shutting down".to_owned())
            } else if !a.rec.runtimes.iter().any(|r| r == runtime.as_str()) {
                Some(format!("does not run the {} runtime", runtime.as_str()))
            } else if need.gpus(&a.rec).count() < gpus as usize {
                let n = need.gpus(&a.rec).count();
                Some(format!(
                    "has {n} GPU{} of the model, the check needs {}",
                    if n == 1 { "" } else { "s" },
                    need.describe()
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                out.skipped.push(skip(reason));
                continue;
            }
            let mut usable: Vec<&GpuState> = need.gpus(&a.rec).filter(|g| g.usable).collect();
            usable.sort_by_key(|g| g.index);
            for g in need.gpus(&a.rec).filter(|g| !g.usable) {
                out.skipped.push(skip(format!("GPU {}: {}", g.index, g.reasons.join("; "))));
            }
            let pin = |label: String, gpus: Vec<String>| Pin { agent: a.rec.id, host: host.clone(), gpus, label };
            match per {
                Per::Host if usable.len() >= gpus as usize => out.targets.push(pin(host.clone(), Vec::new())),
                Per::Host => out.skipped.push(skip(format!("{} of its GPUs pass their checks", usable.len()))),
                Per::Gpu => {
                    for set in usable.chunks_exact(gpus as usize) {
                        let indexes: Vec<String> = set.iter().map(|g| g.index.to_string()).collect();
                        let label = format!("{host} GPU{} {}", if set.len() > 1 { "s" } else { "" }, indexes.join("+"));
                        out.targets.push(pin(label, set.iter().map(|g| g.uuid.clone()).collect()));
                    }
                }
            }
        }
        out
    }
}

/// What a fleet check runs on, and the hosts it leaves out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Targets {
    pub targets: Vec<Pin>,
    pub skipped: Vec<Skipped>,
}

/// What submitting a run now would do (`Scheduler::dry_run`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DryRun {
    pub placed: Vec<DryPlacement>,
    /// Why the groups not placed would wait.
    pub waiting: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DryPlacement {
    pub group: u64,
    pub agent: String,
    /// GPU indices on the agent.
    pub gpus: Vec<u32>,
}
