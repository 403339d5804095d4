//! Agents: a session's hello (with the groups it claims) and its end,
//! heartbeats, GPU reports and leaving; liveness, and the leases `tick`
//! enforces (suspect, then lost; the restart grace; the mass-silence hold)
//! with the attempts' deadlines; an operator's drains; and enrolment (ids,
//! certificates, revocations).

use std::collections::HashMap;

use tokio::time::Instant;

use super::{
    AgentEntry, AgentView, Charge, Claim, Command, GroupKey, Hello, Liveness, Now, Refused, SchedError, Scheduler,
    Session, ToAgent, Welcome, human,
};
use crate::records::{AgentCertificate, GpuState, Write};
use benchfleet_study::model::{AgentId, Note, RunId};

impl Scheduler {
    /// An agent's session begins.
    pub fn hello(&mut self, now: Now, hello: Hello) -> Result<Welcome, Refused> {
        if hello.name.trim().is_empty() {
            return Err(Refused("an agent must have a name".to_owned()));
        }
        let existing = match hello.certified {
            Some(id) => {
                let a = self.agents.get(&id).ok_or_else(|| {
                    Refused(format!(
                        "agent '{}' ({id}) is not enrolled with this controller (its store was replaced?): join it \
                         again with a new token",
                        hello.name
                    ))
                })?;
                if a.rec.name != hello.name {
                    return Err(Refused(format!("{id} is agent '{}', not '{}'", a.rec.name, hello.name)));
                }
                if let Some(note) = a.rec.certificate.as_ref().and_then(|c| c.revoked.as_ref()) {
                    return Err(Refused(format!("agent '{}' ({id}) was revoked by {}", hello.name, note.by)));
                }
                Some(id)
            }
            None => self.by_name.get(&hello.name).copied(),
        };
        if let Some(id) = existing
            && let Some(a) = self.agents.get(&id)
            && let Some(s) = &a.session
            && s.instance != hello.instance
            && !a.lost
        {
            return Err(Refused(format!(
                "another agent already holds the name '{}' ({id}, host {}, connected from {}): two agents may not \
                 share a name; give this one another name (--name), or stop the other one (its lease ends {} s \
                 after its last heartbeat)",
                hello.name,
                a.rec.hostname,
                s.peer,
                self.config.lease_ttl.as_secs()
            )));
        }
        let id = existing.unwrap_or_else(|| {
            let id = AgentId(self.counters.next_agent.max(1));
            self.counters.next_agent = id.0 + 1;
            id
        });
        let epoch = self.counters.next_epoch.max(1);
        self.counters.next_epoch = epoch + 1;
        self.persist(Write::Counters(self.counters));

        let entry = self.agents.entry(id).or_insert_with(|| AgentEntry::new(id, &hello.name, now));
        if let Some(old) = entry.session.take() {
            self.out.push(Command::CloseSession {
                agent: id,
                session: old.epoch,
                reason: "replaced by a newer session of the same agent".to_owned(),
            });
        }
        let entry = self.agents.get_mut(&id).expect("inserted above");
        entry.rec.hostname = hello.hostname;
        entry.rec.version = hello.version;
        entry.rec.gpus = hello.gpus;
        entry.rec.runtimes = hello.runtimes;
        entry.rec.connected_unix_ms = now.unix_ms;
        entry.rec.epoch = epoch;
        entry.session = Some(Session { epoch, instance: hello.instance, peer: hello.peer, price: hello.price });
        entry.last_heard = Some(now.at);
        entry.lost = false;
        entry.leaving = hello.leaving;
        self.by_name.insert(entry.rec.name.clone(), id);
        let held: Vec<GroupKey> = entry.groups.iter().copied().collect();
        // New GPUs or runtimes may fit needs nothing else could.
        self.capacity += 1;
        self.persist_agent(id);

        // What the agent claims goes on if it is what this controller gave
        // it; everything else it held is abandoned.
        let claimed: HashMap<GroupKey, &Claim> = hello.claims.iter().map(|c| ((c.run, c.group), c)).collect();
        let mut keep = Vec::new();
        for key in held {
            let kept = claimed.get(&key).is_some_and(|c| self.claim_holds(key, c));
            if kept {
                keep.push(key);
            } else if self.runs.get(&key.0).is_some_and(|r| r.run.is_over()) {
                // A cancelled run's group: nothing left to abandon.
                self.release(key, id, now);
            } else {
                let reason =
                    format!("agent {} came back without it (restarted, or it stopped the work itself)", hello.name);
                self.abandon(key, &reason, Charge::Begun, false, now);
            }
        }
        self.refresh(id, now);
        Ok(Welcome {
            agent: id,
            epoch,
            heartbeat_interval: self.config.heartbeat_interval,
            lease_ttl: self.config.lease_ttl,
            keep,
        })
    }

    /// Whether a claim matches the group's active attempts exactly enough to
    /// let it go on: every active attempt of the group is claimed with its
    /// fence.
    fn claim_holds(&self, key: GroupKey, claim: &Claim) -> bool {
        let active = self.active_fences(key);
        !active.is_empty() && active.iter().all(|f| claim.attempts.contains(f))
    }

    /// Whether `session` is the agent's current one.
    pub(super) fn session_is(&self, agent: AgentId, session: u64) -> bool {
        self.agents.get(&agent).and_then(|a| a.session.as_ref()).is_some_and(|s| s.epoch == session)
    }

    pub fn heartbeat(&mut self, now: Now, agent: AgentId, session: u64, seq: u64) {
        if !self.session_is(agent, session) {
            return;
        }
        let Some(a) = self.agents.get_mut(&agent) else { return };
        if a.lost {
            // A lost agent that comes back starts over, GPU checks first.
            a.session = None;
            self.out.push(Command::CloseSession {
                agent,
                session,
                reason: "this agent's lease was lost; reconnect".to_owned(),
            });
        } else {
            a.last_heard = Some(now.at);
            self.out.push(Command::Send { agent, session, msg: ToAgent::HeartbeatAck { seq } });
        }
        self.refresh(agent, now);
    }

    pub fn session_closed(&mut self, now: Now, agent: AgentId, session: u64) {
        if !self.session_is(agent, session) {
            return;
        }
        if let Some(a) = self.agents.get_mut(&agent) {
            a.session = None;
        }
        self.refresh(agent, now);
    }

    /// The agent is shutting down: no new work.
    pub fn leaving(&mut self, now: Now, agent: AgentId, session: u64) {
        if !self.session_is(agent, session) {
            return;
        }
        if let Some(a) = self.agents.get_mut(&agent) {
            a.leaving = true;
        }
        self.refresh(agent, now);
    }

    pub fn gpu_report(&mut self, now: Now, agent: AgentId, session: u64, gpus: Vec<GpuState>) {
        if !self.session_is(agent, session) {
            return;
        }
        let Some(a) = self.agents.get_mut(&agent) else { return };
        let verdicts =
            |g: &[GpuState]| g.iter().map(|g| (g.uuid.clone(), g.usable, g.reasons.clone())).collect::<Vec<_>>();
        let changed = verdicts(&a.rec.gpus) != verdicts(&gpus);
        a.rec.gpus = gpus;
        if changed {
            self.capacity += 1;
            self.persist_agent(agent);
        }
        self.refresh(agent, now);
    }

    /// Drains an agent (by id or name): its current work finishes, it gets
    /// no new work.
    pub fn drain(&mut self, now: Now, agent: &str, note: Note) -> Result<AgentId, SchedError> {
        let id = self.find_agent(agent)?;
        if let Some(a) = self.agents.get_mut(&id) {
            a.rec.drain = Some(note);
        }
        self.persist_agent(id);
        self.refresh(id, now);
        Ok(id)
    }

    pub fn undrain(&mut self, now: Now, agent: &str) -> Result<AgentId, SchedError> {
        let id = self.find_agent(agent)?;
        if let Some(a) = self.agents.get_mut(&id) {
            a.rec.drain = None;
        }
        self.persist_agent(id);
        self.refresh(id, now);
        Ok(id)
    }

    pub fn find_agent(&self, agent: &str) -> Result<AgentId, SchedError> {
        if let Ok(id) = agent.parse::<AgentId>()
            && self.agents.contains_key(&id)
        {
            return Ok(id);
        }
        self.by_name.get(agent).copied().ok_or_else(|| SchedError::NoSuchAgent(agent.to_owned()))
    }

    pub(super) fn liveness_of(&self, a: &AgentEntry, now: Instant) -> Liveness {
        if a.lost {
            Liveness::Lost
        } else if a.session.is_none() {
            Liveness::Disconnected
        } else if a.last_heard.is_none_or(|t| now.saturating_duration_since(t) >= self.config.suspect_after) {
            Liveness::Suspect
        } else {
            Liveness::Ready
        }
    }

    pub(super) fn may_take_work(&self, a: &AgentEntry, now: Instant) -> bool {
        self.liveness_of(a, now) == Liveness::Ready && a.rec.drain.is_none() && !a.leaving
    }

    /// Recomputes whether an agent may be given work.
    pub(super) fn refresh(&mut self, id: AgentId, now: Now) {
        let free =
            self.agents.get(&id).filter(|a| self.may_take_work(a, now.at)).map_or(0, |a| self.free_gpus(a, None).len());
        if free > 0 {
            self.placeable.insert(id);
        } else {
            self.placeable.remove(&id);
        }
        if let Some(a) = self.agents.get_mut(&id) {
            if free > a.free {
                self.capacity += 1;
            }
            a.free = free;
        }
    }

    /// Leases and deadlines, at `now`.
    pub fn tick(&mut self, now: Now) {
        let ids: Vec<AgentId> = self.agents.keys().copied().collect();
        for id in &ids {
            self.refresh(*id, now);
        }
        // Agents whose lease has run out.
        let ttl = self.config.lease_ttl;
        let watched: Vec<AgentId> = ids
            .iter()
            .copied()
            .filter(|id| self.agents.get(id).is_some_and(|a| !a.lost && (a.session.is_some() || !a.groups.is_empty())))
            .collect();
        let expired: Vec<AgentId> = watched
            .iter()
            .copied()
            .filter(|id| {
                let a = &self.agents[id];
                // An agent not heard from since the controller started has
                // until the restart grace ends.
                let expires = a.last_heard.map_or(self.grace_until, |t| t + ttl);
                now.at >= expires
            })
            .collect();
        let mass = watched.len() >= self.config.mass_silence_min_agents && expired.len() * 2 > watched.len();
        let held_since = *self.holding.get_or_insert(now.at);
        if mass && now.at < held_since + self.config.mass_silence_max_hold {
            if held_since == now.at {
                tracing::warn!(
                    silent = expired.len(),
                    of = watched.len(),
                    "most agents missed their heartbeats at once; assuming this controller is the one cut off: \
                     no agent is declared lost until they return (for at most {})",
                    human(self.config.mass_silence_max_hold)
                );
            }
        } else {
            if !mass {
                if held_since != now.at {
                    tracing::info!("agents are heard again; leases are enforced again");
                }
                self.holding = None;
            }
            for id in expired {
                self.lose(id, now);
            }
        }
        // Attempts past their deadline.
        let deadline = self.config.attempt_deadline;
        let late: Vec<(RunId, u64)> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.job.state.is_active() && j.active_since.is_some_and(|t| now.at >= t + deadline))
            .map(|(k, _)| *k)
            .collect();
        for key in late {
            let Some(group) = self.jobs.get(&key).map(|j| j.job.group) else { continue };
            let reason = format!("job {} exceeded the attempt deadline of {}", key.1, human(deadline));
            self.abandon_group((key.0, group), &reason, Charge::Only(key.1), now);
        }
        self.fail_stranded_pins(now);
    }

    fn lose(&mut self, id: AgentId, now: Now) {
        let Some(a) = self.agents.get_mut(&id) else { return };
        a.lost = true;
        let name = a.rec.name.clone();
        let silent = a.last_heard.map(|t| now.at.saturating_duration_since(t));
        let groups: Vec<GroupKey> = a.groups.iter().copied().collect();
        let session = a.session.as_ref().map(|s| s.epoch);
        let reason = match silent {
            Some(d) => format!("agent {name} lost its lease (no heartbeat for {})", human(d)),
            None => format!("agent {name} did not come back within the controller's restart grace"),
        };
        tracing::warn!(agent = %id, %name, groups = groups.len(), "{reason}");
        for key in groups {
            self.abandon_group(key, &reason, Charge::Begun, now);
        }
        if let Some(session) = session {
            self.out.push(Command::CloseSession { agent: id, session, reason: reason.clone() });
        }
        if let Some(a) = self.agents.get_mut(&id) {
            a.session = None;
        }
        self.refresh(id, now);
    }

    /// One agent as the operator sees it.
    pub fn agent_view(&self, id: AgentId, now: Now) -> Option<AgentView> {
        let a = self.agents.get(&id)?;
        Some(AgentView {
            rec: a.rec.clone(),
            liveness: self.liveness_of(a, now.at),
            lease_age: a.last_heard.map(|t| now.at.saturating_duration_since(t)),
            connected: a.session.is_some(),
            session: a.session.as_ref().map(|s| s.epoch),
            leaving: a.leaving,
            groups: a.groups.iter().copied().collect(),
        })
    }

    /// Whether a group placed on the agent named `agent` has a job that
    /// names the file `sha256` (its ShareGPT file or trace, or its tokenizer): an
    /// agent may fetch only those.
    pub fn agent_needs_file(&self, agent: &str, sha256: &str) -> bool {
        let Ok(id) = self.find_agent(agent) else { return false };
        let Some(a) = self.agents.get(&id) else { return false };
        a.groups.iter().filter_map(|key| self.groups.get(key)).any(|g| {
            g.group.jobs.iter().filter_map(|j| self.jobs.get(&(g.group.run, *j))).any(|j| {
                let p = &j.job.profile;
                p.dataset.file().is_some_and(|(_, s)| s == sha256)
                    || p.processor.as_ref().is_some_and(|f| f.sha256 == sha256)
            })
        })
    }

    /// A new agent id, never given before (a joining agent's, written into
    /// its certificate).
    pub fn next_agent_id(&mut self) -> AgentId {
        let id = AgentId(self.counters.next_agent.max(1));
        self.counters.next_agent = id.0 + 1;
        self.persist(Write::Counters(self.counters));
        id
    }

    /// An agent joined with a certificate for `id` (from `next_agent_id`):
    /// its record is stored before it ever connects, and its name is its
    /// from now on (an earlier agent of that name keeps its own id).
    pub fn enrolled(&mut self, now: Now, id: AgentId, name: &str, certificate: AgentCertificate) {
        let entry = self.agents.entry(id).or_insert_with(|| AgentEntry::new(id, name, now));
        entry.rec.certificate = Some(certificate);
        self.by_name.insert(name.to_owned(), id);
        self.persist_agent(id);
    }

    /// An agent's certificate was renewed.
    pub fn renewed(&mut self, id: AgentId, certificate: AgentCertificate) -> Result<(), SchedError> {
        let a = self.agents.get_mut(&id).ok_or(SchedError::NotEnrolled(id))?;
        a.rec.certificate = Some(certificate);
        self.persist_agent(id);
        Ok(())
    }

    /// Every agent of `name` that holds a certificate is revoked: the note
    /// is kept on its record, and a live session is closed (its lease then
    /// runs out as any silent agent's). Returns how many.
    pub fn revoke(&mut self, name: &str, note: Note) -> usize {
        let ids: Vec<AgentId> = self
            .agents
            .iter()
            .filter(|(_, a)| a.rec.name == name && a.rec.certificate.as_ref().is_some_and(|c| c.revoked.is_none()))
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            let Some(a) = self.agents.get_mut(id) else { continue };
            if let Some(c) = a.rec.certificate.as_mut() {
                c.revoked = Some(note.clone());
            }
            if let Some(s) = &a.session {
                self.out.push(Command::CloseSession {
                    agent: *id,
                    session: s.epoch,
                    reason: format!("its certificate was revoked by {}", note.by),
                });
            }
            self.persist_agent(*id);
        }
        ids.len()
    }
}
