//! One generation, from admission to the last token: runs the engine on a blocking thread and
//! hands its tokens to the async caller through a channel.
//!
//! Cancellation has two paths, both needed: a dropped receiver (the client went away) makes the
//! next token callback return false, which stops decoding at once; dropping the [`Generation`]
//! before the end also calls the engine's `cancel`, which reaches a request still queued inside
//! the engine or in prefill, where no token callback runs yet.

use crate::admission::SlotPermit;
use crate::cache::{CacheKey, CachedGeneration, GenerationCache};
use crate::error::NodeError;
use crate::metrics as m;
use crate::models::LoadedModel;
use crate::thinking_budget::{BudgetWatch, ThinkingBudget};
use llmr_engine_host::{Constraint, FinishReason, InferParams, InferResult, Sampling, TokenLogprob};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// A prompt as the engine receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    pub text: String,
    /// Add the model's BOS token (a raw prompt); a chat template writes its own.
    pub add_bos: bool,
    /// Special tokens written in the text are tokens, not text.
    pub parse_special: bool,
    /// What the answer must be, when rendering the prompt decided it (a forced tool call's
    /// grammar, or the request's constraint after a reasoning model's thinking), and the request
    /// field an engine's refusal of it is blamed on; it replaces the request's
    /// `Sampling::constraint`.
    pub constraint: Option<(Constraint, &'static str)>,
    /// The prompt as token ids, used as given (`text` is then empty).
    pub tokens: Option<Vec<u32>>,
    /// A reasoning model's thinking is cut after this many tokens (`thinking_budget.rs`).
    pub thinking_budget: Option<ThinkingBudget>,
    /// The engine writes the control tokens it generates as their text: the answer is read in a
    /// format made of them (gpt-oss's harmony).
    pub special_text: bool,
}

impl Prompt {
    /// A prompt rendered by a chat template (which writes any BOS itself).
    pub fn rendered(text: String) -> Self {
        Prompt {
            text,
            add_bos: false,
            parse_special: true,
            constraint: None,
            tokens: None,
            thinking_budget: None,
            special_text: false,
        }
    }

    /// A raw prompt, as llama-server takes it: the model's BOS, and special tokens honoured.
    pub fn raw(text: String) -> Self {
        Prompt {
            text,
            add_bos: true,
            parse_special: true,
            constraint: None,
            tokens: None,
            thinking_budget: None,
            special_text: false,
        }
    }

    /// A prompt given as token ids (OpenAI's arrays of integers): the engine reads them as they are.
    pub fn tokens(ids: Vec<u32>) -> Self {
        Prompt {
            text: String::new(),
            add_bos: false,
            parse_special: false,
            constraint: None,
            tokens: Some(ids),
            thinking_budget: None,
            special_text: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Piece {
    pub text: String,
    pub logprob: Option<TokenLogprob>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    /// false: stopped by the length limit (or the context).
    pub stopped: bool,
    /// Stopped by this stop sequence (its index in the request's `stop`), not by the model.
    pub stop_index: Option<u32>,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
}

#[derive(Debug)]
pub enum GenEvent {
    Piece(Piece),
    Done(Result<Finished, NodeError>),
}

/// What to generate from.
pub struct GenerationInput {
    pub prompt: Prompt,
    pub sampling: Sampling,
    /// The endpoint, for metric labels.
    pub endpoint: &'static str,
    pub arrived: Instant,
}

/// A running (or replayed) generation. Dropping it early cancels the engine work; it holds the
/// model, so the engine lives until the generation is dropped.
pub struct Generation {
    pub events: mpsc::UnboundedReceiver<GenEvent>,
    _cancel: Option<CancelOnDrop>,
    _model: Arc<LoadedModel>,
}

struct CancelOnDrop {
    model: Arc<LoadedModel>,
    request_id: u64,
    finished: Arc<AtomicBool>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.finished.load(Ordering::Acquire) {
            self.model.engine.cancel(self.request_id);
        }
    }
}

static NEXT_REQUEST_ID: AtomicU64 = AtomicU64::new(1);

/// Prompt tokens as the engine counts them (for the context check before admission).
pub async fn count_tokens(model: &Arc<LoadedModel>, prompt: &Prompt) -> Result<u32, NodeError> {
    if let Some(ids) = &prompt.tokens {
        return Ok(ids.len() as u32);
    }
    let model = model.clone();
    let prompt = prompt.clone();
    tokio::task::spawn_blocking(move || model.engine.tokenize(&prompt.text, prompt.add_bos, prompt.parse_special))
        .await
        .map_err(|e| NodeError::Internal(format!("tokenizer panicked: {e}")))?
        .map(|t| t.len() as u32)
        .map_err(NodeError::Engine)
}

/// The settings besides the prompt text that decide a greedy output, for the cache key.
fn settings_key(s: &Sampling, prompt: &Prompt) -> String {
    format!(
        "max={:?} top_k={:?} top_p={} min_p={} rep={} pres={} freq={} stop={:?} bos={} special={} constraint={:?} tokens={:?} thinking={:?} special_text={}",
        s.max_tokens,
        s.top_k,
        s.top_p,
        s.min_p,
        s.repeat_penalty,
        s.presence_penalty,
        s.frequency_penalty,
        s.stop,
        prompt.add_bos,
        prompt.parse_special,
        s.constraint,
        prompt.tokens,
        prompt.thinking_budget,
        prompt.special_text
    )
}

/// Starts a request's generation: a temperature-0 request already answered is replayed from the
/// cache (no slot taken); anything else waits for a slot (or is refused when the queue is full)
/// and runs.
pub async fn begin(
    model: &Arc<LoadedModel>,
    cache: &Arc<GenerationCache>,
    input: GenerationInput,
) -> Result<Generation, NodeError> {
    let s = &input.sampling;
    let key = (s.temperature == 0.0 && s.logprobs.is_none() && cache.enabled()).then(|| CacheKey {
        model: model.name.clone(),
        prompt: input.prompt.text.clone(),
        settings: settings_key(s, &input.prompt),
    });
    if let Some(hit) = key.as_ref().and_then(|k| cache.get(k)) {
        metrics::counter!(m::CACHE_HITS, "model" => model.name.clone()).increment(1);
        return Ok(replay(model.clone(), hit));
    }
    let permit = model.admission.admit().await?;
    Ok(start(model.clone(), permit, input, key.map(|k| (cache.clone(), k))))
}

/// Replays a cached answer as if it were generated.
fn replay(model: Arc<LoadedModel>, hit: CachedGeneration) -> Generation {
    let (tx, rx) = mpsc::unbounded_channel();
    for text in hit.pieces {
        let _ = tx.send(GenEvent::Piece(Piece { text, logprob: None }));
    }
    let _ = tx.send(GenEvent::Done(Ok(Finished {
        stopped: hit.finish_stop,
        stop_index: hit.stop_index,
        prompt_tokens: hit.prompt_tokens,
        completion_tokens: hit.completion_tokens,
        cached_tokens: hit.prompt_tokens,
    })));
    Generation { events: rx, _cancel: None, _model: model }
}

/// Starts generating on a blocking thread; the permit is held until the engine returns.
fn start(
    model: Arc<LoadedModel>,
    permit: SlotPermit,
    input: GenerationInput,
    cache: Option<(Arc<GenerationCache>, CacheKey)>,
) -> Generation {
    let (tx, rx) = mpsc::unbounded_channel();
    let request_id = NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed);
    let finished = Arc::new(AtomicBool::new(false));
    let guard = CancelOnDrop { model: model.clone(), request_id, finished: finished.clone() };
    let engine_model = model.clone();
    // The request's span (its id, model, engine), so what is logged on the engine thread is in it.
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || {
        let _span = span.enter();
        let _permit = permit;
        let model = engine_model;
        let GenerationInput { prompt, sampling, endpoint, arrived } = input;
        let ids: Option<Vec<i32>> = prompt.tokens.as_ref().map(|t| t.iter().map(|&id| id as i32).collect());
        let params = InferParams {
            parse_special: prompt.parse_special,
            add_bos: prompt.add_bos,
            prompt_tokens: ids.as_deref(),
            special_text: prompt.special_text,
            ..InferParams::new(request_id, &model.name, &prompt.text, sampling.clone())
        };
        let want_logprobs = params.sampling.logprobs.is_some();
        let labels = [("model", model.name.clone()), ("endpoint", endpoint.to_owned())];
        let mut first: Option<Instant> = None;
        let mut last = arrived;
        let pieces: RefCell<Option<Vec<String>>> = RefCell::new(cache.as_ref().map(|_| Vec::new()));
        let watch = prompt.thinking_budget.clone().filter(|_| ids.is_none()).map(|b| RefCell::new(BudgetWatch::new(b)));
        let mut on_token = |ev: &llmr_engine_host::TokenEvent<'_>| {
            let now = Instant::now();
            match first {
                None => {
                    first = Some(now);
                    let ttft = now.duration_since(arrived).as_secs_f64();
                    metrics::histogram!(m::TTFT, &labels).record(ttft);
                    model.first_token_times.record(ttft);
                }
                Some(_) => metrics::histogram!(m::INTER_TOKEN, &labels).record(now.duration_since(last).as_secs_f64()),
            }
            last = now;
            m::GENERATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let logprob = want_logprobs.then(|| TokenLogprob {
                text: ev.text.to_string(),
                logprob: ev.logprob,
                top: ev.top.iter().map(|t| (t.text.clone(), t.logprob)).collect(),
            });
            let text = ev.text.to_string();
            if let Some(p) = pieces.borrow_mut().as_mut() {
                p.push(text.clone());
            }
            let within_budget = watch.as_ref().is_none_or(|w| w.borrow_mut().push(&text));
            tx.send(GenEvent::Piece(Piece { text, logprob })).is_ok() && within_budget
        };
        let mut result = model.engine.generate(&params, &mut on_token);
        // The thinking budget spent: close the thinking and generate the answer after it.
        if let (Some(cell), Ok(cut)) = (&watch, &result) {
            let watch = cell.borrow();
            let remaining = sampling.max_tokens.map(|m| m.saturating_sub(cut.completion_tokens));
            if watch.cut() && cut.finish_reason == FinishReason::Cancelled && remaining == Some(0) {
                // The budget and `max_tokens` ran out together: cut by length, not cancelled.
                result = Ok(InferResult { finish_reason: FinishReason::Length, ..*cut });
            } else if watch.cut() && cut.finish_reason == FinishReason::Cancelled {
                let budget = watch.budget().clone();
                let closing = budget.closing();
                let continued = format!("{}{}{closing}", prompt.text, watch.text());
                drop(watch);
                // The thinking is closed now: the answer's tokens are not counted.
                cell.borrow_mut().push(&closing);
                if let Some(p) = pieces.borrow_mut().as_mut() {
                    p.push(closing.clone());
                }
                let _ = tx.send(GenEvent::Piece(Piece { text: closing, logprob: None }));
                let mut sampling = sampling.clone();
                sampling.max_tokens = remaining;
                if let Some(c) = budget.answer_constraint {
                    sampling.constraint = Some(c);
                }
                let params = InferParams {
                    parse_special: prompt.parse_special,
                    add_bos: prompt.add_bos,
                    special_text: prompt.special_text,
                    ..InferParams::new(request_id, &model.name, &continued, sampling)
                };
                let thought = *cut;
                result = model.engine.generate(&params, &mut on_token).map(|answer| InferResult {
                    prompt_tokens: thought.prompt_tokens,
                    cached_tokens: thought.cached_tokens,
                    completion_tokens: thought.completion_tokens + answer.completion_tokens,
                    generation_ns: thought.generation_ns + answer.generation_ns,
                    ..answer
                });
            }
        }
        finished.store(true, Ordering::Release);
        let done = match result {
            Ok(r) => {
                metrics::counter!(m::PROMPT_TOKENS, &labels).increment(r.prompt_tokens as u64);
                metrics::counter!(m::GENERATED_TOKENS, &labels).increment(r.completion_tokens as u64);
                metrics::histogram!(m::REQUEST_DURATION, &labels).record(arrived.elapsed().as_secs_f64());
                if r.completion_tokens > 1 && r.generation_ns > 0 {
                    let rate = (r.completion_tokens - 1) as f64 / (r.generation_ns as f64 / 1e9);
                    metrics::histogram!(m::DECODE_RATE, &labels).record(rate);
                }
                let stopped = r.finish_reason == FinishReason::Stop;
                if let (Some((cache, key)), Some(pieces), true) =
                    (cache, pieces.into_inner(), r.finish_reason != FinishReason::Cancelled)
                {
                    cache.put(
                        key,
                        CachedGeneration {
                            pieces,
                            finish_stop: stopped,
                            stop_index: r.stop_index,
                            prompt_tokens: r.prompt_tokens,
                            completion_tokens: r.completion_tokens,
                        },
                    );
                }
                Ok(Finished {
                    stopped,
                    stop_index: r.stop_index,
                    prompt_tokens: r.prompt_tokens,
                    completion_tokens: r.completion_tokens,
                    cached_tokens: r.cached_tokens,
                })
            }
            // Logged with the request's id where it is answered (`pipeline::count_error`).
            Err(e) => Err(NodeError::Engine(e)),
        };
        let _ = tx.send(GenEvent::Done(done));
    });
    Generation { events: rx, _cancel: Some(guard), _model: model }
}

/// The whole generation, collected (non-streaming responses).
pub struct Collected {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    pub finished: Finished,
}

pub async fn collect(mut generation: Generation) -> Result<Collected, NodeError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    while let Some(ev) = generation.events.recv().await {
        match ev {
            GenEvent::Piece(p) => {
                text.push_str(&p.text);
                logprobs.extend(p.logprob);
            }
            GenEvent::Done(done) => return done.map(|finished| Collected { text, logprobs, finished }),
        }
    }
    Err(NodeError::Internal("the engine stopped without finishing the request".into()))
}
