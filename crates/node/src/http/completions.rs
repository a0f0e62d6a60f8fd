//! `POST /v1/completions`: a raw prompt in (no chat template), `text_completion` objects out.

use super::pipeline::{self, Encoder, GenerationRequest};
use super::{parse_json, SharedState};
use crate::generation::{Collected, Finished, Piece, Prompt};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use llmr_engine_host::Capability;
use llmr_openai::{
    new_id, sse as wire, unix_now, ApiError, CompletionPrompt, CompletionRequest, FinishReason, TextChoice,
    TextCompletion, TextLogprobs, Usage,
};
use llmr_telemetry::RequestId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const ENDPOINT: &str = "completions";

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub async fn handle(State(state): State<SharedState>, id: RequestId, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    pipeline::respond(ENDPOINT, &id, async {
        let req = parse_json::<CompletionRequest>(body, state.body_limit)?.validate()?;
        let generation = GenerationRequest {
            endpoint: ENDPOINT,
            model: req.model.clone(),
            sampling: req.sampling.clone(),
            stream: req.stream,
            prompt_param: "prompt",
            constraint_param: req.constraint_param,
            unset: req.unset,
            n: req.n,
            arrived,
        };
        pipeline::generate(&state, &id, generation, |model| {
            model.require(Capability::Text)?;
            let n = req.n as usize;
            // Choice `i` answers prompt `i / n`: its echo is that prompt.
            let echoes: Vec<String> = req
                .prompts
                .iter()
                .flat_map(|p| {
                    let echo = match p {
                        CompletionPrompt::Text(text) if req.echo => text.clone(),
                        _ => String::new(),
                    };
                    std::iter::repeat_n(echo, n)
                })
                .collect();
            let encoder = CompletionEncoder {
                id: new_id("cmpl", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
                model: model.name.clone(),
                created: unix_now(),
                fingerprint: state.fingerprint.clone(),
                include_usage: req.include_usage,
                logprobs: req.sampling.logprobs.is_some(),
                offsets: echoes.iter().map(String::len).collect(),
                echoes,
                n,
            };
            let prompts = req
                .prompts
                .iter()
                .map(|p| match p {
                    CompletionPrompt::Tokens(ids) => Prompt::tokens(ids.clone()),
                    CompletionPrompt::Text(text) => Prompt::raw(text.clone()),
                })
                .collect();
            Ok((prompts, encoder))
        })
        .await
    })
    .await
}

struct CompletionEncoder {
    id: String,
    model: String,
    created: u64,
    fingerprint: String,
    include_usage: bool,
    logprobs: bool,
    /// Each choice's prompt, when the request asked for it back (`echo`).
    echoes: Vec<String>,
    /// Where each choice's next piece starts in its returned text (logprobs' `text_offset`).
    offsets: Vec<usize>,
    /// Choices per prompt.
    n: usize,
}

fn finish_reason(f: &Finished) -> FinishReason {
    if f.stopped {
        FinishReason::Stop
    } else {
        FinishReason::Length
    }
}

fn usage(f: &Finished) -> Usage {
    Usage::new(f.prompt_tokens, f.completion_tokens, f.cached_tokens)
}

impl CompletionEncoder {
    fn body(&self, choices: Vec<TextChoice>, usage: Option<Usage>) -> TextCompletion {
        TextCompletion {
            id: self.id.clone(),
            object: "text_completion".into(),
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: Some(self.fingerprint.clone()),
            choices,
            usage,
        }
    }

    fn chunk(
        &self,
        choice: usize,
        text: String,
        logprobs: Option<TextLogprobs>,
        finish_reason: Option<FinishReason>,
    ) -> String {
        wire::event(&self.body(vec![TextChoice { text, index: choice as u32, logprobs, finish_reason }], None))
    }
}

impl Encoder for CompletionEncoder {
    fn open(&mut self, _prompt_tokens: u32, out: &mut Vec<String>) {
        for choice in 0..self.echoes.len() {
            if !self.echoes[choice].is_empty() {
                let echo = self.echoes[choice].clone();
                out.push(self.chunk(choice, echo, None, None));
            }
        }
    }

    fn piece(&mut self, choice: usize, piece: Piece, out: &mut Vec<String>) {
        let offset = self.offsets[choice];
        let logprobs = piece.logprob.as_ref().map(|l| TextLogprobs::from_tokens(std::slice::from_ref(l), offset));
        self.offsets[choice] += piece.text.len();
        if !piece.text.is_empty() || logprobs.is_some() {
            out.push(self.chunk(choice, piece.text, logprobs, None));
        }
    }

    fn finish(&mut self, choice: usize, finished: Finished, out: &mut Vec<String>) {
        out.push(self.chunk(choice, String::new(), None, Some(finish_reason(&finished))));
    }

    fn end(&mut self, total: Finished, out: &mut Vec<String>) {
        if self.include_usage {
            out.push(wire::event(&self.body(Vec::new(), Some(usage(&total)))));
        }
        out.push(wire::DONE.to_owned());
    }

    fn fail(&mut self, error: &ApiError, out: &mut Vec<String>) {
        out.push(wire::error_event(error));
        out.push(wire::DONE.to_owned());
    }

    fn complete(self, collected: Vec<Collected>) -> Response {
        let finished: Vec<Finished> = collected.iter().map(|c| c.finished).collect();
        let choices = collected
            .into_iter()
            .enumerate()
            .map(|(choice, c)| {
                let echo = &self.echoes[choice];
                TextChoice {
                    logprobs: self.logprobs.then(|| TextLogprobs::from_tokens(&c.logprobs, echo.len())),
                    text: echo.clone() + &c.text,
                    index: choice as u32,
                    finish_reason: Some(finish_reason(&c.finished)),
                }
            })
            .collect();
        Json(self.body(choices, Some(usage(&pipeline::total(&finished, self.n))))).into_response()
    }
}
