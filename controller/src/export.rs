//! A run as JSON lines: written out of one store (`export`) and read into
//! another (`import`), so that its report can be read elsewhere. The file
//! holds the run (its matrix included), its groups, its jobs with their
//! attempts, the summaries and per-attempt counts, and every stored request
//! record, between a header (kind, format version) and a trailer that
//! counts them, so that a file cut short is known. `docs/export.md` is the
//! format. Dataset and tokenizer files are named by their SHA-256 only, and
//! digests are not written (the import builds them from the records).
//!
//! Both sides stream: what they hold grows with the run's jobs, never with
//! its records. An import stores nothing visible until the whole file has
//! been read and checked: records and summaries go under a run id no run
//! has yet, and the run itself is stored last; a file found bad on the way
//! has what was staged removed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, Read as _, Write};

use benchfleet_core::digest::records_of;
use benchfleet_core::telemetry::Series;
use benchfleet_core::{DigestBuilder, RequestRecord, Summary};
use serde::{Deserialize, Serialize};

use crate::store::{RecordCommit, Store, StoreError, codec};
use benchfleet_study::model::{AttemptKey, AttemptStats, Group, Job, Run, RunId};

/// The header's kind: what says a file is an export.
pub const KIND: &str = "benchfleet-export";
/// Bumped whenever a reader of the previous format could misread the new
/// one (a field removed or changed in meaning, a new kind of line); a field
/// added that a reader may ignore keeps it. A reader takes its own format
/// only.
pub const FORMAT: u64 = 1;
/// Longest line read: a record of a long reply with every chunk is a few MB
/// (in tests, less, so that a line too long is cheap to make).
pub const MAX_LINE_BYTES: usize = if cfg!(test) { 1 << 20 } else { 64 << 20 };
/// Records per stored batch, as loadgen sends them.
const BATCH_RECORDS: usize = 256;
/// Encoded bytes after which a batch is cut before `BATCH_RECORDS`.
const BATCH_BYTES: usize = 1 << 20;
/// Encoded record bytes staged before they are written (in tests, little,
/// so that a file refused late has had records written, and removed).
const COMMIT_BYTES: usize = if cfg!(test) { 64 << 10 } else { 8 << 20 };

/// How many lines of each kind a file holds: its trailer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub groups: u64,
    pub jobs: u64,
    pub summaries: u64,
    pub stats: u64,
    /// Attempts whose telemetry series are in the file.
    pub telemetry: u64,
    pub records: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("run {0} does not exist")]
    NotFound(RunId),
    /// The run may still change: the reason, for the operator.
    #[error("{0}")]
    NotOver(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writing the export failed: {0}")]
    Write(#[from] std::io::Error),
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A line that is not what the format says; nothing was stored.
    #[error("line {line}: {reason}")]
    Line { line: u64, reason: String },
    #[error("the file is empty: an export begins with a {KIND} header")]
    Empty,
    #[error("the file ends after line {lines} without the export's trailer: it was cut short")]
    Truncated { lines: u64 },
    #[error("reading line {line} failed: {source}")]
    Read { line: u64, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What an import stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Imported {
    /// The run's id in this store.
    pub run: RunId,
    /// Its id in the store it was exported from (kept when this store never
    /// gave that id out).
    pub original: RunId,
    pub counts: Counts,
    /// The files the run names, (path in the matrix, SHA-256), that this
    /// store does not hold: a report needs none of them; a retry of the
    /// run's jobs here needs them all.
    pub missing_files: Vec<(String, String)>,
}

// The lines as written. Every line is a JSON object whose `kind` comes first.

#[derive(Serialize)]
struct HeaderOut<'a> {
    kind: &'a str,
    format: u64,
    benchfleet: &'a str,
    run: RunId,
}

#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum LineOut<'a> {
    Run { run: &'a Run },
    Group { group: &'a Group },
    Job { job: &'a Job },
    Summary { job: u64, attempt: u32, summary: &'a Summary },
    Stats { job: u64, attempt: u32, stats: &'a AttemptStats },
    Telemetry { job: u64, attempt: u32, series: &'a [Series] },
    Record { job: u64, attempt: u32, record: &'a RequestRecord },
    End(Counts),
}

// The lines as read: the kind first, then the line again as that kind.

#[derive(Deserialize)]
struct KindIn {
    kind: String,
}

#[derive(Deserialize)]
struct FormatIn {
    format: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct HeaderIn {
    run: RunId,
}

#[derive(Deserialize)]
struct RunIn {
    run: Run,
}

#[derive(Deserialize)]
struct GroupIn {
    group: Group,
}

#[derive(Deserialize)]
struct JobIn {
    job: Job,
}

#[derive(Deserialize)]
struct SummaryIn {
    job: u64,
    attempt: u32,
    summary: Summary,
}

#[derive(Deserialize)]
struct StatsIn {
    job: u64,
    attempt: u32,
    stats: AttemptStats,
}

#[derive(Deserialize)]
struct TelemetryIn {
    job: u64,
    attempt: u32,
    series: Vec<Series>,
}

#[derive(Deserialize)]
struct RecordIn {
    job: u64,
    attempt: u32,
    record: RequestRecord,
}

/// The run, its groups and its jobs, if the run can be exported: it is over
/// (finished or cancelled), none of its groups still holds GPUs, and all of
/// its jobs have ended. A run that may still change is refused rather than
/// written half-way through.
pub fn exportable(store: &dyn Store, run_id: RunId) -> Result<(Run, Vec<Group>, Vec<Job>), ExportError> {
    let run = store.run(run_id)?.ok_or(ExportError::NotFound(run_id))?;
    let groups = store.groups(run_id)?;
    let jobs = store.jobs(run_id)?;
    if let Some(why) = crate::store::unsettled(&run, &groups, &jobs, "export") {
        return Err(ExportError::NotOver(why));
    }
    Ok((run, groups, jobs))
}

/// Writes a stored run as JSON lines; see the module's documentation.
/// Records are read from the store one batch at a time.
pub fn export(store: &dyn Store, run_id: RunId, out: impl Write) -> Result<Counts, ExportError> {
    let (run, groups, jobs) = exportable(store, run_id)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, out);
    let mut counts = Counts::default();
    line(&mut out, &HeaderOut { kind: KIND, format: FORMAT, benchfleet: env!("CARGO_PKG_VERSION"), run: run.id })?;
    line(&mut out, &LineOut::Run { run: &run })?;
    for group in &groups {
        line(&mut out, &LineOut::Group { group })?;
        counts.groups += 1;
    }
    for job in &jobs {
        line(&mut out, &LineOut::Job { job })?;
        counts.jobs += 1;
    }
    for key in store.summarized(run_id)? {
        if let Some(summary) = store.summary(&key)? {
            line(&mut out, &LineOut::Summary { job: key.job, attempt: key.attempt, summary: &summary })?;
            counts.summaries += 1;
        }
    }
    let stats = store.attempt_stats(run_id)?;
    for (key, stats) in &stats {
        line(&mut out, &LineOut::Stats { job: key.job, attempt: key.attempt, stats })?;
        counts.stats += 1;
    }
    // Each attempt's telemetry series, where the store holds them.
    for job in &jobs {
        for attempt in 1..=job.attempt {
            let key = AttemptKey { run: run_id, job: job.id, attempt };
            if let Some(series) = store.telemetry(&key)? {
                line(&mut out, &LineOut::Telemetry { job: job.id, attempt, series: &series })?;
                counts.telemetry += 1;
            }
        }
    }
    // The attempts whose records are stored: those whose stats say they
    // were not removed.
    for key in stats.iter().filter(|(_, s)| !s.removed).map(|(k, _)| k) {
        for record in store.records(key) {
            line(&mut out, &LineOut::Record { job: key.job, attempt: key.attempt, record: &record? })?;
            counts.records += 1;
        }
    }
    line(&mut out, &LineOut::End(counts))?;
    out.flush()?;
    Ok(counts)
}

fn line(out: &mut impl Write, value: &impl Serialize) -> Result<(), ExportError> {
    serde_json::to_writer(&mut *out, value).map_err(std::io::Error::from)?;
    out.write_all(b"\n")?;
    Ok(())
}

/// The counts of an export's last line, if `last` is its trailer.
pub fn trailer(last: &[u8]) -> Option<Counts> {
    let last = last.trim_ascii();
    let kind: KindIn = serde_json::from_slice(last).ok()?;
    (kind.kind == "end").then(|| serde_json::from_slice(last).ok()).flatten()
}

/// Reads an export into `store`. Every line is checked (its kind and place
/// in the file, its JSON, that what it names belongs to the run, and in the
/// end the trailer's counts); the first that fails is named by its number,
/// and nothing is left in the store. The run keeps its id when this store
/// never gave that id out, else it takes the next one.
pub fn import(store: &dyn Store, mut input: impl BufRead) -> Result<Imported, ImportError> {
    let mut import = Import::new(store);
    let result = import.read(&mut input).and_then(|()| import.finish());
    if result.is_err()
        && let Err(e) = import.discard()
    {
        tracing::error!("removing what a failed import had staged failed: {e}");
    }
    result
}

/// Where the reading is: each kind of line has its place, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Section {
    Start,
    Header,
    Run,
    Groups,
    Jobs,
    Summaries,
    Stats,
    Telemetry,
    Records,
    End,
}

impl Section {
    fn of(kind: &str) -> Option<Section> {
        Some(match kind {
            KIND => Section::Header,
            "run" => Section::Run,
            "group" => Section::Groups,
            "job" => Section::Jobs,
            "summary" => Section::Summaries,
            "stats" => Section::Stats,
            "telemetry" => Section::Telemetry,
            "record" => Section::Records,
            "end" => Section::End,
            _ => return None,
        })
    }

    fn lines(self) -> &'static str {
        match self {
            Section::Start | Section::Header => "header",
            Section::Run => "run line",
            Section::Groups => "group lines",
            Section::Jobs => "job lines",
            Section::Summaries => "summary lines",
            Section::Stats => "stats lines",
            Section::Telemetry => "telemetry lines",
            Section::Records => "record lines",
            Section::End => "trailer",
        }
    }
}

const ORDER: &str = "an export holds a header, the run, its groups, jobs, summaries, stats, telemetry and records, then \
                     a trailer, in that order";

/// The records of one attempt being read.
struct Attempt {
    key: (u64, u32),
    /// How many its stats say are stored.
    expected: u64,
    read: u64,
    digest: DigestBuilder,
    batch: Vec<RequestRecord>,
    batch_bytes: usize,
    next_batch: u64,
}

/// An import under way: what the file said so far, and what was staged.
struct Import<'s> {
    store: &'s dyn Store,
    /// Lines read.
    line: u64,
    section: Section,
    original: RunId,
    run: Option<Run>,
    groups: Vec<Group>,
    /// Each group's line, for an error found later.
    group_lines: HashMap<u64, u64>,
    jobs: Vec<Job>,
    job_index: HashMap<u64, usize>,
    summaries: BTreeMap<(u64, u32), Summary>,
    stats: BTreeMap<(u64, u32), AttemptStats>,
    /// The id the run is stored under: claimed when the first thing is
    /// written.
    target: Option<RunId>,
    current: Option<Attempt>,
    /// Attempts whose records have been read.
    done: BTreeSet<(u64, u32)>,
    /// Attempts whose telemetry has been read.
    telemetry_seen: BTreeSet<(u64, u32)>,
    pending: RecordCommit,
    pending_bytes: usize,
    counts: Counts,
}

/// A JSON error without its position in the one-line document, which the
/// line number already gives.
fn json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) => format!("{} (column {})", &text[..i], e.column()),
        None => text,
    }
}

impl<'s> Import<'s> {
    fn new(store: &'s dyn Store) -> Import<'s> {
        Import {
            store,
            line: 0,
            section: Section::Start,
            original: RunId(0),
            run: None,
            groups: Vec::new(),
            group_lines: HashMap::new(),
            jobs: Vec::new(),
            job_index: HashMap::new(),
            summaries: BTreeMap::new(),
            stats: BTreeMap::new(),
            target: None,
            current: None,
            done: BTreeSet::new(),
            telemetry_seen: BTreeSet::new(),
            pending: RecordCommit::default(),
            pending_bytes: 0,
            counts: Counts::default(),
        }
    }

    fn bad(&self, reason: impl Into<String>) -> ImportError {
        ImportError::Line { line: self.line, reason: reason.into() }
    }

    /// Names an attempt as the file's run numbers it.
    fn attempt(&self, (job, attempt): (u64, u32)) -> AttemptKey {
        AttemptKey { run: self.original, job, attempt }
    }

    fn read(&mut self, input: &mut impl BufRead) -> Result<(), ImportError> {
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let n = input
                .by_ref()
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|source| ImportError::Read { line: self.line + 1, source })?;
            if n == 0 {
                break;
            }
            self.line += 1;
            let whole = buf.last() == Some(&b'\n');
            if !whole && buf.len() > MAX_LINE_BYTES {
                return Err(self.bad(format!("longer than {} MiB: not a line of an export", MAX_LINE_BYTES >> 20)));
            }
            let text = buf.strip_suffix(b"\n").unwrap_or(&buf);
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            match self.take(text) {
                // A last line without its newline that does not read was
                // cut in the middle.
                Err(ImportError::Line { line, reason }) if !whole => {
                    return Err(ImportError::Line {
                        line,
                        reason: format!("the file ends in the middle of this line: it was cut short ({reason})"),
                    });
                }
                other => other?,
            }
        }
        match self.section {
            Section::Start => Err(ImportError::Empty),
            Section::End => Ok(()),
            _ => Err(ImportError::Truncated { lines: self.line }),
        }
    }

    /// Takes one line.
    fn take(&mut self, text: &[u8]) -> Result<(), ImportError> {
        if text.trim_ascii().is_empty() {
            return Err(self.bad("an empty line; every line of an export is a JSON object"));
        }
        let kind = match serde_json::from_slice::<KindIn>(text) {
            Ok(k) => k.kind,
            Err(e) if self.section == Section::Start => {
                return Err(
                    self.bad(format!("not a benchfleet export: the first line is not its header ({})", json_error(&e)))
                );
            }
            Err(e) => return Err(self.bad(format!("not a line of an export: {}", json_error(&e)))),
        };
        if self.section == Section::Start {
            if kind != KIND {
                return Err(
                    self.bad(format!("not a benchfleet export: it begins with a '{kind}' line, not the {KIND} header"))
                );
            }
            return self.header(text);
        }
        if self.section == Section::End {
            return Err(self.bad("a line after the trailer, which is an export's last line"));
        }
        let Some(section) = Section::of(&kind) else {
            return Err(self.bad(format!("unknown kind '{kind}' (this benchfleet reads export format {FORMAT})")));
        };
        if section == Section::Header {
            return Err(self.bad("a second header"));
        }
        if self.section == Section::Header && section != Section::Run {
            return Err(self.bad(format!("a {kind} line before the run line; {ORDER}")));
        }
        if section < self.section || (section == Section::Run && self.section == Section::Run) {
            return Err(self.bad(format!("a {kind} line after the {}; {ORDER}", self.section.lines())));
        }
        if section > Section::Jobs && self.section <= Section::Jobs {
            self.check_groups()?;
        }
        if section >= Section::Records && self.section < Section::Records {
            self.stage_summaries()?;
        }
        self.section = section;
        match section {
            Section::Run => self.run(text),
            Section::Groups => self.group(text),
            Section::Jobs => self.job(text),
            Section::Summaries => self.summary(text),
            Section::Stats => self.stats(text),
            Section::Telemetry => self.telemetry(text),
            Section::Records => self.record(text),
            Section::End => self.end(text),
            Section::Start | Section::Header => unreachable!("handled above"),
        }
    }

    fn parse<T: serde::de::DeserializeOwned>(&self, text: &[u8], what: &str) -> Result<T, ImportError> {
        serde_json::from_slice(text).map_err(|e| self.bad(format!("not a valid {what} line: {}", json_error(&e))))
    }

    fn header(&mut self, text: &[u8]) -> Result<(), ImportError> {
        let format = self.parse::<FormatIn>(text, "header")?.format;
        match format.as_ref().and_then(serde_json::Value::as_u64) {
            Some(FORMAT) => {}
            Some(f) if f > FORMAT => {
                return Err(self.bad(format!(
                    "export format {f} is newer than this benchfleet reads (format {FORMAT}); import it with a \
                     newer benchfleet"
                )));
            }
            _ => {
                let shown = format.map_or_else(|| "none".to_owned(), |f| f.to_string());
                return Err(
                    self.bad(format!("export format {shown} is not one this benchfleet reads (format {FORMAT})"))
                );
            }
        }
        self.original = self.parse::<HeaderIn>(text, "header")?.run;
        self.section = Section::Header;
        Ok(())
    }

    fn run(&mut self, text: &[u8]) -> Result<(), ImportError> {
        let run = self.parse::<RunIn>(text, "run")?.run;
        if run.id != self.original {
            return Err(self.bad(format!("the run's id is {}, but the header says {}", run.id, self.original)));
        }
        if !run.is_over() {
            return Err(self.bad(format!(
                "run {} is still running in the file; only a finished or cancelled run is imported",
                run.id
            )));
        }
        self.run = Some(run);
        Ok(())
    }

    fn group(&mut self, text: &[u8]) -> Result<(), ImportError> {
        let group = self.parse::<GroupIn>(text, "group")?.group;
        if group.run != self.original {
            return Err(self.bad(format!("group {} is of run {}, not of run {}", group.id, group.run, self.original)));
        }
        if self.group_lines.contains_key(&group.id) {
            return Err(self.bad(format!("group {} again", group.id)));
        }
        if let Some(p) = &group.placement {
            return Err(self.bad(format!(
                "group {} still holds GPUs on {} (of the fleet it was exported from); only a run whose groups all \
                 let go of their GPUs is imported",
                group.id, p.agent
            )));
        }
        self.group_lines.insert(group.id, self.line);
        self.groups.push(group);
        self.counts.groups += 1;
        Ok(())
    }

    fn job(&mut self, text: &[u8]) -> Result<(), ImportError> {
        let job = self.parse::<JobIn>(text, "job")?.job;
        if job.run != self.original {
            return Err(self.bad(format!("job {} is of run {}, not of run {}", job.id, job.run, self.original)));
        }
        if self.job_index.contains_key(&job.id) {
            return Err(self.bad(format!("job {} again", job.id)));
        }
        if !self.group_lines.contains_key(&job.group) {
            return Err(self.bad(format!("job {} is of group {}, which the file does not hold", job.id, job.group)));
        }
        if !job.state.is_terminal() {
            return Err(self.bad(format!(
                "job {} is still {}; only a run whose jobs have all ended is imported",
                job.id,
                job.state.as_str()
            )));
        }
        self.job_index.insert(job.id, self.jobs.len());
        self.jobs.push(job);
        self.counts.jobs += 1;
        Ok(())
    }

    /// Every job a group lists is in the file.
    fn check_groups(&self) -> Result<(), ImportError> {
        for g in &self.groups {
            if let Some(missing) = g.jobs.iter().find(|j| !self.job_index.contains_key(j)) {
                return Err(ImportError::Line {
                    line: self.group_lines[&g.id],
                    reason: format!("group {} lists job {missing}, which the file does not hold", g.id),
                });
            }
        }
        Ok(())
    }

    /// That `job` is in the file and made attempt `attempt` (attempt numbers
    /// only grow, so the job's current one is its highest).
    fn check_attempt(&self, what: &str, job: u64, attempt: u32) -> Result<(), ImportError> {
        let Some(&i) = self.job_index.get(&job) else {
            return Err(self.bad(format!("{what} of job {job}, which the file does not hold")));
        };
        let made = self.jobs[i].attempt;
        if attempt == 0 || attempt > made {
            return Err(self.bad(format!(
                "{what} of attempt {attempt} of job {job}, which made {made} attempt{}",
                if made == 1 { "" } else { "s" }
            )));
        }
        Ok(())
    }

    fn summary(&mut self, text: &[u8]) -> Result<(), ImportError> {
        let line: SummaryIn = self.parse(text, "summary")?;
        self.check_attempt("a summary", line.job, line.attempt)?;
        if self.summaries.insert((line.job, line.attempt), line.summary).is_some() {
            return Err(self.bad(format!("a second summary of {}", self.attempt((line.job, line.attempt)))));
        }
        self.counts.summaries += 1;
        Ok(())
    }

    fn stats(&mut self, text: &[u8]) -> Result<(), ImportError> {
        let line: StatsIn = self.parse(text, "stats")?;
        self.check_attempt("stats", line.job, line.attempt)?;
        if self.stats.insert((line.job, line.attempt), line.stats).is_some() {
            return Err(self.bad(format!("second stats of {}", self.attempt((line.job, line.attempt)))));
        }
        self.counts.stats += 1;
        Ok(())
    }

    /// An attempt's telemetry series, stored under the claimed id at once
    /// (they are removed with the rest if the file is refused later).
    fn telemetry(&mut self, text: &[u8]) -> Result<(), ImportError> {
        let line: TelemetryIn = self.parse(text, "telemetry")?;
        self.check_attempt("telemetry", line.job, line.attempt)?;
        if !self.telemetry_seen.insert((line.job, line.attempt)) {
            return Err(self.bad(format!("second telemetry of {}", self.attempt((line.job, line.attempt)))));
        }
        let run = self.target()?;
        self.store.apply(&[crate::records::Write::Telemetry(
            AttemptKey { run, job: line.job, attempt: line.attempt },
            line.series,
        )])?;
        self.counts.telemetry += 1;
        Ok(())
    }

    fn record(&mut self, text: &[u8]) -> Result<(), ImportError> {
        let line: RecordIn = self.parse(text, "record")?;
        let key = (line.job, line.attempt);
        if self.current.as_ref().is_none_or(|a| a.key != key) {
            if let Some(last) = self.current.as_ref().map(|a| a.key).or_else(|| self.done.last().copied())
                && key < last
            {
                return Err(self.bad(format!(
                    "a record of {} after those of {}: each attempt's records come together, attempts in order",
                    self.attempt(key),
                    self.attempt(last)
                )));
            }
            self.check_attempt("a record", line.job, line.attempt)?;
            let expected = match self.stats.get(&key) {
                None => {
                    return Err(self.bad(format!(
                        "a record of {}, which has no stats line: the file holds records of the attempts its stats \
                         count only",
                        self.attempt(key)
                    )));
                }
                Some(s) if s.removed => {
                    return Err(self
                        .bad(format!("a record of {}, whose stats say its records were removed", self.attempt(key))));
                }
                Some(s) => s.records,
            };
            self.end_attempt()?;
            self.current = Some(Attempt {
                key,
                expected,
                read: 0,
                digest: DigestBuilder::default(),
                batch: Vec::new(),
                batch_bytes: 0,
                next_batch: 0,
            });
        }
        let Some(a) = self.current.as_mut() else { unreachable!("set above") };
        a.read += 1;
        if a.read > a.expected {
            let (expected, key) = (a.expected, a.key);
            return Err(self.bad(format!("more records of {} than the {expected} its stats count", self.attempt(key))));
        }
        a.digest.add(&line.record);
        a.batch_bytes += text.len();
        a.batch.push(line.record);
        self.counts.records += 1;
        if a.batch.len() >= BATCH_RECORDS || a.batch_bytes >= BATCH_BYTES {
            self.cut_batch()?;
        }
        Ok(())
    }

    /// Stages the current attempt's batch, and writes what is staged once
    /// it is large enough.
    fn cut_batch(&mut self) -> Result<(), ImportError> {
        let target = self.target()?;
        let Some(a) = self.current.as_mut() else { return Ok(()) };
        if a.batch.is_empty() {
            return Ok(());
        }
        let encoded = codec::encode_batch(&a.batch);
        a.batch.clear();
        a.batch_bytes = 0;
        self.pending_bytes += encoded.len();
        let key = AttemptKey { run: target, job: a.key.0, attempt: a.key.1 };
        self.pending.batches.push((key, a.next_batch, encoded));
        a.next_batch += 1;
        if self.pending_bytes >= COMMIT_BYTES {
            self.store.commit_records(&std::mem::take(&mut self.pending))?;
            self.pending_bytes = 0;
        }
        Ok(())
    }

    /// Ends the attempt whose records were being read: its count checked, its
    /// last batch staged, and its digest with it.
    fn end_attempt(&mut self) -> Result<(), ImportError> {
        if self.current.is_none() {
            return Ok(());
        }
        self.cut_batch()?;
        let target = self.target()?;
        let Some(a) = self.current.take() else { return Ok(()) };
        if a.read != a.expected {
            return Err(self.bad(format!(
                "the records of {} end before this line after {}, but its stats count {}",
                self.attempt(a.key),
                a.read,
                a.expected
            )));
        }
        let digest = a.digest.finish();
        // A digest is kept only where it covers what the summary counts; a
        // report builds (and checks) any other.
        if self.summaries.get(&a.key).is_some_and(|s| records_of(s) == digest.records) {
            let key = AttemptKey { run: target, job: a.key.0, attempt: a.key.1 };
            let encoded = codec::encode_digest(&digest);
            self.pending_bytes += encoded.len();
            self.pending.digests.push((key, encoded));
        }
        self.done.insert(a.key);
        Ok(())
    }

    /// Writes the summaries, before the records (a digest is stored only
    /// beside its summary).
    fn stage_summaries(&mut self) -> Result<(), ImportError> {
        if self.summaries.is_empty() {
            return Ok(());
        }
        let target = self.target()?;
        let summaries = self
            .summaries
            .iter()
            .map(|(&(job, attempt), s)| (AttemptKey { run: target, job, attempt }, s.clone()))
            .collect();
        self.store.commit_records(&RecordCommit { summaries, ..Default::default() })?;
        Ok(())
    }

    fn end(&mut self, text: &[u8]) -> Result<(), ImportError> {
        let said: Counts = self.parse(text, "trailer")?;
        self.end_attempt()?;
        if let Some((&key, s)) = self.stats.iter().find(|(k, s)| !s.removed && s.records > 0 && !self.done.contains(k))
        {
            return Err(self.bad(format!(
                "the file holds no records of {}, but its stats count {}",
                self.attempt(key),
                s.records
            )));
        }
        let held = self.counts;
        for (what, said, held) in [
            ("groups", said.groups, held.groups),
            ("jobs", said.jobs, held.jobs),
            ("summaries", said.summaries, held.summaries),
            ("stats", said.stats, held.stats),
            ("telemetry lines", said.telemetry, held.telemetry),
            ("records", said.records, held.records),
        ] {
            if said != held {
                return Err(self.bad(format!("the trailer counts {said} {what}, but the file holds {held}")));
            }
        }
        Ok(())
    }

    /// The id the run is stored under, claimed at the first write.
    fn target(&mut self) -> Result<RunId, StoreError> {
        if let Some(id) = self.target {
            return Ok(id);
        }
        let id = if self.store.claim_run_id(self.original)? { self.original } else { self.store.next_run_id()? };
        self.target = Some(id);
        Ok(id)
    }

    /// Stores what is left (the last records, the stats), then the run, its
    /// groups and jobs: the run appears whole, or not at all.
    fn finish(&mut self) -> Result<Imported, ImportError> {
        let target = self.target()?;
        let mut commit = std::mem::take(&mut self.pending);
        commit.stats =
            self.stats.iter().map(|(&(job, attempt), s)| (AttemptKey { run: target, job, attempt }, *s)).collect();
        self.store.commit_records(&commit)?;
        let Some(mut run) = self.run.clone() else { unreachable!("a file without its run line ends before") };
        run.id = target;
        let groups: Vec<Group> = self.groups.iter().cloned().map(|g| Group { run: target, ..g }).collect();
        let jobs: Vec<Job> = self.jobs.iter().cloned().map(|j| Job { run: target, ..j }).collect();
        self.store.create_run(&run, &groups, &jobs)?;
        let mut missing_files = Vec::new();
        for (path, sha) in &run.files {
            if !self.store.has_file(sha)? {
                missing_files.push((path.clone(), sha.clone()));
            }
        }
        Ok(Imported { run: target, original: self.original, counts: self.counts, missing_files })
    }

    /// Removes what was staged under the claimed id (records, summaries,
    /// digests, stats); the id itself stays given out.
    fn discard(&mut self) -> Result<(), StoreError> {
        let Some(target) = self.target else { return Ok(()) };
        // The run itself was the last thing stored; if that failed, it is
        // not there.
        let purges =
            self.jobs.iter().map(|j| AttemptKey { run: target, job: j.id, attempt: u32::MAX }).collect::<Vec<_>>();
        self.store.commit_records(&RecordCommit { purges, ..Default::default() })
    }
}

#[cfg(test)]
mod tests;
