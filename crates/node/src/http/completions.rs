//! `POST /v1/completions`: raw prompt in, text out (no chat template).

use super::{count_error, parse_json, sse, HttpError, SharedState};
use crate::generation::{self, Finished, GenEvent, GenerationInput};
use crate::metrics as m;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use llmr_openai::{
    new_id, sse as wire, unix_now, ApiError, CompletionRequest, TextChoice, TextCompletion, TextLogprobs, Usage,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const ENDPOINT: &str = "completions";

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub async fn handle(State(state): State<SharedState>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    match run(state, body, arrived).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

fn finish_reason(f: &Finished) -> &'static str {
    if f.stopped {
        "stop"
    } else {
        "length"
    }
}

async fn run(state: SharedState, body: Result<Bytes, BytesRejection>, arrived: Instant) -> Result<Response, HttpError> {
    let wire: CompletionRequest = parse_json(body, state.body_limit, ENDPOINT)?;
    let fail = |e: ApiError| count_error(ENDPOINT, e);
    let req = wire.validate().map_err(fail)?;
    let model = state.models.get(&req.model).await.map_err(fail)?;
    // Counted once the model is known: request JSON must not create metric series.
    metrics::counter!(m::REQUESTS, "endpoint" => ENDPOINT, "model" => model.name.clone()).increment(1);
    let info = model.engine.info();
    if !info.text {
        return Err(fail(ApiError::invalid(
            "model",
            format!("`{}` is an embedding model; it cannot complete text", model.name),
        )));
    }
    req.sampling.check_top_k(info.vocab_size).map_err(fail)?;
    // As llama-server does: the model's BOS, and special tokens written in the prompt are honoured.
    let prompt_tokens = generation::count_tokens(&model, &req.prompt, true, true).await.map_err(fail)?;
    req.sampling.check_context(prompt_tokens, info.context_length, "prompt").map_err(fail)?;

    let input = GenerationInput {
        prompt: req.prompt.clone(),
        sampling: req.sampling.clone(),
        add_bos: true,
        parse_special: true,
        endpoint: ENDPOINT,
        arrived,
    };
    let mut gen = generation::begin(&model, &state.cache, input).await.map_err(fail)?;
    let id = new_id("cmpl", NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let created = unix_now();
    let echo = if req.echo { req.prompt.clone() } else { String::new() };
    let want_logprobs = req.sampling.logprobs.is_some();

    if !req.stream {
        let c = generation::collect(gen).await.map_err(fail)?;
        let body = TextCompletion {
            id: &id,
            object: "text_completion",
            created,
            model: &model.name,
            system_fingerprint: &state.fingerprint,
            choices: vec![TextChoice {
                logprobs: want_logprobs.then(|| TextLogprobs::from_tokens(&c.logprobs, echo.len())),
                text: echo + &c.text,
                index: 0,
                finish_reason: Some(finish_reason(&c.finished)),
            }],
            usage: Some(Usage::new(c.finished.prompt_tokens, c.finished.completion_tokens, c.finished.cached_tokens)),
        };
        return Ok(Json(body).into_response());
    }

    let first =
        gen.events.recv().await.ok_or_else(|| fail(ApiError::server("the engine stopped before the first token")))?;
    if let GenEvent::Done(Err(e)) = first {
        return Err(fail(e));
    }
    let fingerprint = state.fingerprint.clone();
    let model_name = model.name.clone();
    let include_usage = req.include_usage;
    let chunk =
        move |text: String, logprobs: Option<TextLogprobs>, finish: Option<&'static str>, usage: Option<Usage>| {
            wire::event(&TextCompletion {
                id: &id,
                object: "text_completion",
                created,
                model: &model_name,
                system_fingerprint: &fingerprint,
                choices: if usage.is_some() && finish.is_none() {
                    Vec::new()
                } else {
                    vec![TextChoice { text, index: 0, logprobs, finish_reason: finish }]
                },
                usage,
            })
        };
    let mut offset = echo.len();
    let mut pending: std::collections::VecDeque<String> = Default::default();
    if !echo.is_empty() {
        pending.push_back(chunk(echo, None, None, None));
    }
    let mut on_event = move |ev: GenEvent, pending: &mut std::collections::VecDeque<String>| -> bool {
        match ev {
            GenEvent::Piece(p) => {
                let lp = p.logprob.as_ref().map(|l| TextLogprobs::from_tokens(std::slice::from_ref(l), offset));
                offset += p.text.len();
                if !p.text.is_empty() || lp.is_some() {
                    pending.push_back(chunk(p.text, lp, None, None));
                }
                false
            }
            GenEvent::Done(Ok(f)) => {
                pending.push_back(chunk(String::new(), None, Some(finish_reason(&f)), None));
                if include_usage {
                    let u = Usage::new(f.prompt_tokens, f.completion_tokens, f.cached_tokens);
                    pending.push_back(chunk(String::new(), None, None, Some(u)));
                }
                pending.push_back(wire::DONE.to_owned());
                true
            }
            GenEvent::Done(Err(e)) => {
                metrics::counter!(m::ERRORS, "endpoint" => ENDPOINT, "status" => e.status.to_string()).increment(1);
                pending.push_back(wire::error_event(&e));
                pending.push_back(wire::DONE.to_owned());
                true
            }
        }
    };
    let done = on_event(first, &mut pending);
    let events = futures_util::stream::unfold(
        (gen, pending, done, on_event, model),
        |(mut gen, mut pending, mut done, mut on_event, model)| async move {
            loop {
                if let Some(e) = pending.pop_front() {
                    return Some((e, (gen, pending, done, on_event, model)));
                }
                if done {
                    return None;
                }
                match gen.events.recv().await {
                    Some(ev) => done = on_event(ev, &mut pending),
                    None => return None,
                }
            }
        },
    );
    Ok(sse::response(events))
}
