//! A stored run's report: the run, its groups and jobs read from the store,
//! each attempt's digest read (or built from its records, and handed to
//! `keep` to be stored) and its telemetry, made into the study's document
//! (`benchfleet_study::report`), which renders it.

use benchfleet_core::Digest;
use benchfleet_core::Summary;
use benchfleet_core::telemetry::Series;
use benchfleet_study::model::{AttemptKey, RunId, RunState};
use benchfleet_study::report::doc::ReportDoc;
use benchfleet_study::report::{Measurements, Report};

use crate::store::{Store, StoreError};

/// Renders the console report of a stored run; the digests it has to build
/// (missing from the store) are kept in memory only.
pub fn render(store: &dyn Store, run_id: RunId) -> Result<Report, StoreError> {
    render_keeping(store, run_id, &|_, _| {})
}

/// Renders the console report of a stored run, handing each digest it had
/// to build from records to `keep` (the controller stores them).
pub fn render_keeping(
    store: &dyn Store,
    run_id: RunId,
    keep: &dyn Fn(AttemptKey, &Digest),
) -> Result<Report, StoreError> {
    Ok(Report::of(&document(store, run_id, keep)?))
}

/// Everything the report of a stored run says, gathered once; a fleet
/// check's targets are also held to their own last check of the same name
/// (drift).
pub fn document(store: &dyn Store, run_id: RunId, keep: &dyn Fn(AttemptKey, &Digest)) -> Result<ReportDoc, StoreError> {
    let mut doc = document_alone(store, run_id, keep)?;
    if let Some(fleet) = doc.fleet.as_mut()
        && let Some(before) = last_check(store, run_id, &doc.run.name)?
        && let Some(then) = document_alone(store, before, keep)?.fleet
    {
        benchfleet_study::fleet::drift(&mut fleet.cohorts, &then.cohorts, before.0, fleet.thresholds.drift_pct);
    }
    Ok(doc)
}

fn document_alone(
    store: &dyn Store,
    run_id: RunId,
    keep: &dyn Fn(AttemptKey, &Digest),
) -> Result<ReportDoc, StoreError> {
    let run = store.run(run_id)?.ok_or_else(|| StoreError::NotFound(format!("run {run_id}")))?;
    let groups = store.groups(run_id)?;
    let jobs = store.jobs(run_id)?;
    benchfleet_study::report::document(&run, &groups, &jobs, &Stored { store, keep })
}

/// The finished fleet check of this name before `run_id`, if any.
fn last_check(store: &dyn Store, run_id: RunId, name: &str) -> Result<Option<RunId>, StoreError> {
    Ok(store
        .listed_runs()?
        .iter()
        .map(|(run, _)| run)
        .filter(|r| r.id < run_id && r.fleet.is_some() && r.name == name && r.state == RunState::Finished)
        .map(|r| r.id)
        .max())
}

/// A run's measurements as the store has them.
struct Stored<'a> {
    store: &'a dyn Store,
    keep: &'a dyn Fn(AttemptKey, &Digest),
}

impl Measurements for Stored<'_> {
    type Error = StoreError;

    fn digest(&self, attempt: &AttemptKey, summary: &Summary) -> Result<Result<Digest, String>, StoreError> {
        match crate::digests::get_or_build(self.store, attempt, summary, self.keep) {
            Ok(d) => Ok(Ok(d)),
            Err(StoreError::Invalid(why)) => Ok(Err(why)),
            Err(e) => Err(e),
        }
    }

    fn telemetry(&self, attempt: &AttemptKey) -> Result<Vec<Series>, StoreError> {
        Ok(self.store.telemetry(attempt)?.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests;
