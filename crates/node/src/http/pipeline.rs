//! The one request pipeline every generating endpoint runs.
//!
//! validate (the handler, with the `openai` crate) -> model (loaded lazily) -> request metric ->
//! prompts (the endpoint's `prepare`) -> `top_k` and context bounds with the engine's tokenizer ->
//! [`generation::begin`] for each choice (answer cache, or a slot) -> a non-streamed answer, or
//! an SSE stream that waits for every choice's first event before sending headers (so an engine
//! failure is still a plain HTTP error) and then pumps their events, interleaved, until the end.
//!
//! A request has one or more prompts (a completion's list), each answered `n` times: choice `i`
//! is prompt `i / n`, with the seed (when given) moved on by `i % n` so the choices differ.
//!
//! What differs between endpoints is only how the answer is written: an [`Encoder`]. A new
//! endpoint is an encoder and a handler of a few lines.

use super::{sse, SharedState};
use crate::error::NodeError;
use crate::generation::{self, Collected, Finished, GenEvent, Generation, GenerationInput, Piece, Prompt};
use crate::metrics as m;
use crate::models::LoadedModel;
use axum::response::{IntoResponse, Response};
use futures_util::stream::{BoxStream, SelectAll, StreamExt};
use llmr_engine_host::{EngineStatus, Sampling, UnsetSampling};
use llmr_openai::{ApiError, ChatRequest, SamplingBounds};
use llmr_telemetry::RequestId;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

/// How one endpoint writes a generation: as stream events, or as one answer. `choice` is the
/// index of a choice (always 0 where an endpoint has one).
pub trait Encoder: Send + 'static {
    /// Events before the first piece (a role delta, an echoed prompt); `prompt_tokens` is the
    /// (first) prompt's length in tokens.
    fn open(&mut self, prompt_tokens: u32, out: &mut Vec<String>);
    /// Events for one piece of generated text (none while it may still be part of a tool call).
    fn piece(&mut self, choice: usize, piece: Piece, out: &mut Vec<String>);
    /// The last events of one choice: its finish reason.
    fn finish(&mut self, choice: usize, finished: Finished, out: &mut Vec<String>);
    /// After every choice finished: usage, the end marker. `total` adds the choices up.
    fn end(&mut self, total: Finished, out: &mut Vec<String>);
    /// A failure after the stream started, as this endpoint reports one in-stream.
    fn fail(&mut self, error: &ApiError, out: &mut Vec<String>);
    /// The non-streamed answer, one collected generation per choice.
    fn complete(self, collected: Vec<Collected>) -> Response;
}

/// The usage of a request's choices: each prompt's tokens once (its `n` choices share it), every
/// choice's generated tokens; stopped when all stopped (by the one stop sequence of a single
/// choice).
pub fn total(finished: &[Finished], n: usize) -> Finished {
    let n = n.max(1);
    let per_prompt = finished.iter().step_by(n);
    Finished {
        stopped: finished.iter().all(|f| f.stopped),
        stop_index: match finished {
            [one] => one.stop_index,
            _ => None,
        },
        prompt_tokens: per_prompt.clone().map(|f| f.prompt_tokens).sum(),
        completion_tokens: finished.iter().map(|f| f.completion_tokens).sum(),
        cached_tokens: per_prompt.map(|f| f.cached_tokens).sum(),
    }
}

/// What the pipeline needs to know of a validated request.
pub struct GenerationRequest {
    /// The endpoint, for metric labels.
    pub endpoint: &'static str,
    pub model: String,
    pub sampling: Sampling,
    pub stream: bool,
    /// The field a prompt that overflows the context is blamed on (`messages`, `prompt`).
    pub prompt_param: &'static str,
    /// The field `sampling.constraint` came from: an engine that cannot follow the constraint
    /// (none at all, or not this grammar) is a 400 on it.
    pub constraint_param: &'static str,
    /// The sampling settings the request left unset: the model's recommendations fill them.
    pub unset: UnsetSampling,
    /// Choices per prompt.
    pub n: u32,
    pub arrived: Instant,
}

impl GenerationRequest {
    /// What the pipeline needs of a domain chat request (chat completions, Messages, Responses).
    pub fn chat(endpoint: &'static str, req: &ChatRequest, prompt_param: &'static str, arrived: Instant) -> Self {
        GenerationRequest {
            endpoint,
            model: req.model.clone(),
            sampling: req.sampling.clone(),
            stream: req.stream,
            prompt_param,
            constraint_param: req.constraint_param,
            unset: req.unset,
            n: req.n,
            arrived,
        }
    }
}

/// Runs a handler's work and answers. An error is counted by endpoint and status, and logged
/// with the request's id when it is the server's fault.
pub async fn respond(
    endpoint: &'static str,
    id: &RequestId,
    work: impl Future<Output = Result<Response, ApiError>>,
) -> Response {
    match work.await {
        Ok(resp) => resp,
        Err(e) => {
            count_error(endpoint, id, &e);
            e.into_response()
        }
    }
}

pub fn count_error(endpoint: &'static str, id: &RequestId, e: &ApiError) {
    metrics::counter!(m::ERRORS, "endpoint" => endpoint, "status" => e.status.to_string()).increment(1);
    if e.status >= 500 {
        tracing::warn!(request_id = %id, status = e.status, "{}", e.message);
    } else {
        tracing::debug!(request_id = %id, status = e.status, "{}", e.message);
    }
}

/// Names the model and its engine in the request's span.
pub fn record_model(model: &LoadedModel) {
    let span = tracing::Span::current();
    span.record("model", tracing::field::display(&model.name));
    span.record("engine", tracing::field::display(model.engine_id()));
}

/// Generates the answer to `req`. `prepare` turns the loaded model into the prompts (one, or a
/// completion's several) and the encoder (rendering a chat template, checking what the model can
/// do).
pub async fn generate<E, F>(
    state: &SharedState,
    id: &RequestId,
    req: GenerationRequest,
    prepare: F,
) -> Result<Response, ApiError>
where
    E: Encoder,
    F: FnOnce(&Arc<LoadedModel>) -> Result<(Vec<Prompt>, E), ApiError>,
{
    let model = state.models.get(&req.model).await?;
    record_model(&model);
    // Counted once the model is known: request JSON must not create metric series.
    metrics::counter!(m::REQUESTS, "endpoint" => req.endpoint, "model" => model.name.clone()).increment(1);
    let (prompts, encoder) = prepare(&model)?;
    if prompts.is_empty() {
        return Err(ApiError::server("the endpoint prepared no prompt"));
    }
    let info = model.engine.info();
    let mut inputs = Vec::with_capacity(prompts.len() * req.n as usize);
    let mut blame = Blame(None);
    let mut first_prompt_tokens = None;
    let several = prompts.len() > 1;
    for (p, mut prompt) in prompts.into_iter().enumerate() {
        let param = if several { format!("{}[{p}]", req.prompt_param) } else { req.prompt_param.to_owned() };
        let param = param.as_str();
        let mut sampling = req.sampling.clone();
        blame = Blame(sampling.constraint.is_some().then_some(req.constraint_param));
        if let Some((grammar, param)) = prompt.constraint.take() {
            // A forced tool call's grammar (made of the request's tool schemas), or the request's
            // own constraint after a reasoning model's thinking.
            sampling.constraint = Some(grammar);
            blame = Blame(Some(param));
        }
        if blame.0.is_none() && prompt.tokens.is_some() {
            blame = Blame(Some(req.prompt_param));
        }
        if let Some(vocab) = info.vocab_size {
            sampling.check_top_k(vocab)?;
        }
        if let Some(defaults) = &info.sampling_defaults {
            defaults.fill(&mut sampling, req.unset, info.vocab_size);
        }
        if let (Some(ids), Some(vocab)) = (&prompt.tokens, info.vocab_size) {
            check_vocabulary(ids, vocab, param)?;
        }
        let prompt_tokens = generation::count_tokens(&model, &prompt).await?;
        if let Some(context) = info.context_length {
            if model.shifts_context() {
                // The engine makes room by evicting middle chunks: only the prompt must fit.
                Sampling { max_tokens: None, ..sampling.clone() }.check_context(prompt_tokens, context, param)?;
            } else {
                sampling.check_context(prompt_tokens, context, param)?;
            }
        }
        first_prompt_tokens.get_or_insert(prompt_tokens);
        for j in 0..req.n as u64 {
            let mut sampling = sampling.clone();
            // The same seed would give `n` copies of one answer.
            sampling.seed = sampling.seed.map(|s| s.wrapping_add(j));
            inputs.push(GenerationInput {
                prompt: prompt.clone(),
                sampling,
                endpoint: req.endpoint,
                arrived: req.arrived,
            });
        }
    }
    let mut gens = Vec::with_capacity(inputs.len());
    for input in inputs {
        // A failure drops the generations begun before it, which cancels them.
        gens.push(generation::begin(&model, &state.cache, input).await?);
    }
    if req.stream {
        stream(gens, req.n as usize, encoder, first_prompt_tokens.unwrap_or(0), req.endpoint, id.clone(), blame).await
    } else {
        let collected = futures_util::future::try_join_all(gens.into_iter().map(generation::collect))
            .await
            .map_err(|e| blame.error(e))?;
        Ok(encoder.complete(collected))
    }
}

/// Token ids given by the client must be the model's: a 400 naming the first that is not.
pub fn check_vocabulary(ids: &[u32], vocab: u32, param: &str) -> Result<(), ApiError> {
    match ids.iter().position(|&id| id >= vocab) {
        Some(i) => Err(ApiError::invalid(
            &format!("{param}[{i}]"),
            format!("{} is not a token of this model (its vocabulary has {vocab})", ids[i]),
        )),
        None => Ok(()),
    }
}

/// Who answers for an engine's refusal: an UNSUPPORTED engine error on a request with a
/// constraint is the constraint's (the engine has no constrained decoding, or cannot compile this
/// grammar), on one with token ids the prompt's: the client's to fix, so a 400 naming the field.
#[derive(Clone, Copy)]
pub struct Blame(pub Option<&'static str>);

impl Blame {
    pub fn error(self, e: NodeError) -> ApiError {
        match (e, self.0) {
            (NodeError::Engine(c), Some(param)) if c.status == EngineStatus::Unsupported => {
                ApiError::invalid(param, format!("the model's engine cannot take it: {}", c.message))
            }
            (e, _) => e.into(),
        }
    }
}

async fn stream<E: Encoder>(
    gens: Vec<Generation>,
    n: usize,
    mut encoder: E,
    prompt_tokens: u32,
    endpoint: &'static str,
    id: RequestId,
    blame: Blame,
) -> Result<Response, ApiError> {
    let choices = gens.len();
    let mut events: SelectAll<BoxStream<'static, (usize, GenEvent)>> = SelectAll::new();
    for (choice, mut gen) in gens.into_iter().enumerate() {
        let first =
            gen.events.recv().await.ok_or_else(|| ApiError::server("the engine stopped before the first token"))?;
        if let GenEvent::Done(Err(e)) = first {
            return Err(blame.error(e));
        }
        // The stream owns its generation: dropping it (the client left) cancels the engine work.
        let rest = futures_util::stream::unfold(gen, move |mut gen| async move {
            gen.events.recv().await.map(|ev| ((choice, ev), gen))
        });
        events.push(futures_util::stream::once(std::future::ready((choice, first))).chain(rest).boxed());
    }
    let mut out = Vec::new();
    encoder.open(prompt_tokens, &mut out);
    // The body is polled after the handler returned: the pump keeps the request's id and span for
    // what it logs.
    let span = tracing::Span::current();
    let pump = Pump {
        events,
        encoder,
        endpoint,
        id,
        span,
        pending: out.into(),
        finished: vec![None; choices],
        n,
        done: false,
    };
    let body = futures_util::stream::unfold(pump, |mut pump| async move {
        loop {
            if let Some(event) = pump.pending.pop_front() {
                return Some((event, pump));
            }
            if pump.done {
                return None;
            }
            match pump.events.next().await {
                Some((choice, ev)) => pump.on(choice, ev),
                None => return None,
            }
        }
    });
    Ok(sse::response(body))
}

/// A stream's state between events: the choices' generations, the encoder, and encoded events
/// not yet sent.
struct Pump<E> {
    events: SelectAll<BoxStream<'static, (usize, GenEvent)>>,
    encoder: E,
    endpoint: &'static str,
    id: RequestId,
    span: tracing::Span,
    pending: VecDeque<String>,
    /// How each choice finished, once it has.
    finished: Vec<Option<Finished>>,
    /// Choices per prompt.
    n: usize,
    done: bool,
}

impl<E: Encoder> Pump<E> {
    fn on(&mut self, choice: usize, ev: GenEvent) {
        let _span = self.span.clone().entered();
        let mut out = Vec::new();
        match ev {
            GenEvent::Piece(p) => self.encoder.piece(choice, p, &mut out),
            GenEvent::Done(Ok(finished)) => {
                self.encoder.finish(choice, finished, &mut out);
                self.finished[choice] = Some(finished);
                if self.finished.iter().all(Option::is_some) {
                    let all: Vec<Finished> = self.finished.iter().flatten().copied().collect();
                    self.encoder.end(total(&all, self.n), &mut out);
                    self.done = true;
                }
            }
            GenEvent::Done(Err(e)) => {
                let e = ApiError::from(e);
                count_error(self.endpoint, &self.id, &e);
                self.encoder.fail(&e, &mut out);
                self.done = true;
            }
        }
        self.pending.extend(out);
    }
}
