//! Brings a store written by an earlier schema up to the current one, in
//! place. Each step can be run again after a crash: it recognises what it
//! already converted.
//!
//! Schema 1 to 2: a run's `finished` flag becomes its `state`; a job's
//! summary moves to the `summaries` tree and its agent from a name to an id
//! number; records move from one JSON value per record to binary batches;
//! files move from a tree to files named by their hash.
//!
//! Schema 2 to 3: an agent's record says which certificate it holds; those
//! stored before certificates hold none (`"certificate": null`), so under
//! TLS such an agent must join, and is a new agent (a new id) when it does.
//!
//! Schema 3 to 4: each run's counts (`run_counts`: its jobs by state, its
//! groups and latest stage), counted once from its groups and jobs; from
//! then on they change with every write of what they count.

use benchfleet_core::RequestRecord;
use serde_json::Value;

use super::{SledStore, Store as _, StoreError, codec};
use benchfleet_study::model::AttemptStats;

/// Records per batch when old records are regrouped.
const BATCH: usize = 256;

pub(super) fn run(store: &SledStore, from: u32) -> Result<(), StoreError> {
    if from < 2 {
        tracing::info!("migrating the store from schema 1 to 2");
        runs(store)?;
        jobs(store)?;
        records(store)?;
        files(store)?;
    }
    if from < 3 {
        tracing::info!("migrating the store from schema 2 to 3");
        agents(store)?;
    }
    if from < 4 {
        tracing::info!("migrating the store from schema 3 to 4");
        run_counts(store)?;
    }
    Ok(())
}

/// Counts every run's groups and jobs; counting again gives the same.
fn run_counts(store: &SledStore) -> Result<(), StoreError> {
    for run in store.runs()? {
        let groups = store.groups(run.id)?;
        let jobs: Vec<benchfleet_study::model::Job> = super::scan(&store.jobs, &[run.id.0], "job")?;
        let counts = super::RunCounts::of(&groups, &jobs);
        store.run_counts.insert(super::key(&[run.id.0]), super::encode(&counts))?;
    }
    Ok(())
}

fn agents(store: &SledStore) -> Result<(), StoreError> {
    for kv in store.agents.iter() {
        let (k, v) = kv?;
        let mut agent: Value = serde_json::from_slice(&v).map_err(|e| corrupt("agent", e))?;
        let Some(obj) = agent.as_object_mut() else { continue };
        if !obj.contains_key("certificate") {
            obj.insert("certificate".to_owned(), Value::Null);
            store.agents.insert(k, serde_json::to_vec(&agent).map_err(|e| corrupt("agent", e))?)?;
        }
    }
    Ok(())
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt { what: what.to_owned(), reason: e.to_string() }
}

fn runs(store: &SledStore) -> Result<(), StoreError> {
    for kv in store.runs.iter() {
        let (k, v) = kv?;
        let mut run: Value = serde_json::from_slice(&v).map_err(|e| corrupt("run", e))?;
        let Some(obj) = run.as_object_mut() else { continue };
        if let Some(finished) = obj.remove("finished") {
            let state = if finished.as_bool() == Some(true) { "finished" } else { "running" };
            obj.insert("state".to_owned(), Value::from(state));
            store.runs.insert(k, serde_json::to_vec(&run).map_err(|e| corrupt("run", e))?)?;
        }
    }
    Ok(())
}

fn jobs(store: &SledStore) -> Result<(), StoreError> {
    for kv in store.jobs.iter() {
        let (k, v) = kv?;
        let mut job: Value = serde_json::from_slice(&v).map_err(|e| corrupt("job", e))?;
        let Some(obj) = job.as_object_mut() else { continue };
        let mut changed = false;
        if let Some(summary) = obj.remove("summary") {
            changed = true;
            let attempt = obj.get("attempt").and_then(Value::as_u64).unwrap_or(0);
            if !summary.is_null() && k.len() == 16 {
                let mut sk = k.to_vec();
                sk.extend_from_slice(&attempt.to_be_bytes());
                store.summaries.insert(sk, serde_json::to_vec(&summary).map_err(|e| corrupt("summary", e))?)?;
            }
        }
        if let Some(Value::String(name)) = obj.get("agent") {
            changed = true;
            let id = name.strip_prefix("agent-").and_then(|n| n.parse::<u64>().ok());
            obj.insert("agent".to_owned(), id.map_or(Value::Null, Value::from));
        }
        if changed {
            store.jobs.insert(k, serde_json::to_vec(&job).map_err(|e| corrupt("job", e))?)?;
        }
    }
    Ok(())
}

/// Regroups each attempt's JSON records (keyed by seq) into binary batches
/// (keyed by batch number), one attempt at a time.
fn records(store: &SledStore) -> Result<(), StoreError> {
    // The attempts that still have JSON records, found in one pass.
    let mut attempts: Vec<Vec<u8>> = Vec::new();
    for kv in store.records.iter() {
        let (k, v) = kv?;
        if v.first() == Some(&b'{') && k.len() == 32 && attempts.last().is_none_or(|p| p[..] != k[..24]) {
            attempts.push(k[..24].to_vec());
        }
    }
    for prefix in attempts {
        let mut old = Vec::new();
        let mut records: Vec<RequestRecord> = Vec::new();
        for kv in store.records.scan_prefix(&prefix) {
            let (k, v) = kv?;
            if v.first() == Some(&b'{') {
                records.push(serde_json::from_slice(&v).map_err(|e| corrupt("record", e))?);
                old.push(k);
            }
        }
        let mut batch = sled::Batch::default();
        for k in old {
            batch.remove(k);
        }
        let stored = records.len() as u64;
        let key = super::attempt_of(&prefix).ok_or_else(|| corrupt("record key", "shorter than an attempt"))?;
        for (n, chunk) in records.chunks(BATCH).enumerate() {
            let encoded = codec::encode_batch(chunk);
            for (k, part) in super::batch_parts(&key, n as u64, &encoded) {
                batch.insert(k, part);
            }
        }
        store.records.apply_batch(batch)?;
        let stats = AttemptStats { records: stored, sent: stored, removed: false };
        store.stats.insert(prefix, super::encode(&stats))?;
    }
    Ok(())
}

fn files(store: &SledStore) -> Result<(), StoreError> {
    if !store.db.tree_names().iter().any(|n| n.as_ref() == b"files") {
        return Ok(());
    }
    let tree = store.db.open_tree("files")?;
    for kv in tree.iter() {
        let (k, v) = kv?;
        let sha = String::from_utf8_lossy(&k).into_owned();
        let mut w = store.new_file()?;
        w.write(&v)?;
        w.finish(&sha, v.len() as u64)?;
        tree.remove(k)?;
    }
    store.db.drop_tree("files")?;
    Ok(())
}
