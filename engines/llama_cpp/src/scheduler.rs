//! Continuous batching: one thread per model owns the llama.cpp context and its slots.
//!
//! Every step builds one batch from (a) the last sampled token of every generating sequence and
//! (b) prompt tokens of sequences still reading their prompt (at most `prefill_chunk`, fewer while
//! others generate: `llmr_sampling::Pacer`), decodes it once, and samples for every sequence that
//! produced logits. New requests join between steps.
//! Each sequence has a KV stream of its own when `slots x ctx_per_seq` cells fit the cell budget
//! (`separate_streams`): llama.cpp then attends each sequence over its own cells only. In one
//! unified cache every sequence attends over the cells of all (masked), which cost 25-35% of
//! decode speed at 8 sequences of a few hundred tokens in profiles (`bench/RESULTS.md`: 23% of
//! the time in `ggml_vec_dot_f16` against 6% for llama-batched-bench, which keeps streams apart).
//! Past the budget the cache stays unified, so that its cells go where the tokens are. When its
//! cells run out, idle caches leave first (saved to host memory); then the sequence that started
//! last is preempted (vLLM's order): its cache is saved like an idle one, it keeps its sampler,
//! text and stop state, and it comes back before any new request once another sequence ended
//! and the cells are there (or nothing runs), restoring its cache or reading again what it had
//! read. Its stream only pauses.
//! A new request starts from the longest token prefix any slot holds (shared by `seq_cp`:
//! metadata only in a unified cache, a copy of the whole stream between separate ones), or that
//! host memory saved from an idle slot (`prefixes.rs`), so shared system prompts are processed
//! once.
//! Speculative decoding by prompt lookup (`llmr_sampling::Speculator`): a generating sequence may
//! feed, after its pending token, a draft copied from its own earlier text; the step samples at
//! each of those positions in order and keeps the draft up to the first token the sampler did
//! not pick, and the rest leaves the KV cache (`seq_rm`). Drafts take batch room from the prompt
//! chunk, never from another sequence's token.

use crate::backend;
use crate::sampling::TokenSampler;
use crate::settings::{Change, ContextSettings, Eviction, StepSettings};
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::DecodeError;
use llmr_constraint::TokenMask;
use llmr_engine_sdk::text::{StopMatcher, Utf8Stream};
use llmr_engine_sdk::worker::{cancelled_in_queue, clock_ns, finished, Event, TokenEvent};
use llmr_engine_sdk::Sampling;
use llmr_engine_sdk::{EngineError, ErrorCode, FinishReason, Logger};
use llmr_sampling::{
    common_prefix, logprobs, DraftSettings, Pacer, PrefixStore, Speculator, StepCost, UNKNOWN_COST_THRESHOLD,
};
use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

mod packed_state;
mod prefixes;
mod window;

/// A generation request, tokenized by the caller.
pub struct Job {
    pub request_id: u64,
    pub tokens: Vec<LlamaToken>,
    /// The request's `max_tokens` capped by the room left in the sequence's context.
    pub max_tokens: u32,
    pub sampling: Sampling,
    /// The request's constraint, compiled by the caller; `None` for free text.
    pub mask: Option<TokenMask>,
    pub ignore_eos: bool,
    /// Control tokens are written as their text (`LLMR_INFER_SPECIAL_TEXT`).
    pub special_text: bool,
    pub events: Sender<Event>,
    pub cancel: Arc<AtomicBool>,
}

pub enum Command {
    Infer(Job),
    Change(Change),
    Shutdown,
}

/// Counters shared with `get_metrics`.
#[derive(Default)]
pub struct Stats {
    pub slots_busy: AtomicU64,
    pub queued: AtomicU64,
    pub requests_total: AtomicU64,
    pub prompt_tokens_total: AtomicU64,
    pub cached_tokens_total: AtomicU64,
    pub tokens_generated_total: AtomicU64,
    /// Tokens drawn under a grammar, and the time their masks took.
    pub constrained_tokens_total: AtomicU64,
    pub constraint_ns_total: AtomicU64,
    pub kv_cells_used: AtomicU64,
    pub kv_cells_total: AtomicU64,
    pub decode_steps_total: AtomicU64,
    pub prefix_cache_bytes: AtomicU64,
    pub prefix_cache_entries: AtomicU64,
    /// Idle caches copied to host memory, and of those how many at int8.
    pub prefix_cache_saved_total: AtomicU64,
    pub prefix_cache_int8_total: AtomicU64,
    /// Requests whose prefix came back from host memory.
    pub prefix_cache_restored_total: AtomicU64,
    /// Requests whose prefix was copied from another slot's cache.
    pub prefix_copies_total: AtomicU64,
    /// Draft tokens fed for speculative decoding, and those the sampler kept.
    pub draft_tokens_total: AtomicU64,
    pub draft_accepted_total: AtomicU64,
    /// Runs of consecutive sequence ids in each step's batch, added up: between separate KV
    /// streams llama.cpp decodes each run as a forward pass of its own (more where prompt chunks
    /// of different lengths share a step), so this over `decode_steps_total` is the passes a step
    /// takes. One a step in a unified cache.
    pub stream_runs_total: AtomicU64,
    /// The KV cache llama.cpp allocated for the context, as it reported it.
    pub kv_bytes: AtomicU64,
    /// Window-sized sliding caches (`window.rs`): checkpoints taken, resumed from, the host
    /// memory they hold, and prompts read from the start for want of the window.
    pub ctx_checkpoints_saved_total: AtomicU64,
    pub ctx_checkpoints_restored_total: AtomicU64,
    pub ctx_checkpoint_bytes: AtomicU64,
    pub window_reprocessed_total: AtomicU64,
    /// Middle eviction (`settings::Eviction`): positions the running sequences dropped, and
    /// every shift and position dropped so far.
    pub kv_evicted: AtomicU64,
    pub kv_shifts_total: AtomicU64,
    pub kv_evicted_total: AtomicU64,
    /// Sequences set aside for cells (`Scheduler::preempt`).
    pub preemptions_total: AtomicU64,
}

struct Active {
    job: Job,
    /// What it reads before it samples: its prompt, or after a preemption every token its cache
    /// held (then the token it had sampled follows as a decode token).
    feed: Vec<LlamaToken>,
    /// Next token of `feed` to read; == feed.len() once it is in the cache.
    next_prompt: usize,
    prompt_len: usize,
    cached_prompt: usize,
    /// Tokens of `feed` its slot held when it was (re)admitted.
    attached: usize,
    sampler: TokenSampler,
    /// Sampled but not yet fed to the model.
    pending: Option<LlamaToken>,
    /// Draft tokens fed after `pending` in the current batch (at the batch indices after its).
    drafted: Vec<LlamaToken>,
    spec: Speculator,
    /// Index in the current batch whose logits this slot samples from.
    batch_idx: Option<i32>,
    generated: u32,
    utf8: Utf8Stream,
    stops: StopMatcher,
    piece: Vec<u8>,
    started: Instant,
    first_token: Option<Instant>,
}

impl Active {
    /// Whether it still reads its feed (and samples only from its end).
    fn reading(&self) -> bool {
        self.next_prompt < self.feed.len()
    }
}

/// What drawing one token led to.
enum Drawn {
    /// The sequence goes on from this token.
    Next(LlamaToken),
    Finish(FinishReason),
    Failed(EngineError),
}

/// A slot's state before a step, to undo the step if decoding fails.
struct Snapshot {
    cached: usize,
    next_prompt: usize,
    pending: Option<LlamaToken>,
}

struct Slot {
    seq: i32,
    /// Tokens whose KV this sequence holds, at positions 0..len.
    cached: Vec<LlamaToken>,
    active: Option<Active>,
    /// Step at which the slot last finished (for picking which idle cache to overwrite).
    last_used: u64,
    /// Where its last prompts ended, for a window-sized sliding cache (`window.rs`), oldest first.
    checkpoints: Vec<window::Checkpoint>,
    /// After a middle eviction, only this many first positions hold what reading `cached` from
    /// the start would (the rest moved down over the gap): no other request may reuse more.
    moved_from: Option<usize>,
    /// Positions its running sequence evicted.
    evicted: usize,
}

impl Slot {
    /// The cached tokens a request with the same prefix may reuse.
    fn prefix(&self) -> &[LlamaToken] {
        &self.cached[..self.moved_from.map_or(self.cached.len(), |m| m.min(self.cached.len()))]
    }
}

pub struct Scheduler<'m> {
    model: &'m LlamaModel,
    ctx: LlamaContext<'m>,
    settings: ContextSettings,
    step: StepSettings,
    slots: Vec<Slot>,
    /// Preempted sequences, oldest first: they run again before any queued request.
    preempted: VecDeque<Active>,
    /// A sequence finished since the last preemption: only then (or with nothing running) may
    /// a preempted one come back, so that a preemption always lets the others go on.
    finished_since_preempt: bool,
    queue: VecDeque<Job>,
    batch: LlamaBatch<'static>,
    pending_changes: Vec<Change>,
    stats: Arc<Stats>,
    logger: Logger,
    steps: u64,
    pacer: Pacer,
    /// What a step costs by its number of tokens: whether draft tokens pay.
    cost: StepCost,
    saved: PrefixStore<LlamaToken, prefixes::Saved>,
    /// The model's sliding window (0: none).
    n_swa: u32,
    /// Whether llama.cpp can move this model's cached positions (`model::can_shift`).
    shiftable: bool,
}

/// KV cells of the context, over all sequences: `slots x ctx_per_seq`, or the cell budget
/// (`ContextSettings::cell_budget`) where that is less, but never less than one sequence's.
pub fn total_cells(s: &ContextSettings) -> u32 {
    s.ctx_per_seq.saturating_mul(s.slots).min(s.ctx_per_seq.max(s.cell_budget()))
}

/// Whether every sequence gets a stream of `ctx_per_seq` cells (`kv_unified` off): when they all
/// fit the budget, so the context holds the same cells either way.
pub fn separate_streams(s: &ContextSettings) -> bool {
    s.slots > 1 && s.ctx_per_seq.saturating_mul(s.slots) <= s.ctx_per_seq.max(s.cell_budget())
}

pub fn context_params(s: &ContextSettings) -> LlamaContextParams {
    LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(total_cells(s)))
        .with_n_batch(2048)
        .with_n_ubatch(512)
        .with_n_seq_max(s.slots)
        .with_kv_unified(!separate_streams(s))
        .with_n_threads(s.threads as i32)
        .with_n_threads_batch(s.threads as i32)
        .with_type_k(s.kv_type.llama())
        .with_type_v(s.kv_type.llama())
        .with_swa_full(s.swa_full)
        .with_no_perf(true)
}

/// A context and the bytes of KV cache llama.cpp allocated for it.
fn create_context<'m>(model: &'m LlamaModel, s: &ContextSettings) -> Result<(LlamaContext<'m>, u64), EngineError> {
    backend::clear_last_error();
    backend::take_kv_bytes();
    let created = model.new_context(backend::backend(), context_params(s));
    let kv_bytes = backend::take_kv_bytes();
    created.map(|ctx| (ctx, kv_bytes)).map_err(|e| {
        let why = backend::last_error();
        EngineError::new(
            ErrorCode::OomRam,
            format!(
                "cannot create a context of {} x {} tokens: {}",
                s.slots,
                s.ctx_per_seq,
                if why.is_empty() { e.to_string() } else { why }
            ),
        )
    })
}

/// Runs the scheduler until `Shutdown` or until every sender is gone. `ready` learns whether
/// the context could be created.
pub fn run(
    model: &LlamaModel,
    settings: ContextSettings,
    step: StepSettings,
    commands: Receiver<Command>,
    stats: Arc<Stats>,
    logger: Logger,
    ready: Sender<Result<(), EngineError>>,
) {
    let ctx = match create_context(model, &settings) {
        Ok((ctx, kv_bytes)) => {
            // Before `ready`: metrics read right after the load see the context's figures.
            stats.kv_bytes.store(kv_bytes, Ordering::Relaxed);
            stats.kv_cells_total.store(u64::from(total_cells(&settings)), Ordering::Relaxed);
            ctx
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    let mut s = Scheduler {
        model,
        ctx,
        settings,
        step,
        slots: Vec::new(),
        preempted: VecDeque::new(),
        finished_since_preempt: true,
        queue: VecDeque::new(),
        batch: LlamaBatch::new(0, 1),
        pending_changes: Vec::new(),
        stats,
        logger,
        steps: 0,
        pacer: Pacer::default(),
        cost: StepCost::default(),
        saved: PrefixStore::new(mib(step.prefix_cache_mib)),
        n_swa: crate::model::sliding_window(model),
        shiftable: crate::model::can_shift(model),
    };
    s.reset_slots();
    s.run_loop(commands);
}

impl<'m> Scheduler<'m> {
    fn reset_slots(&mut self) {
        self.slots = (0..self.settings.slots as i32)
            .map(|seq| Slot {
                seq,
                cached: Vec::new(),
                active: None,
                last_used: 0,
                checkpoints: Vec::new(),
                moved_from: None,
                evicted: 0,
            })
            .collect();
        self.batch = LlamaBatch::new(
            self.step.prefill_chunk as usize + self.settings.slots as usize,
            self.settings.slots as i32,
        );
        self.stats.kv_cells_total.store(u64::from(total_cells(&self.settings)), Ordering::Relaxed);
        // Saved states have the old context's shape (KV type).
        self.saved.clear();
        self.publish_saved();
    }

    fn publish_saved(&self) {
        self.stats.prefix_cache_bytes.store(self.saved.bytes() as u64, Ordering::Relaxed);
        self.stats.prefix_cache_entries.store(self.saved.len() as u64, Ordering::Relaxed);
    }

    fn busy(&self) -> bool {
        self.slots.iter().any(|s| s.active.is_some()) || !self.preempted.is_empty() || !self.queue.is_empty()
    }

    fn run_loop(&mut self, commands: Receiver<Command>) {
        loop {
            // Block only when there is nothing to do.
            if !self.busy() {
                self.apply_changes();
                match commands.recv() {
                    Ok(cmd) => {
                        if !self.handle(cmd) {
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
            while let Ok(cmd) = commands.try_recv() {
                if !self.handle(cmd) {
                    return;
                }
            }
            self.drop_cancelled();
            if !self.slots.iter().any(|s| s.active.is_some()) {
                self.apply_changes();
            }
            self.admit();
            self.stats.queued.store((self.queue.len() + self.preempted.len()) as u64, Ordering::Relaxed);
            if self.slots.iter().any(|s| s.active.is_some()) {
                self.step_once();
            }
        }
    }

    /// Returns false on shutdown.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Infer(job) => {
                self.stats.requests_total.fetch_add(1, Ordering::Relaxed);
                self.queue.push_back(job);
                true
            }
            Command::Change(Change::PrefillStall(s)) => {
                self.step.prefill_stall = s;
                true
            }
            Command::Change(Change::PrefixCacheMib(n)) => {
                self.step.prefix_cache_mib = n;
                self.saved.set_budget(mib(n));
                self.publish_saved();
                true
            }
            // Requests admitted from now on draft this much; running ones keep theirs.
            Command::Change(Change::DraftMax(n)) => {
                self.step.draft_max = n;
                true
            }
            Command::Change(Change::DraftThreshold(t)) => {
                self.step.draft_threshold = t;
                true
            }
            // Each slot keeps its latest `n` checkpoints.
            Command::Change(Change::CtxCheckpoints(n)) => {
                self.step.ctx_checkpoints = n;
                self.trim_checkpoints();
                true
            }
            // Eviction applies from the next step; a static level's type when idle.
            Command::Change(Change::Policy(p)) => {
                (self.step.eviction, self.step.idle_int8) = (p.eviction, p.idle_int8);
                if let Some(t) = p.kv_type {
                    self.pending_changes.push(Change::KvType(t));
                }
                true
            }
            Command::Change(Change::PrefillChunk(n)) => {
                self.step.prefill_chunk = n;
                self.batch = LlamaBatch::new(n as usize + self.settings.slots as usize, self.settings.slots as i32);
                true
            }
            Command::Change(c) => {
                self.pending_changes.push(c);
                true
            }
            Command::Shutdown => {
                for job in self.queue.drain(..) {
                    let _ = job.events.send(Event::Failed(EngineError::cancelled()));
                }
                let idx: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].active.is_some()).collect();
                for i in idx {
                    self.finish(i, FinishReason::Cancelled);
                }
                for a in std::mem::take(&mut self.preempted) {
                    self.report_finish(a, FinishReason::Cancelled);
                }
                false
            }
        }
    }

    /// Context-shaping changes wait until no sequence is running, then rebuild the context.
    fn apply_changes(&mut self) {
        if self.pending_changes.is_empty() {
            return;
        }
        let mut next = self.settings;
        for c in self.pending_changes.drain(..) {
            match c {
                Change::KvType(t) => next.kv_type = t,
                Change::Threads(n) => next.threads = n,
                Change::SwaFull(b) => next.swa_full = b,
                Change::Policy(_)
                | Change::PrefillChunk(_)
                | Change::PrefillStall(_)
                | Change::PrefixCacheMib(_)
                | Change::DraftMax(_)
                | Change::DraftThreshold(_)
                | Change::CtxCheckpoints(_) => {}
            }
        }
        if next == self.settings {
            return;
        }
        match create_context(self.model, &next) {
            Ok((ctx, kv_bytes)) => {
                self.ctx = ctx;
                self.settings = next;
                self.stats.kv_bytes.store(kv_bytes, Ordering::Relaxed);
                self.reset_slots();
                self.logger.info(&format!(
                    "context rebuilt: kv {} threads {} swa_full {}",
                    next.kv_type.name(),
                    next.threads,
                    next.swa_full
                ));
            }
            Err(e) => self.logger.error(&format!("keeping the old context: {}", e.message)),
        }
    }

    fn drop_cancelled(&mut self) {
        let idx: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].active.as_ref().is_some_and(|a| a.job.cancel.load(Ordering::SeqCst)))
            .collect();
        for i in idx {
            self.finish(i, FinishReason::Cancelled);
        }
        let cancel = |job: &Job| job.cancel.load(Ordering::SeqCst);
        let (preempted, kept): (VecDeque<Active>, _) =
            std::mem::take(&mut self.preempted).into_iter().partition(|a| cancel(&a.job));
        self.preempted = kept;
        let (queued, kept): (VecDeque<Job>, _) = std::mem::take(&mut self.queue).into_iter().partition(cancel);
        self.queue = kept;
        // Counters first: the requester may read metrics as soon as it gets its end.
        self.stats.queued.store((self.queue.len() + self.preempted.len()) as u64, Ordering::Relaxed);
        for a in preempted {
            self.report_finish(a, FinishReason::Cancelled);
        }
        for job in queued {
            let _ = job.events.send(cancelled_in_queue(job.tokens.len()));
        }
    }

    /// Moves preempted sequences, then queued jobs, into free slots, reusing the longest cached
    /// prefix.
    fn admit(&mut self) {
        // Preempted sequences come back first, oldest first: when nothing runs, or once a
        // sequence finished and the cells the running ones leave hold what they had and 16 more
        // for each running sequence (with less, the next full cache would preempt them again).
        // New requests wait behind them.
        while let Some(front) = self.preempted.front() {
            let running: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].active.is_some()).collect();
            let held: usize = running.iter().map(|&i| self.slots[i].cached.len()).sum();
            let free = (total_cells(&self.settings) as usize).saturating_sub(held);
            if !running.is_empty() && (!self.finished_since_preempt || free < front.feed.len() + 16 * running.len()) {
                break;
            }
            let Some(target) = self.free_slot_for(Some(&front.feed)) else { break };
            let mut a = self.preempted.pop_front().expect("checked above");
            let reused = self.take_slot(target, &a.feed);
            (a.next_prompt, a.attached) = (reused, reused);
            self.logger.debug(&format!(
                "request {} resumes: {} of {} tokens in the cache",
                a.job.request_id,
                reused,
                a.feed.len()
            ));
            self.slots[target].active = Some(a);
        }
        while let Some(target) =
            self.free_slot_for(self.queue.front().filter(|_| self.preempted.is_empty()).map(|j| &j.tokens[..]))
        {
            let mut job = self.queue.pop_front().expect("checked by free_slot_for");
            let feed = std::mem::take(&mut job.tokens);
            let reused = self.take_slot(target, &feed);
            let sampler = TokenSampler::new(&job.sampling, self.model.n_vocab(), job.mask.take());
            let stops = StopMatcher::new(job.sampling.stop.iter().cloned());
            let draft_max = if job.sampling.speculative && self.can_speculate() { self.step.draft_max } else { 0 };
            let spec = Speculator::new(DraftSettings { max: draft_max as usize, ..DraftSettings::DEFAULT });
            self.stats.prompt_tokens_total.fetch_add(feed.len() as u64, Ordering::Relaxed);
            self.stats.cached_tokens_total.fetch_add(reused as u64, Ordering::Relaxed);
            self.slots[target].active = Some(Active {
                next_prompt: reused,
                prompt_len: feed.len(),
                feed,
                cached_prompt: reused,
                attached: reused,
                sampler,
                pending: None,
                drafted: Vec::new(),
                spec,
                batch_idx: None,
                generated: 0,
                utf8: Utf8Stream::default(),
                stops,
                piece: Vec::with_capacity(16),
                started: Instant::now(),
                first_token: None,
                job,
            });
        }
        let busy = self.slots.iter().filter(|s| s.active.is_some()).count();
        self.stats.slots_busy.store(busy as u64, Ordering::Relaxed);
    }

    /// Prepares free slot `target` for a sequence that reads `tokens`; returns how many of them
    /// its cache holds already.
    fn take_slot(&mut self, target: usize, tokens: &[LlamaToken]) -> usize {
        if common_prefix(self.slots[target].prefix(), tokens) < self.slots[target].cached.len() {
            // The part of the target's cache this job does not share is about to go.
            self.save(target);
        }
        let reused = self.reuse_prefix(target, tokens);
        // In a unified cache every other idle cache leaves now (saved first), so later
        // batches do not attend over it and its cells are free for the new work. With saving
        // off, or in streams of their own (which no one else attends over), idle caches stay
        // in place, to be reused or overwritten.
        if self.saved.enabled() && !separate_streams(&self.settings) {
            self.drop_idle(Some(target));
        }
        reused
    }

    /// Whether this model's cache can drop the tail of a sequence, which rejected drafts need
    /// (recurrent state cannot be rolled back).
    fn can_speculate(&self) -> bool {
        !self.model.is_recurrent() && !self.model.is_hybrid()
    }

    /// Fills the batch; returns (generating sequences, other tokens: prompt and drafts) in it.
    fn build_batch(&mut self) -> (usize, usize) {
        self.batch.clear();
        let mut n = 0i32;
        let ctx_per_seq = self.settings.ctx_per_seq as usize;
        let chunk = self.step.prefill_chunk as usize;
        let mut budget = chunk;
        let mut decoding = 0;
        let generating = self
            .slots
            .iter()
            .filter(|s| s.active.as_ref().is_some_and(|a| a.pending.is_some() && !a.reading()))
            .count();
        // Between separate KV streams llama.cpp splits a batch into ubatches holding the same
        // number of tokens of each sequence, so one sequence's draft would run as a forward pass
        // of its own (its fixed cost included): 8-14% slower at 4-8 sequences with drafts on a
        // few per cent of the tokens. There, only a sequence generating alone drafts.
        let threshold = if separate_streams(&self.settings) && generating > 1 {
            f64::INFINITY
        } else {
            self.step
                .draft_threshold
                .unwrap_or_else(|| self.cost.marginal_share(generating).unwrap_or(UNKNOWN_COST_THRESHOLD))
        };
        for slot in self.slots.iter_mut() {
            let Some(a) = slot.active.as_mut() else { continue };
            a.batch_idx = None;
            a.drafted.clear();
            if a.reading() {
                continue;
            }
            if let Some(tok) = a.pending.take() {
                self.batch.add(tok, slot.cached.len() as i32, &[slot.seq], true).expect("batch sized for every slot");
                slot.cached.push(tok);
                a.batch_idx = Some(n);
                n += 1;
                decoding += 1;
                // A draft never asks for more than the request and the context have left: the
                // token sampled from `tok`'s logits is the first of what remains.
                let left = (a.job.max_tokens.saturating_sub(a.generated) as usize).saturating_sub(1);
                let room = left.min(ctx_per_seq.saturating_sub(slot.cached.len() + 1)).min(budget);
                a.drafted = a.spec.draft(&slot.cached, room, threshold);
                for &d in &a.drafted {
                    self.batch.add(d, slot.cached.len() as i32, &[slot.seq], true).expect("drafts fit the chunk");
                    slot.cached.push(d);
                    n += 1;
                }
                budget -= a.drafted.len();
            }
        }
        // Prompt chunks, oldest request first. A prompt that takes more than one chunk to read is
        // paced while others generate (`llmr_sampling::Pacer`); a shorter one joins whole, as
        // before.
        let mut paced = self.pacer.budget(decoding, chunk, self.step.prefill_stall);
        let mut order: Vec<usize> =
            (0..self.slots.len()).filter(|&i| self.slots[i].active.as_ref().is_some_and(Active::reading)).collect();
        order.sort_by_key(|&i| self.slots[i].active.as_ref().map(|a| a.started));
        for i in order {
            if budget == 0 {
                break;
            }
            let slot = &mut self.slots[i];
            let a = slot.active.as_mut().expect("filtered above");
            let long = a.feed.len() - a.attached > chunk;
            let allowed = if long { budget.min(paced) } else { budget };
            if allowed == 0 {
                continue;
            }
            let end = (a.next_prompt + allowed).min(a.feed.len());
            for p in a.next_prompt..end {
                // A preempted sequence reads again without logits: it had sampled already.
                let last = p + 1 == a.feed.len() && a.pending.is_none();
                self.batch
                    .add(a.feed[p], slot.cached.len() as i32, &[slot.seq], last)
                    .expect("batch sized for the chunk");
                slot.cached.push(a.feed[p]);
                if last {
                    a.batch_idx = Some(n);
                }
                n += 1;
            }
            budget -= end - a.next_prompt;
            if long {
                paced -= end - a.next_prompt;
            }
            a.next_prompt = end;
        }
        (decoding, n as usize - decoding)
    }

    fn step_once(&mut self) {
        self.evict_middles();
        let before: Vec<Snapshot> = self
            .slots
            .iter()
            .map(|s| Snapshot {
                cached: s.cached.len(),
                next_prompt: s.active.as_ref().map_or(0, |a| a.next_prompt),
                pending: s.active.as_ref().and_then(|a| a.pending),
            })
            .collect();
        let (decoding, prompt) = self.build_batch();
        if self.batch.n_tokens() == 0 {
            return;
        }
        let started = Instant::now();
        match self.ctx.decode(&mut self.batch) {
            Ok(()) => {
                let ns = started.elapsed().as_nanos() as u64;
                self.pacer.record(decoding, prompt, ns);
                self.cost.record(decoding + prompt, ns);
            }
            Err(DecodeError::NoKvCacheSlot) => {
                self.rollback(&before);
                self.make_room();
                return;
            }
            Err(e) => {
                self.rollback(&before);
                let idx: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].active.is_some()).collect();
                for i in idx {
                    self.fail(i, EngineError::internal(format!("llama_decode failed: {e}")));
                }
                return;
            }
        }
        self.steps += 1;
        self.stats.decode_steps_total.fetch_add(1, Ordering::Relaxed);
        let runs = if separate_streams(&self.settings) {
            let in_batch: Vec<usize> =
                (0..self.slots.len()).filter(|&i| self.slots[i].cached.len() > before[i].cached).collect();
            prefixes::runs(&in_batch)
        } else {
            1
        };
        self.stats.stream_runs_total.fetch_add(runs as u64, Ordering::Relaxed);
        let used: usize = self.slots.iter().map(|s| s.cached.len()).sum();
        self.stats.kv_cells_used.store(used as u64, Ordering::Relaxed);
        // Where a prompt was read to its end, the window layers' state is a checkpoint.
        for (i, snap) in before.iter().enumerate() {
            let read = self.slots[i]
                .active
                .as_ref()
                .is_some_and(|a| snap.next_prompt < a.feed.len() && a.next_prompt == a.feed.len());
            if read {
                self.checkpoint(i);
            }
        }
        for i in 0..self.slots.len() {
            let sample_at = self.slots[i].active.as_ref().and_then(|a| a.batch_idx);
            if let Some(idx) = sample_at {
                self.sample_slot(i, idx);
            }
        }
    }

    /// Whether middle chunks can leave the cache now (a policy asks for it, and llama.cpp can
    /// move this model's positions).
    fn evicts(&self) -> Option<Eviction> {
        self.step.eviction.filter(|_| crate::model::evicts_middle(self.shiftable, self.n_swa, self.settings.swa_full))
    }

    /// Positions slot `i` must keep in place besides its sinks: in one unified cache, a prefix
    /// another sequence shares holds cells of both, whose positions must not move.
    fn shared_prefix(&self, i: usize) -> usize {
        if separate_streams(&self.settings) {
            return 0;
        }
        let own = self.slots[i].prefix();
        let others = self.slots.iter().enumerate().filter(|&(j, _)| j != i);
        others.map(|(_, s)| common_prefix(own, s.prefix())).max().unwrap_or(0)
    }

    /// Each generating sequence whose next token would not fit its context drops a middle chunk
    /// (`settings::Eviction`): llama.cpp removes those positions and moves the later ones down
    /// (rotating their keys on the next decode).
    fn evict_middles(&mut self) {
        let Some(ev) = self.evicts() else { return };
        let ctx_per_seq = self.settings.ctx_per_seq as usize;
        for i in 0..self.slots.len() {
            let slot = &self.slots[i];
            let full =
                slot.active.as_ref().is_some_and(|a| a.pending.is_some()) && slot.cached.len() + 1 >= ctx_per_seq;
            if !full {
                continue;
            }
            let (len, seq) = (slot.cached.len(), slot.seq);
            let shared = self.shared_prefix(i);
            let (keep, drop) = (ev.keep(shared), ev.shed(len, shared));
            if drop == 0 {
                continue;
            }
            let (from, to) = (keep as u32, (keep + drop) as u32);
            let moved = self.ctx.kv_cache_seq_rm(seq, Some(from), Some(to)).is_ok()
                && self.ctx.kv_cache_seq_add(seq, Some(to), None, -(drop as i32)).is_ok();
            if !moved {
                self.fail(i, EngineError::internal("evicting a middle chunk of the KV cache failed"));
                continue;
            }
            let slot = &mut self.slots[i];
            slot.cached.drain(keep..keep + drop);
            slot.moved_from = Some(slot.moved_from.map_or(keep, |m| m.min(keep)));
            slot.evicted += drop;
            self.stats.kv_shifts_total.fetch_add(1, Ordering::Relaxed);
            self.stats.kv_evicted_total.fetch_add(drop as u64, Ordering::Relaxed);
            self.logger.debug(&format!("sequence {seq}: evicted positions {from}..{to} of {len}"));
        }
        self.publish_evicted();
    }

    fn publish_evicted(&self) {
        let evicted: usize = self.slots.iter().filter(|s| s.active.is_some()).map(|s| s.evicted).sum();
        self.stats.kv_evicted.store(evicted as u64, Ordering::Relaxed);
    }

    /// Puts every slot back as it was before a batch that failed to decode.
    fn rollback(&mut self, before: &[Snapshot]) {
        for (slot, snap) in self.slots.iter_mut().zip(before) {
            if slot.cached.len() > snap.cached {
                let _ = self.ctx.kv_cache_seq_rm(slot.seq, Some(snap.cached as u32), None);
                slot.cached.truncate(snap.cached);
            }
            if let Some(a) = slot.active.as_mut() {
                a.next_prompt = snap.next_prompt;
                a.pending = snap.pending;
                a.drafted.clear();
                a.batch_idx = None;
            }
        }
    }

    /// The KV cache is full: save and drop idle caches first, then preempt the sequence that
    /// started last. A lone sequence always fits (the context holds one whole); if one does not,
    /// it ends with `length`.
    fn make_room(&mut self) {
        if self.drop_idle(None) {
            return;
        }
        let running: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].active.is_some()).collect();
        let newest = running.iter().copied().max_by_key(|&i| self.slots[i].active.as_ref().map(|a| a.started));
        match (newest, running.len()) {
            (Some(i), 1) => {
                self.logger.warn("KV cache full with one sequence: ending it with finish_reason length");
                self.finish(i, FinishReason::Length);
            }
            (Some(i), _) => self.preempt(i),
            (None, _) => {}
        }
    }

    /// Sets slot `i`'s sequence aside: what its cache held becomes what it reads when it comes
    /// back (`admit`), and the cache itself is saved to host memory as an idle one is, then
    /// leaves the KV cache.
    fn preempt(&mut self, i: usize) {
        let steps = self.steps;
        let slot = &mut self.slots[i];
        let Some(mut a) = slot.active.take() else { return };
        if !a.reading() {
            a.feed = slot.cached.clone();
        }
        a.next_prompt = 0;
        slot.last_used = steps;
        // What moved over an evicted gap is no one's prefix: only the part before it is saved.
        if let Some(m) = slot.moved_from.take() {
            if self.ctx.kv_cache_seq_rm(slot.seq, Some(m as u32), None).is_ok() {
                slot.cached.truncate(m);
            } else {
                slot.cached.clear();
            }
        }
        slot.evicted = 0;
        self.save(i);
        self.clear_slot(i);
        self.publish_evicted();
        self.finished_since_preempt = false;
        self.stats.preemptions_total.fetch_add(1, Ordering::Relaxed);
        self.logger.info(&format!(
            "KV cache full: request {} preempted after {} tokens; it resumes when there are cells",
            a.job.request_id,
            a.feed.len()
        ));
        let at = self.preempted.partition_point(|p| p.started <= a.started);
        self.preempted.insert(at, a);
        let busy = self.slots.iter().filter(|s| s.active.is_some()).count();
        self.stats.slots_busy.store(busy as u64, Ordering::Relaxed);
    }

    /// Samples the slot's next token from output `idx`, then, while it equals the next draft
    /// token, the token after it from that draft token's output; the first token that differs (or
    /// the one after a wholly taken draft) becomes the pending token, and the drafts not taken
    /// leave the cache.
    fn sample_slot(&mut self, i: usize, idx: i32) {
        let slot = &mut self.slots[i];
        let a = slot.active.as_mut().expect("sampled slots are active");
        let drafted = std::mem::take(&mut a.drafted);
        // Tokens in the cache up to and including the one `idx` belongs to.
        let base = slot.cached.len() - drafted.len();
        let mut kept = 0;
        let end = loop {
            match self.draw(i, idx + kept as i32, base + kept) {
                Drawn::Next(t) if drafted.get(kept) == Some(&t) => kept += 1,
                other => break other,
            }
        };
        if !drafted.is_empty() {
            self.stats.draft_tokens_total.fetch_add(drafted.len() as u64, Ordering::Relaxed);
            self.stats.draft_accepted_total.fetch_add(kept as u64, Ordering::Relaxed);
            let slot = &mut self.slots[i];
            if let Some(a) = slot.active.as_mut() {
                a.spec.record(drafted.len(), kept);
            }
            let keep = base + kept;
            if slot.cached.len() > keep {
                if let Err(e) = self.ctx.kv_cache_seq_rm(slot.seq, Some(keep as u32), None) {
                    return self.fail(i, EngineError::internal(format!("dropping rejected draft tokens failed: {e}")));
                }
                slot.cached.truncate(keep);
            }
        }
        match end {
            Drawn::Next(token) => self.slots[i].active.as_mut().expect("still running").pending = Some(token),
            Drawn::Finish(reason) => self.finish(i, reason),
            Drawn::Failed(e) => self.fail(i, e),
        }
    }

    /// Draws one token from output `idx`, `in_cache` tokens of the sequence being in the cache
    /// before it, and sends it to the requester.
    fn draw(&mut self, i: usize, idx: i32, in_cache: usize) -> Drawn {
        let vocab = self.model.vocab();
        let ctx_per_seq = self.settings.ctx_per_seq as usize;
        // Where the next token would not fit, the sequence ends unless a middle chunk can go.
        let no_room = in_cache + 1 >= ctx_per_seq
            && self.evicts().is_none_or(|ev| ev.shed(in_cache + 1, self.shared_prefix(i)) == 0);
        let slot = &mut self.slots[i];
        let a = slot.active.as_mut().expect("sampled slots are active");
        let token = match a.sampler.sample(&self.ctx, idx, &slot.cached[..in_cache]) {
            Ok(token) => token,
            Err(e) => return Drawn::Failed(EngineError::internal(format!("constrained decoding failed: {e}"))),
        };
        if let Some(spent) = a.sampler.take_mask_time() {
            self.stats.constrained_tokens_total.fetch_add(1, Ordering::Relaxed);
            self.stats.constraint_ns_total.fetch_add(spent.as_nanos() as u64, Ordering::Relaxed);
        }
        let now = Instant::now();
        a.first_token.get_or_insert(now);
        a.generated += 1;
        self.stats.tokens_generated_total.fetch_add(1, Ordering::Relaxed);
        let (logprob, top) = match a.job.sampling.logprobs {
            None => (0.0, Vec::new()),
            Some(n) => {
                let (lp, top) = logprobs(self.ctx.get_logits_ith(idx), token.0 as usize, n as usize);
                let top = top
                    .into_iter()
                    .map(|(id, lp)| {
                        let t = LlamaToken(id as i32);
                        (id as i32, lp, String::from_utf8_lossy(&vocab.token_to_piece(t, false, None)).into_owned())
                    })
                    .collect();
                (lp, top)
            }
        };
        let eog = vocab.is_eog(token) && !a.job.ignore_eos;
        let mut text = String::new();
        let mut finish = None;
        if eog {
            finish = Some(FinishReason::Stop);
        } else {
            a.piece.clear();
            vocab.token_to_piece_into(token, &mut a.piece, a.job.special_text, None);
            let mut decoded = String::new();
            a.utf8.push(&a.piece, &mut decoded);
            text.push_str(a.stops.push(&decoded));
            if a.stops.stopped() {
                finish = Some(FinishReason::Stop);
            } else if a.generated >= a.job.max_tokens || no_room {
                finish = Some(FinishReason::Length);
            }
        }
        if finish.is_some() && !a.stops.stopped() {
            // The last token releases whatever was held back.
            let mut rest = String::new();
            a.utf8.finish(&mut rest);
            text.push_str(a.stops.push(&rest));
            text.push_str(a.stops.finish());
        }
        let event = TokenEvent { id: token.0, text, logprob, top, t_ns: clock_ns() };
        let delivered = a.job.events.send(Event::Token(event)).is_ok();
        match finish {
            Some(reason) => Drawn::Finish(reason),
            None if !delivered => Drawn::Finish(FinishReason::Cancelled),
            None => Drawn::Next(token),
        }
    }

    fn finish(&mut self, i: usize, reason: FinishReason) {
        let steps = self.steps;
        let slot = &mut self.slots[i];
        let Some(a) = slot.active.take() else { return };
        slot.last_used = steps;
        self.finished_since_preempt = true;
        // What moved over an evicted gap is of no use to another request.
        if let Some(m) = slot.moved_from.take() {
            if self.ctx.kv_cache_seq_rm(slot.seq, Some(m as u32), None).is_ok() {
                slot.cached.truncate(m);
            } else {
                let _ = self.ctx.clear_kv_cache_seq(Some(slot.seq as u32), None, None);
                slot.cached.clear();
            }
        }
        slot.evicted = 0;
        self.publish_evicted();
        // Counters first: the requester may read metrics as soon as it gets Done.
        let busy = self.slots.iter().filter(|s| s.active.is_some()).count();
        self.stats.slots_busy.store(busy as u64, Ordering::Relaxed);
        self.report_finish(a, reason);
    }

    /// Sends the end of a sequence that holds no slot any more.
    fn report_finish(&self, a: Active, reason: FinishReason) {
        self.logger.debug(&format!(
            "request {} finished ({reason:?}): {} prompt ({} cached), {} generated",
            a.job.request_id, a.prompt_len, a.cached_prompt, a.generated
        ));
        let counts = (a.prompt_len, a.cached_prompt, a.generated);
        let _ = a.job.events.send(finished(reason, counts, a.stops.matched(), a.started, a.first_token));
    }

    fn fail(&mut self, i: usize, err: EngineError) {
        if let Some(a) = self.slots[i].active.take() {
            let _ = a.job.events.send(Event::Failed(err));
        }
        self.finished_since_preempt = true;
        self.clear_slot(i);
        self.slots[i].evicted = 0;
        self.publish_evicted();
    }
}

fn mib(n: u32) -> usize {
    n as usize * 1024 * 1024
}
