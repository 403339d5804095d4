//! A replica of the engine as the drivers step it: a [`Scheduler`], or a pipeline's batches in flight.
//!
//! With `--pipeline-parallel-size N` the engine splits the model's layers over N stages and keeps
//! N batches in flight, one a stage: each batch is planned on its own (a scheduler of its own,
//! with its share of the stages' KV cache and of the sequence limit) and passes every stage in
//! turn, so a step of it takes the whole model at one stage's speed. A stage passes a batch on
//! only when it is free, so the batches advance together: a round, in which each batch moves one
//! step, lasts as long as its slowest batch's step (the pipeline's bubbles when they differ). Not
//! modelled: the transfers between stages, and the engine's one scheduler and cache behind the
//! batches (here a request stays in the batch it joined, each batch caches its own prefixes).

use crate::{
    config::SimConfig,
    profile::StepWork,
    scheduler::{Counters, Scheduler, SeqRequest, StartupError, Step},
};

/// What the drivers step: the scheduler of one batch at a time, or a [`Pipeline`].
pub trait Stepper {
    /// Queues a request.
    fn add(&mut self, request: SeqRequest);
    /// Plans and applies the next step; `None` when there is nothing to run.
    fn step(&mut self) -> Option<Step>;
    /// Drops a request, wherever it is.
    fn abort(&mut self, id: u64);
    fn is_idle(&self) -> bool;
    fn running(&self) -> usize;
    fn waiting(&self) -> usize;
    fn kv_usage(&self) -> f64;
    fn counters(&self) -> Counters;
    fn reset_prefix_cache(&mut self);
}

impl Stepper for Scheduler {
    fn add(&mut self, request: SeqRequest) {
        Scheduler::add(self, request);
    }
    fn step(&mut self) -> Option<Step> {
        Scheduler::step(self)
    }
    fn abort(&mut self, id: u64) {
        Scheduler::abort(self, id);
    }
    fn is_idle(&self) -> bool {
        Scheduler::is_idle(self)
    }
    fn running(&self) -> usize {
        Scheduler::running(self)
    }
    fn waiting(&self) -> usize {
        Scheduler::waiting(self)
    }
    fn kv_usage(&self) -> f64 {
        Scheduler::kv_usage(self)
    }
    fn counters(&self) -> Counters {
        Scheduler::counters(self)
    }
    fn reset_prefix_cache(&mut self) {
        Scheduler::reset_prefix_cache(self);
    }
}

/// One data-parallel replica: its pipeline's batches in flight (one without pipeline parallelism).
#[derive(Debug)]
pub struct Pipeline {
    batches: Vec<Scheduler>,
}

impl Pipeline {
    /// The engine's data-parallel replicas ([`SimConfig::data_replicas`]), each a pipeline of
    /// batches on its own GPUs; with step jitter, each batch draws its own (the first as
    /// `--sim-seed` says). Fails as one batch would (a parallel size of 0 too).
    pub fn replicas(config: &SimConfig) -> Result<Vec<Pipeline>, StartupError> {
        let stages = config.pipeline_parallel_size.max(1) as usize;
        let replicas = config.data_replicas().max(1);
        let (jitter, seed) = (config.faults.step_jitter_pct, config.faults.seed);
        let mut batches = (0..replicas.saturating_mul(stages))
            .map(|i| {
                let batch = Scheduler::batch_of(config, i % stages)?;
                Ok(if i == 0 { batch } else { batch.with_step_jitter(jitter, seed.wrapping_add(i as u64)) })
            })
            .collect::<Result<Vec<_>, StartupError>>()?
            .into_iter();
        Ok((0..replicas).map(|_| Pipeline { batches: batches.by_ref().take(stages).collect() }).collect())
    }

    /// Each batch in flight, in order.
    pub fn batches(&self) -> &[Scheduler] {
        &self.batches
    }

    /// The most requests running here at once: its batches' limits together.
    pub fn max_num_seqs(&self) -> usize {
        self.batches.iter().map(Scheduler::max_num_seqs).sum()
    }

    /// The most tokens a request may hold here: what its smallest batch's cache holds.
    pub fn max_request_tokens(&self) -> usize {
        self.batches.iter().map(Scheduler::max_request_tokens).min().unwrap_or(0)
    }
}

impl Stepper for Pipeline {
    /// To the batch with the fewest requests, the first of equals: the next batch formed takes
    /// what waits.
    fn add(&mut self, request: SeqRequest) {
        let fewest = (0..self.batches.len())
            .min_by_key(|&i| (self.batches[i].running() + self.batches[i].waiting(), i))
            .unwrap_or_default();
        self.batches[fewest].add(request);
    }

    /// A round: each batch one step on, as long as the slowest.
    fn step(&mut self) -> Option<Step> {
        let steps: Vec<Step> = self.batches.iter_mut().filter_map(Scheduler::step).collect();
        let duration = steps.iter().map(|s| s.duration).max()?;
        let mut work = StepWork::default();
        for s in &steps {
            work.prefill_tokens += s.work.prefill_tokens;
            work.prefill_attention_pairs += s.work.prefill_attention_pairs;
            work.decode_tokens += s.work.decode_tokens;
            work.decode_context_tokens += s.work.decode_context_tokens;
            work.prefill_window_pairs += s.work.prefill_window_pairs;
            work.decode_window_tokens += s.work.decode_window_tokens;
            work.draft_tokens = work.draft_tokens.max(s.work.draft_tokens);
        }
        Some(Step { duration, emissions: steps.into_iter().flat_map(|s| s.emissions).collect(), work })
    }

    fn abort(&mut self, id: u64) {
        self.batches.iter_mut().for_each(|b| b.abort(id));
    }
    fn is_idle(&self) -> bool {
        self.batches.iter().all(Scheduler::is_idle)
    }
    fn running(&self) -> usize {
        self.batches.iter().map(Scheduler::running).sum()
    }
    fn waiting(&self) -> usize {
        self.batches.iter().map(Scheduler::waiting).sum()
    }
    fn kv_usage(&self) -> f64 {
        self.batches.iter().map(Scheduler::kv_usage).sum::<f64>() / self.batches.len().max(1) as f64
    }
    fn counters(&self) -> Counters {
        let mut total = Counters::default();
        for batch in &self.batches {
            total += batch.counters();
        }
        total
    }
    fn reset_prefix_cache(&mut self) {
        self.batches.iter_mut().for_each(Scheduler::reset_prefix_cache);
    }
}
