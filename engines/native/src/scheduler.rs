//! Continuous batching: one worker thread per model owns its KV pool and running sequences.
//!
//! Every step builds one batch from (a) the last sampled token of every generating sequence and
//! (b) prompt tokens of sequences still reading their prompt (at most `prefill_chunk` a step,
//! fewer while others generate: `llmr_sampling::Pacer`), runs one forward pass over it on the
//! model's thread pool, and samples for every sequence whose last prompt token or generated
//! token was in it. New requests join between steps, starting after the longest run of full KV
//! blocks the pool already holds for their prompt (`kv_cache.rs`).
//!
//! When a decode token finds no room and the policy makes none, the sequence that started last
//! is preempted (vLLM's order): its full blocks stay in the prefix index, its draws, text and
//! place are kept, and it comes back before any new request once another sequence ended and
//! the pool has room (or nothing runs), reading again only what the index no longer holds. No
//! answer is cut short for room; only a lone sequence, which the budget always holds, could be.
//!
//! Speculative decoding by prompt lookup (`llmr_sampling::Speculator`, as in the llama.cpp
//! plugin): a generating sequence may feed, after its pending token, a draft copied from its own
//! earlier text. The step samples at each of those positions in order and keeps the draft up to
//! the first token the sampler did not pick; the rest leaves the sequence's table before its
//! blocks are published. Drafts take batch room from the prompt chunk and never ask the pool for
//! room it does not have.
//!
//! Between steps the KV policy (`llmr_kv_policy`, applied by `kv_control.rs`) stores blocks at
//! lower levels, and back up from their f16 copies (`kv_spill.rs`): every `MID_LOOP` (level adjustments), at once when pressure passes the policy's
//! high band or the pool has no room for a step (before any sequence is preempted for room) or,
//! under a dynamic policy, for a waiting prompt's chunk (once a step). A
//! panic in the policy path puts the baseline back (nothing lowered any more; blocks with f16
//! copies come back up) and is counted.

use crate::arch::{BatchToken, Model, Picked, Scratch};
use crate::embed::{EmbedContext, EmbedJob, EmbedRun};
use crate::kv_cache::{BlockTable, KvPool, BLOCK_TOKENS, PARTING_MARGIN};
use crate::kv_control::{self, SeqView};
use crate::settings::{LiveChange, LiveSettings};
use crate::tokenizer::{Detokenizer, ModelTokenizer};
use llmr_constraint::{ConstrainedSampler, TokenMask};
use llmr_engine_sdk::text::StopMatcher;
use llmr_engine_sdk::worker::{cancelled_in_queue, clock_ns, finished, Event, TokenEvent};
use llmr_engine_sdk::{EngineError, ErrorCode, FinishReason, Logger, Sampling};
use llmr_kv_policy::KvPolicy;
use llmr_sampling::{logprobs, DraftSettings, Pacer, Sampler, Speculator, StepCost, UNKNOWN_COST_THRESHOLD};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The policy's level adjustments run this often (spec 002's mid loop); its fast loop (pressure
/// above the high band, no room) runs between any two steps.
const MID_LOOP: Duration = Duration::from_millis(10);

/// What a step's draws left one sequence to send: its tokens, and how it ended if it did.
struct Delivery {
    seq: usize,
    tokens: Vec<TokenEvent>,
    end: Option<Result<FinishReason, EngineError>>,
    /// The length its table goes back to when draft tokens were not kept: the pool, which all
    /// sequences share, cuts it after every sequence has drawn.
    table_len: Option<usize>,
}

/// What every sequence's draws of a step read besides the sequence itself.
struct Draws<'a> {
    tokenizer: &'a ModelTokenizer,
    stats: &'a Stats,
    ctx_per_seq: usize,
}

/// A generation request, tokenized by the caller.
pub struct Job {
    pub request_id: u64,
    pub tokens: Vec<u32>,
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
    /// Embeddings, read one prompt chunk per turn between steps.
    Embed(EmbedJob),
    /// A step setting changed (`set_config`); it applies from the next step.
    Step(LiveChange),
    /// A new KV policy, checked by the caller; it applies from the next pass.
    Policy(KvPolicy),
    Shutdown,
}

/// Counters shared with `metrics`.
#[derive(Default)]
pub struct Stats {
    pub running: AtomicU64,
    /// Running sequences past their prompt (generating).
    pub decoding: AtomicU64,
    pub queued: AtomicU64,
    pub requests_total: AtomicU64,
    pub prompt_tokens_total: AtomicU64,
    pub cached_tokens_total: AtomicU64,
    pub tokens_generated_total: AtomicU64,
    pub decode_steps_total: AtomicU64,
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_total: AtomicU64,
    /// Bytes the cache's blocks hold and the budget they may.
    pub kv_bytes: AtomicU64,
    pub kv_budget_bytes: AtomicU64,
    /// (block, layer) pairs in use at each level, `Level as usize`.
    pub kv_levels: [AtomicU64; 4],
    pub policy_passes_total: AtomicU64,
    pub policy_ns_total: AtomicU64,
    pub policy_blocks_changed_total: AtomicU64,
    /// Blocks the policy stored higher again from their f16 copies.
    pub policy_blocks_promoted_total: AtomicU64,
    /// (block, layer, KV head) reads of evicted blocks attention recalled (`kv_recall.rs`).
    pub kv_recalls_total: AtomicU64,
    /// Panics in the policy path, each followed by the baseline policy.
    pub policy_errors_total: AtomicU64,
    /// Sequences set aside for room (`Scheduler::preempt_newest`).
    pub preemptions_total: AtomicU64,
    /// Tokens drawn under a grammar, and the time their masks took (computing, applying,
    /// following the drawn token).
    pub constrained_tokens_total: AtomicU64,
    pub constraint_ns_total: AtomicU64,
    /// Draft tokens fed for speculative decoding, and those the sampler kept.
    pub draft_tokens_total: AtomicU64,
    pub draft_accepted_total: AtomicU64,
}

/// How a model's worker runs.
#[derive(Clone, Copy, Debug)]
pub struct StepSettings {
    pub slots: usize,
    pub ctx_per_seq: usize,
    /// What `set_config` changes while the model runs.
    pub live: LiveSettings,
}

/// What a step produced for the sequences that sample: logits rows, or (on a model that picks
/// ids where its logits are) an id or the logits for each.
enum StepOutput {
    Logits(Vec<f32>),
    Picked(Vec<Picked>),
}

/// One sequence's share of a [`StepOutput`].
#[derive(Clone, Copy)]
enum Drawn<'a> {
    Logits(&'a [f32]),
    Id(u32),
}

struct Running {
    job: Job,
    table: BlockTable,
    /// Prompt then generated tokens whose KV the table holds or is about to hold.
    tokens: Vec<u32>,
    /// What it reads before it samples: its prompt, or after a preemption every token it had
    /// read (then the token it had sampled follows as a decode token).
    feed: Vec<u32>,
    /// Next token of `feed` to read.
    next_feed: usize,
    prompt_len: usize,
    cached_prompt: usize,
    /// Positions of `feed` the prefix index held when it was (re)admitted.
    attached: usize,
    sampler: Sampler,
    /// A constrained request's draws (its grammar state); `sampler` serves the others.
    constrained: Option<ConstrainedSampler>,
    /// Sampled but not yet fed to the model.
    pending: Option<u32>,
    /// Row of this step's logits this sequence samples from (its drafts' rows follow it).
    logits_row: Option<usize>,
    /// The draft fed this step after the pending token.
    drafted: Vec<u32>,
    spec: Speculator,
    generated: u32,
    detok: Detokenizer,
    stops: StopMatcher,
    started: Instant,
    first_token: Option<Instant>,
    /// The first block the sliding layers may still drop (`KvPool::drop_out_of_window`).
    window_next: usize,
}

impl Running {
    /// Whether it still reads its feed (and samples only from its end).
    fn reading(&self) -> bool {
        self.next_feed < self.feed.len()
    }

    /// Samples this sequence's (index `seq`) next token from row `row` of the step's output,
    /// then, while it equals the next draft token, the token after it from that draft token's
    /// row; the first token that differs (or the one after a wholly kept draft) becomes the
    /// pending token, and the draft tokens not kept leave `tokens` (and, through
    /// `Delivery::table_len`, the table). Nothing is sent yet (`Scheduler::deliver`).
    fn sample<'a>(&mut self, seq: usize, row: usize, drawn: &impl Fn(usize) -> Drawn<'a>, shared: &Draws) -> Delivery {
        let drafted = std::mem::take(&mut self.drafted);
        // Positions in the table up to and including the pending token.
        let base = self.table.len - drafted.len();
        let (mut kept, mut tokens) = (0, Vec::new());
        let end = loop {
            match self.draw(drawn(row + kept), base + kept, shared) {
                Err(e) => break Some(Err(e)),
                Ok((event, token, finish)) => {
                    tokens.push(event);
                    match finish {
                        Some(reason) => break Some(Ok(reason)),
                        None if drafted.get(kept) == Some(&token) => kept += 1,
                        None => {
                            self.pending = Some(token);
                            break None;
                        }
                    }
                }
            }
        };
        let mut table_len = None;
        if !drafted.is_empty() {
            shared.stats.draft_tokens_total.fetch_add(drafted.len() as u64, Ordering::Relaxed);
            shared.stats.draft_accepted_total.fetch_add(kept as u64, Ordering::Relaxed);
            self.spec.record(drafted.len(), kept);
            self.tokens.truncate(base + kept);
            table_len = Some(base + kept);
        }
        Delivery { seq, tokens, end, table_len }
    }

    /// Draws this sequence's token from `drawn`, the first `in_table` of its tokens being before
    /// it: the token's event, the token, and the reason it ends the sequence if it does.
    fn draw(
        &mut self,
        drawn: Drawn,
        in_table: usize,
        shared: &Draws,
    ) -> Result<(TokenEvent, u32, Option<FinishReason>), EngineError> {
        let (tk, stats) = (shared.tokenizer, shared.stats);
        let history = &self.tokens[..in_table];
        let token = match (drawn, self.constrained.as_mut()) {
            // Only sequences the model picked for get an id: greedy or a temperature draw, the
            // draw's random number already taken from their sampler (`step`).
            (Drawn::Id(id), _) => id,
            (Drawn::Logits(logits), None) => self.sampler.sample(logits, history),
            (Drawn::Logits(logits), Some(c)) => {
                let drawn = c.sample(logits, history);
                stats.constrained_tokens_total.fetch_add(1, Ordering::Relaxed);
                stats.constraint_ns_total.fetch_add(c.take_mask_time().as_nanos() as u64, Ordering::Relaxed);
                match drawn {
                    Ok(t) => t,
                    Err(e) => return Err(EngineError::internal(format!("constrained decoding failed: {e}"))),
                }
            }
        };
        self.first_token.get_or_insert_with(Instant::now);
        self.generated += 1;
        stats.tokens_generated_total.fetch_add(1, Ordering::Relaxed);
        let (logprob, top) = match (self.job.sampling.logprobs, drawn) {
            (Some(n), Drawn::Logits(logits)) => {
                let (lp, top) = logprobs(logits, token as usize, n as usize);
                (lp, top.into_iter().map(|(id, lp)| (id as i32, lp, tk.piece(id as u32))).collect())
            }
            _ => (0.0, Vec::new()),
        };
        let end = tk.is_end(token) && !self.job.ignore_eos;
        let mut text = String::new();
        let mut finish = None;
        if end {
            finish = Some(FinishReason::Stop);
        } else {
            let piece = tk.step(&mut self.detok, token);
            text.push_str(self.stops.push(&piece));
            if self.stops.stopped() {
                finish = Some(FinishReason::Stop);
            } else if self.generated >= self.job.max_tokens || in_table + 1 >= shared.ctx_per_seq {
                finish = Some(FinishReason::Length);
            }
        }
        if finish.is_some() && !self.stops.stopped() {
            text.push_str(self.stops.finish());
        }
        Ok((TokenEvent { id: token as i32, text, logprob, top, t_ns: 0 }, token, finish))
    }
}

pub struct Scheduler {
    model: Arc<Model>,
    tokenizer: Arc<ModelTokenizer>,
    vocab: usize,
    pool: KvPool,
    threads: Arc<rayon::ThreadPool>,
    settings: StepSettings,
    running: Vec<Running>,
    /// Preempted sequences, oldest first: they run again before any queued request.
    preempted: VecDeque<Running>,
    /// A sequence ended since the last preemption: only then (or with nothing running) may a
    /// preempted one come back, so that a preemption always lets the others go on.
    ended_since_preempt: bool,
    queue: VecDeque<Job>,
    /// Embedding requests, oldest first; the first advances one chunk per turn.
    embeds: VecDeque<EmbedRun>,
    scratch: Scratch,
    pacer: Pacer,
    /// What a step costs by its number of tokens: whether draft tokens pay.
    cost: StepCost,
    policy: KvPolicy,
    next_pass: Instant,
    /// A pass of the baseline policy (promotion only) failed: no more passes, lest a broken
    /// cache fail every 10 ms.
    promotion_failed: bool,
    stats: Arc<Stats>,
    logger: Logger,
}

impl Scheduler {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: Arc<Model>,
        tokenizer: Arc<ModelTokenizer>,
        vocab: usize,
        pool: KvPool,
        threads: Arc<rayon::ThreadPool>,
        settings: StepSettings,
        policy: KvPolicy,
        stats: Arc<Stats>,
        logger: Logger,
    ) -> Self {
        stats.kv_blocks_total.store(pool.capacity() as u64, Ordering::Relaxed);
        stats.kv_budget_bytes.store(pool.budget() as u64, Ordering::Relaxed);
        pool.track_attention(policy.needs_attention());
        Scheduler {
            model,
            tokenizer,
            vocab,
            pool,
            threads,
            settings,
            running: Vec::new(),
            preempted: VecDeque::new(),
            ended_since_preempt: true,
            queue: VecDeque::new(),
            embeds: VecDeque::new(),
            scratch: Scratch::default(),
            pacer: Pacer::default(),
            cost: StepCost::default(),
            policy,
            next_pass: Instant::now(),
            promotion_failed: false,
            stats,
            logger,
        }
    }

    pub fn run(mut self, commands: Receiver<Command>) {
        loop {
            if self.running.is_empty() && self.preempted.is_empty() && self.queue.is_empty() && self.embeds.is_empty() {
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
            self.admit();
            self.stats.queued.store((self.queue.len() + self.preempted.len()) as u64, Ordering::Relaxed);
            if let Some(run) = self.embeds.front_mut() {
                let mut ctx = EmbedContext {
                    model: &self.model,
                    pool: &mut self.pool,
                    threads: &self.threads,
                    scratch: &mut self.scratch,
                    chunk: self.settings.live.prefill_chunk,
                };
                if run.advance(&mut ctx) {
                    self.embeds.pop_front();
                }
            }
            if !self.running.is_empty() {
                self.step();
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
            Command::Embed(job) => {
                self.embeds.push_back(EmbedRun::new(job));
                true
            }
            Command::Step(change) => {
                self.settings.live.apply(change);
                true
            }
            Command::Policy(policy) => {
                self.pool.track_attention(policy.needs_attention());
                self.policy = policy;
                self.next_pass = Instant::now();
                true
            }
            Command::Shutdown => {
                for mut run in self.embeds.drain(..) {
                    run.abandon(&mut self.pool, EngineError::cancelled());
                }
                for job in self.queue.drain(..) {
                    let _ = job.events.send(Event::Failed(EngineError::cancelled()));
                }
                while !self.running.is_empty() {
                    self.finish(0, FinishReason::Cancelled);
                }
                for r in std::mem::take(&mut self.preempted) {
                    self.report_finish(r, FinishReason::Cancelled);
                }
                false
            }
        }
    }

    fn drop_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].job.cancel.load(Ordering::SeqCst) {
                self.finish(i, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
        let cancel = |job: &Job| job.cancel.load(Ordering::SeqCst);
        let (preempted, kept): (VecDeque<Running>, _) =
            std::mem::take(&mut self.preempted).into_iter().partition(|r| cancel(&r.job));
        self.preempted = kept;
        let (queued, kept): (VecDeque<Job>, _) = std::mem::take(&mut self.queue).into_iter().partition(cancel);
        self.queue = kept;
        // Counters first: the requester may read metrics as soon as it gets its end.
        self.stats.queued.store((self.queue.len() + self.preempted.len()) as u64, Ordering::Relaxed);
        for r in preempted {
            self.report_finish(r, FinishReason::Cancelled);
        }
        for job in queued {
            let _ = job.events.send(cancelled_in_queue(job.tokens.len()));
        }
    }

    fn admit(&mut self) {
        // Preempted sequences come back first, oldest first: when nothing runs, or once a
        // sequence ended and the pool can hold what they had and a block more for every running
        // sequence (with less, the next full block would preempt them again). New requests wait
        // behind them.
        while self.running.len() < self.settings.slots {
            let Some(r) = self.preempted.front() else { break };
            let need = r.feed.len().div_ceil(BLOCK_TOKENS) + 1 + self.running.len();
            if !self.running.is_empty() && (!self.ended_since_preempt || self.pool.available() < need) {
                break;
            }
            let mut r = self.preempted.pop_front().expect("checked");
            let reused = self.pool.attach_prefix(&mut r.table, &r.feed);
            r.tokens = r.feed[..reused].to_vec();
            (r.next_feed, r.attached) = (reused, reused);
            self.logger.debug(&format!(
                "request {} resumes: {} of {} positions from the prefix index",
                r.job.request_id,
                reused,
                r.feed.len()
            ));
            self.running.push(r);
        }
        while self.preempted.is_empty() && self.running.len() < self.settings.slots {
            let Some(mut job) = self.queue.pop_front() else { break };
            let mut table = BlockTable::default();
            let feed = std::mem::take(&mut job.tokens);
            let reused = self.pool.attach_prefix(&mut table, &feed);
            self.stats.prompt_tokens_total.fetch_add(feed.len() as u64, Ordering::Relaxed);
            self.stats.cached_tokens_total.fetch_add(reused as u64, Ordering::Relaxed);
            let draft_max = if job.sampling.speculative { self.settings.live.draft_max } else { 0 };
            self.running.push(Running {
                sampler: Sampler::new(&job.sampling, self.vocab),
                constrained: job.mask.take().map(|m| ConstrainedSampler::new(m, &job.sampling, self.vocab)),
                stops: StopMatcher::new(job.sampling.stop.iter().cloned()),
                tokens: feed[..reused].to_vec(),
                table,
                prompt_len: feed.len(),
                feed,
                next_feed: reused,
                cached_prompt: reused,
                attached: reused,
                pending: None,
                logits_row: None,
                drafted: Vec::new(),
                spec: Speculator::new(DraftSettings { max: draft_max, ..DraftSettings::DEFAULT }),
                generated: 0,
                detok: self.tokenizer.decoder(job.special_text),
                started: Instant::now(),
                first_token: None,
                window_next: 0,
                job,
            });
        }
        self.stats.running.store(self.running.len() as u64, Ordering::Relaxed);
    }

    /// Builds the step's batch; returns it with how many of its tokens are decode tokens.
    fn build_batch(&mut self) -> (Vec<BatchToken>, usize) {
        // Room for every decode token first; when the pool is full and the policy makes none,
        // the newest sequence is preempted and the others are checked again.
        'room: loop {
            for i in 0..self.running.len() {
                let r = &mut self.running[i];
                if r.pending.is_some() && !r.reading() && self.pool.reserve(&mut r.table, 1).is_err() {
                    if !self.control(Some(1)) {
                        self.preempt_newest();
                    }
                    continue 'room;
                }
            }
            break;
        }
        let mut batch = Vec::new();
        let chunk = self.settings.live.prefill_chunk;
        let mut budget = chunk;
        let generating = self.running.iter().filter(|r| r.pending.is_some() && !r.reading()).count();
        let threshold = self
            .settings
            .live
            .draft_threshold
            .unwrap_or_else(|| self.cost.marginal_share(generating).unwrap_or(UNKNOWN_COST_THRESHOLD));
        let mut decoding = 0;
        for (s, r) in self.running.iter_mut().enumerate() {
            r.logits_row = None;
            r.drafted.clear();
            if r.reading() {
                continue;
            }
            if let Some(tok) = r.pending.take() {
                batch.push(BatchToken { token: tok, seq: s, pos: r.table.len, logits: true });
                r.tokens.push(tok);
                r.table.len += 1;
                decoding += 1;
                // A draft never asks for more than the request and the context have left (the
                // token sampled from `tok`'s logits is the first of what remains), nor for blocks
                // the pool does not have free.
                let left = (r.job.max_tokens.saturating_sub(r.generated) as usize).saturating_sub(1);
                let room = left.min(self.settings.ctx_per_seq.saturating_sub(r.table.len + 1)).min(budget);
                let mut draft = r.spec.draft(&r.tokens, room, threshold);
                if !draft.is_empty() && self.pool.reserve(&mut r.table, draft.len()).is_err() {
                    draft.clear();
                }
                for &d in &draft {
                    batch.push(BatchToken { token: d, seq: s, pos: r.table.len, logits: true });
                    r.tokens.push(d);
                    r.table.len += 1;
                }
                budget -= draft.len();
                r.drafted = draft;
            }
        }
        // Prompt chunks, oldest request first; a long prompt is paced while others generate.
        let mut paced = self.pacer.budget(decoding, chunk, self.settings.live.prefill_stall);
        let mut order: Vec<usize> = (0..self.running.len()).filter(|&s| self.running[s].reading()).collect();
        order.sort_by_key(|&s| self.running[s].started);
        // A dynamic policy may make room for a waiting prompt as it does for a decode token
        // (lowering the least important blocks to its floor), once a step: otherwise a prompt
        // that finds the budget full waits for whole sequences to finish, and the budget serves
        // fewer sequences at once than the policy could hold.
        let mut may_ask = self.policy.emergency_floor().is_some();
        for s in order {
            if budget == 0 {
                break;
            }
            let r = &self.running[s];
            let long = r.feed.len() - r.attached > chunk;
            let allowed = if long { budget.min(paced) } else { budget };
            if allowed == 0 {
                continue;
            }
            let (start, mut end) = (r.next_feed, (r.next_feed + allowed).min(r.feed.len()));
            let mut n = end - start;
            let mut room = self.reserve_chunk(s, n);
            if !room && std::mem::take(&mut may_ask) && self.control(Some(n.div_ceil(BLOCK_TOKENS) + 1)) {
                room = self.reserve_chunk(s, n);
            }
            // A lone sequence's chunk may be larger than the budget was sized for at load
            // (`prefill_chunk` raised since, sliding layers budgeted for one chunk beside their
            // windows): nothing finishing will make room, so it reads in halves until one fits.
            while !room && self.running.len() == 1 && n > BLOCK_TOKENS {
                (n, end) = (n / 2, start + n / 2);
                room = self.reserve_chunk(s, n);
            }
            if !room {
                // No room for this prompt now: it waits for sequences to finish (generating
                // sequences keep the room they need), or for the policy to make some.
                continue;
            }
            let r = &mut self.running[s];
            for p in r.next_feed..end {
                // A preempted sequence reads again without logits: it had sampled already.
                let last = p + 1 == r.feed.len() && r.pending.is_none();
                batch.push(BatchToken { token: r.feed[p], seq: s, pos: r.table.len, logits: last });
                r.tokens.push(r.feed[p]);
                r.table.len += 1;
            }
            r.next_feed = end;
            budget -= n;
            if long {
                paced = paced.saturating_sub(n);
            }
        }
        (batch, decoding)
    }

    fn step(&mut self) {
        let (batch, decoding) = self.build_batch();
        if batch.is_empty() {
            // Every running prompt waits for room: the policy makes some if it can, or else
            // the newest steps aside. The pool's budget holds at least one full f16 context, so
            // the oldest always goes on.
            if !self.running.is_empty()
                && !self.control(Some(self.settings.live.prefill_chunk.div_ceil(BLOCK_TOKENS) + 1))
            {
                self.preempt_newest();
            }
            return;
        }
        // Which row of the logits each sampling sequence reads first (its drafts' rows follow).
        let mut row = 0;
        for b in &batch {
            if b.logits {
                self.running[b.seq].logits_row.get_or_insert(row);
                row += 1;
            }
        }
        // A model that picks ids where its logits are (on a GPU) picks them for the sequences
        // that let it (greedy or a temperature draw; no top-k, penalties, grammar or logprobs):
        // the host reads their ids, and the logits of the others only.
        let picks = self.model.picks_on_device().map(|draws| {
            let mut picks = vec![None; row];
            for r in self.running.iter_mut() {
                if let Some(at) = r.logits_row {
                    // A draft is checked against draws in order: the host draws for it.
                    if r.constrained.is_none() && r.job.sampling.logprobs.is_none() && r.drafted.is_empty() {
                        picks[at] = r.sampler.device_pick(draws);
                    }
                }
            }
            picks
        });
        let picks = picks.filter(|p| p.iter().any(Option::is_some));
        let started = Instant::now();
        let tables: Vec<&BlockTable> = self.running.iter().map(|r| &r.table).collect();
        let (model, pool, scratch) = (&self.model, &mut self.pool, &mut self.scratch);
        let out = self.threads.install(|| match picks.and_then(|p| model.pick(&tables, &batch, &p)) {
            Some(picked) => picked.map(StepOutput::Picked),
            None => model.forward(pool, &tables, &batch, scratch).map(StepOutput::Logits),
        });
        let out = match out {
            Ok(out) => out,
            Err(e) => return self.fail_running(&e.to_string()),
        };
        let elapsed = started.elapsed().as_nanos() as u64;
        self.pacer.record(decoding, batch.len() - decoding, elapsed);
        // What a draft token costs is what a token with logits costs: steps with prompt tokens
        // (most without logits) would teach a cheaper slope, and on a model with a large
        // output layer (Gemma 3's 262k entries) drafts would then be fed at a loss.
        if row == batch.len() {
            self.cost.record(batch.len(), elapsed);
        }
        self.stats.decode_steps_total.fetch_add(1, Ordering::Relaxed);
        // Draws first, so that rejected drafts leave the tables before their blocks are
        // published; tokens are sent last, so that a requester reading metrics when its
        // answer ends sees this step's policy pass.
        let (vocab, out_ref) = (self.vocab, &out);
        let drawn = |row: usize| match out_ref {
            StepOutput::Logits(logits) => Drawn::Logits(&logits[row * vocab..(row + 1) * vocab]),
            StepOutput::Picked(rows) => match &rows[row] {
                Picked::Id(id) => Drawn::Id(*id),
                Picked::Logits(logits) => Drawn::Logits(logits),
            },
        };
        let shared = Draws { tokenizer: &self.tokenizer, stats: &self.stats, ctx_per_seq: self.settings.ctx_per_seq };
        let sampling: Vec<(usize, usize, &mut Running)> =
            self.running.iter_mut().enumerate().filter_map(|(i, r)| Some((i, r.logits_row?, r))).collect();
        // Each sequence draws from its own rows with its own state, so they draw at once on the
        // model's threads, which would otherwise wait: a grammar's mask over Gemma 3's 262,144
        // tokens takes 0.4-0.6 ms, a temperature draw 0.14 ms, log-probabilities 0.2 ms.
        let deliveries: Vec<Delivery> = if sampling.len() >= 2 {
            use rayon::prelude::*;
            self.threads
                .install(|| sampling.into_par_iter().map(|(i, row, r)| r.sample(i, row, &drawn, &shared)).collect())
        } else {
            sampling.into_iter().map(|(i, row, r)| r.sample(i, row, &drawn, &shared)).collect()
        };
        for d in &deliveries {
            if let Some(len) = d.table_len {
                self.pool.truncate(&mut self.running[d.seq].table, len);
            }
        }
        if let StepOutput::Logits(logits) = out {
            self.scratch.logits = logits;
        }
        let window = self.pool.window();
        for r in self.running.iter_mut() {
            self.pool.publish(&mut r.table, &r.tokens);
            // Sliding layers hold each sequence's window, and the windows before its prompt's
            // last positions, where a later request may part from it.
            let prompt = r.prompt_len;
            let keep = prompt.saturating_sub(window + PARTING_MARGIN)..prompt;
            r.window_next = self.pool.drop_out_of_window(&r.table, keep, r.window_next);
        }
        self.control(None);
        self.publish_kv_stats();
        // Highest index first: an ended sequence's place in `running` goes to the last one.
        for d in deliveries.into_iter().rev() {
            self.deliver(d);
        }
    }

    /// Sends a sequence's tokens of this step; ends it if its draws did, or if its requester
    /// is gone.
    fn deliver(&mut self, d: Delivery) {
        let events = &self.running[d.seq].job.events;
        let mut delivered = true;
        for mut token in d.tokens {
            token.t_ns = clock_ns();
            delivered &= events.send(Event::Token(token)).is_ok();
        }
        match d.end {
            Some(Ok(reason)) => self.finish(d.seq, reason),
            Some(Err(e)) => self.fail(d.seq, e),
            None if !delivered => self.finish(d.seq, FinishReason::Cancelled),
            None => {}
        }
    }

    /// Makes room in running sequence `s`'s table for a prompt chunk of `n` positions, on the
    /// engine's threads: a chunk's new blocks have their storage zeroed in parallel.
    fn reserve_chunk(&mut self, s: usize, n: usize) -> bool {
        let (threads, pool, table) = (&self.threads, &mut self.pool, &mut self.running[s].table);
        threads.install(|| pool.reserve(table, n)).is_ok()
    }

    /// Runs a policy pass when one is due, or at once when the next step needs `room` blocks
    /// the pool does not have (the pass then goes down to the policy's emergency floor). Returns
    /// whether it gave bytes back.
    fn control(&mut self, room: Option<usize>) -> bool {
        let now = Instant::now();
        let urgent = room.is_some() || self.pool.pressure() > self.policy.pressure.high;
        if !urgent && now < self.next_pass {
            return false;
        }
        self.next_pass = now + MID_LOOP;
        // The baseline lowers nothing: it runs passes only while a running sequence holds a
        // block stored lower that its f16 copy can bring back up (checked at the passes'
        // cadence, not every step). Idle blocks of the prefix cache keep their copies until
        // reused, so the spill tier alone does not say so.
        if !self.policy.is_active() && (self.promotion_failed || !self.running_can_promote()) {
            return false;
        }
        let seqs: Vec<SeqView> = self.running.iter().map(|r| SeqView { table: &r.table, tokens: &r.tokens }).collect();
        let (policy, pool, control) = (&self.policy, &mut self.pool, &self.tokenizer.control_ids);
        let ctx = self.settings.ctx_per_seq;
        let need = room.unwrap_or(0) * pool.shape().block_bytes();
        let pass = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.threads.install(|| kv_control::apply(policy, pool, &seqs, ctx, &|t| control.contains(&t), need))
        }));
        let s = &self.stats;
        s.policy_passes_total.fetch_add(1, Ordering::Relaxed);
        s.policy_ns_total.fetch_add(now.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match pass {
            Ok(report) => {
                s.policy_blocks_changed_total.fetch_add(report.changed as u64, Ordering::Relaxed);
                s.policy_blocks_promoted_total.fetch_add(report.promoted as u64, Ordering::Relaxed);
                report.bytes_after < report.bytes_before
            }
            Err(_) => {
                s.policy_errors_total.fetch_add(1, Ordering::Relaxed);
                self.promotion_failed |= !self.policy.is_active();
                self.logger.error("the KV policy failed: back to the baseline (nothing lowered; f16 copies come back)");
                self.policy = KvPolicy::baseline();
                self.pool.track_attention(false);
                false
            }
        }
    }

    /// Whether a running sequence holds a block stored lower with its f16 copy.
    fn running_can_promote(&self) -> bool {
        self.pool.spilled() > 0
            && self.running.iter().any(|r| (0..r.table.blocks.len()).any(|i| self.pool.restorable(&r.table, i)))
    }

    /// The cache's figures for `metrics`: blocks and bytes in use, and the level counts when
    /// the blocks in use changed (counting them walks every block).
    fn publish_kv_stats(&mut self) {
        let s = &self.stats;
        let decoding = self.running.iter().filter(|r| !r.reading()).count();
        s.decoding.store(decoding as u64, Ordering::Relaxed);
        s.kv_recalls_total.store(self.pool.recalls(), Ordering::Relaxed);
        let used = self.pool.used() as u64;
        let bytes = self.pool.held_bytes() as u64;
        let changed = (s.kv_blocks_used.swap(used, Ordering::Relaxed) != used) as u8
            | (s.kv_bytes.swap(bytes, Ordering::Relaxed) != bytes) as u8;
        if changed != 0 {
            for (stat, n) in s.kv_levels.iter().zip(self.pool.level_counts()) {
                stat.store(n as u64, Ordering::Relaxed);
            }
        }
    }

    /// Makes room by preempting the sequence that started last, so that the oldest requests
    /// finish first: its full blocks stay in the prefix index (taken back for room only as
    /// needed), and it waits in `preempted` with its draws and text. A lone sequence always
    /// fits the budget; if one does not, it ends (finish_reason `length`).
    fn preempt_newest(&mut self) {
        let Some(newest) = (0..self.running.len()).max_by_key(|&j| self.running[j].started) else { return };
        if self.running.len() == 1 {
            self.logger.warn("KV cache full with one sequence: ending it with finish_reason length");
            return self.finish(newest, FinishReason::Length);
        }
        let mut r = self.running.swap_remove(newest);
        self.pool.publish(&mut r.table, &r.tokens);
        self.pool.free_table_keeping_tail(&mut r.table, &r.tokens);
        self.ended_since_preempt = false;
        if r.reading() {
            r.tokens.clear();
        } else {
            r.feed = std::mem::take(&mut r.tokens);
        }
        (r.next_feed, r.window_next) = (0, 0);
        self.stats.preemptions_total.fetch_add(1, Ordering::Relaxed);
        self.logger.info(&format!(
            "KV cache full: request {} preempted after {} positions; it resumes when there is room",
            r.job.request_id,
            r.feed.len()
        ));
        let at = self.preempted.partition_point(|p| p.started <= r.started);
        self.preempted.insert(at, r);
        self.stats.running.store(self.running.len() as u64, Ordering::Relaxed);
        self.publish_kv_stats();
    }

    /// Ends every running sequence with an error (a forward pass failed: a GPU error); the
    /// scheduler stays up for the next requests.
    fn fail_running(&mut self, error: &str) {
        self.logger.error(&format!("forward pass failed: {error}"));
        for mut r in self.running.drain(..) {
            self.pool.free_table(&mut r.table);
            let e = EngineError::new(ErrorCode::Internal, format!("the forward pass failed: {error}"));
            let _ = r.job.events.send(Event::Failed(e));
        }
        self.stats.running.store(0, Ordering::Relaxed);
        self.publish_kv_stats();
    }

    /// Ends sequence `i` with an error.
    fn fail(&mut self, i: usize, error: EngineError) {
        let mut r = self.running.swap_remove(i);
        self.pool.free_table(&mut r.table);
        self.ended_since_preempt = true;
        self.stats.running.store(self.running.len() as u64, Ordering::Relaxed);
        self.publish_kv_stats();
        self.logger.warn(&format!("request {} failed: {}", r.job.request_id, error.message));
        let _ = r.job.events.send(Event::Failed(error));
    }

    fn finish(&mut self, i: usize, reason: FinishReason) {
        let mut r = self.running.swap_remove(i);
        // The next turn of a chat continues these tokens: their last, partial block waits for it.
        self.pool.free_table_keeping_tail(&mut r.table, &r.tokens);
        self.ended_since_preempt = true;
        self.stats.running.store(self.running.len() as u64, Ordering::Relaxed);
        self.publish_kv_stats();
        self.report_finish(r, reason);
    }

    /// Sends the end of a sequence that holds no blocks any more.
    fn report_finish(&self, r: Running, reason: FinishReason) {
        self.logger.debug(&format!(
            "request {} finished ({reason:?}): {} prompt ({} cached), {} generated",
            r.job.request_id, r.prompt_len, r.cached_prompt, r.generated
        ));
        let counts = (r.prompt_len, r.cached_prompt, r.generated);
        let _ = r.job.events.send(finished(reason, counts, r.stops.matched(), r.started, r.first_token));
    }
}
