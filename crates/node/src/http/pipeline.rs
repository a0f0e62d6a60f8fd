//! The one request pipeline every generating endpoint runs.
//!
//! validate (the handler, with the `openai` crate) -> model (loaded lazily) -> request metric ->
//! prompt (the endpoint's `prepare`) -> `top_k` and context bounds with the engine's tokenizer ->
//! [`generation::begin`] (answer cache, or a slot) -> a non-streamed answer, or an SSE stream
//! that waits for the first event before sending headers (so an engine failure is still a plain
//! HTTP error) and then pumps events until the end.
//!
//! What differs between endpoints is only how the answer is written: an [`Encoder`]. A new
//! endpoint is an encoder and a handler of a few lines.

use super::{sse, SharedState};
use crate::error::NodeError;
use crate::generation::{self, Collected, Finished, GenEvent, Generation, GenerationInput, Piece, Prompt};
use crate::metrics as m;
use crate::models::LoadedModel;
use axum::response::{IntoResponse, Response};
use llmr_engine_host::{EngineStatus, Sampling, UnsetSampling};
use llmr_openai::{ApiError, SamplingBounds};
use llmr_telemetry::RequestId;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

/// How one endpoint writes a generation: as stream events, or as one answer.
pub trait Encoder: Send + 'static {
    /// Events before the first piece (a role delta, an echoed prompt); `prompt_tokens` is the
    /// prompt's length in tokens.
    fn open(&mut self, prompt_tokens: u32, out: &mut Vec<String>);
    /// Events for one piece of generated text (none while it may still be part of a tool call).
    fn piece(&mut self, piece: Piece, out: &mut Vec<String>);
    /// The last events of a finished generation: finish reason, usage, the end marker.
    fn finish(&mut self, finished: Finished, out: &mut Vec<String>);
    /// A failure after the stream started, as this endpoint reports one in-stream.
    fn fail(&mut self, error: &ApiError, out: &mut Vec<String>);
    /// The non-streamed answer.
    fn complete(self, collected: Collected) -> Response;
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
    pub arrived: Instant,
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

/// Generates the answer to `req`. `prepare` turns the loaded model into the prompt and the
/// encoder (rendering a chat template, checking what the model can do).
pub async fn generate<E, F>(
    state: &SharedState,
    id: &RequestId,
    req: GenerationRequest,
    prepare: F,
) -> Result<Response, ApiError>
where
    E: Encoder,
    F: FnOnce(&Arc<LoadedModel>) -> Result<(Prompt, E), ApiError>,
{
    let model = state.models.get(&req.model).await?;
    record_model(&model);
    // Counted once the model is known: request JSON must not create metric series.
    metrics::counter!(m::REQUESTS, "endpoint" => req.endpoint, "model" => model.name.clone()).increment(1);
    let (mut prompt, encoder) = prepare(&model)?;
    let mut sampling = req.sampling;
    let mut blame = Blame(sampling.constraint.is_some().then_some(req.constraint_param));
    if let Some((grammar, param)) = prompt.constraint.take() {
        // A forced tool call's grammar (made of the request's tool schemas), or the request's own
        // constraint after a reasoning model's thinking.
        sampling.constraint = Some(grammar);
        blame = Blame(Some(param));
    }
    if blame.0.is_none() && prompt.tokens.is_some() {
        blame = Blame(Some(req.prompt_param));
    }
    let info = model.engine.info();
    if let Some(vocab) = info.vocab_size {
        sampling.check_top_k(vocab)?;
    }
    if let Some(defaults) = &info.sampling_defaults {
        defaults.fill(&mut sampling, req.unset, info.vocab_size);
    }
    if let (Some(ids), Some(vocab)) = (&prompt.tokens, info.vocab_size) {
        check_vocabulary(ids, vocab, req.prompt_param)?;
    }
    let prompt_tokens = generation::count_tokens(&model, &prompt).await?;
    if let Some(context) = info.context_length {
        sampling.check_context(prompt_tokens, context, req.prompt_param)?;
    }
    let input = GenerationInput { prompt, sampling, endpoint: req.endpoint, arrived: req.arrived };
    let gen = generation::begin(&model, &state.cache, input).await?;
    if req.stream {
        stream(gen, encoder, prompt_tokens, req.endpoint, id.clone(), blame).await
    } else {
        Ok(encoder.complete(generation::collect(gen).await.map_err(|e| blame.error(e))?))
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
    mut gen: Generation,
    mut encoder: E,
    prompt_tokens: u32,
    endpoint: &'static str,
    id: RequestId,
    blame: Blame,
) -> Result<Response, ApiError> {
    let first = gen.events.recv().await.ok_or_else(|| ApiError::server("the engine stopped before the first token"))?;
    if let GenEvent::Done(Err(e)) = first {
        return Err(blame.error(e));
    }
    let mut out = Vec::new();
    encoder.open(prompt_tokens, &mut out);
    // The body is polled after the handler returned: the pump keeps the request's id and span for
    // what it logs.
    let span = tracing::Span::current();
    let mut pump = Pump { gen, encoder, endpoint, id, span, pending: out.into(), done: false };
    pump.on(first);
    let events = futures_util::stream::unfold(pump, |mut pump| async move {
        loop {
            if let Some(event) = pump.pending.pop_front() {
                return Some((event, pump));
            }
            if pump.done {
                return None;
            }
            match pump.gen.events.recv().await {
                Some(ev) => pump.on(ev),
                None => return None,
            }
        }
    });
    Ok(sse::response(events))
}

/// A stream's state between events: the generation, its encoder, and encoded events not yet sent.
struct Pump<E> {
    gen: Generation,
    encoder: E,
    endpoint: &'static str,
    id: RequestId,
    span: tracing::Span,
    pending: VecDeque<String>,
    done: bool,
}

impl<E: Encoder> Pump<E> {
    fn on(&mut self, ev: GenEvent) {
        let _span = self.span.clone().entered();
        let mut out = Vec::new();
        match ev {
            GenEvent::Piece(p) => self.encoder.piece(p, &mut out),
            GenEvent::Done(Ok(finished)) => {
                self.encoder.finish(finished, &mut out);
                self.done = true;
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
