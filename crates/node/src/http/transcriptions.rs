//! `POST /v1/audio/transcriptions` and `/v1/audio/translations`: a multipart upload decoded and
//! resampled to the engine's rate in Rust (no ffmpeg), transcribed by an ASR engine, answered in
//! the format asked for or streamed segment by segment.

use super::audio_error::{audio_error, upload_error};
use super::cancel_guard::CancelOnDrop;
use super::pipeline::{self, record_model};
use super::{sse, SharedState};
use crate::error::NodeError;
use crate::metrics as m;
use crate::models::LoadedModel;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use llmr_engine_host::{Capability, Segment, TranscribeParams};
use llmr_openai::audio::{
    render, Form, HeardSegment, TokenUsage, TranscriptEvent, TranscriptionRequest, TranscriptionWord,
};
use llmr_openai::ApiError;
use llmr_telemetry::RequestId;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;

/// Transcription request ids live in their own range, apart from generations' and embeddings'.
static NEXT_ID: AtomicU64 = AtomicU64::new(1 << 61);
/// Whisper hears 16 kHz mono; uploads at any rate are resampled to it.
const ASR_RATE: u32 = 16_000;

pub async fn transcriptions(
    state: State<SharedState>,
    id: RequestId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(state, id, headers, body, false).await
}

pub async fn translations(
    state: State<SharedState>,
    id: RequestId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    handle(state, id, headers, body, true).await
}

async fn handle(
    State(state): State<SharedState>,
    id: RequestId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
    translate: bool,
) -> Response {
    let endpoint = if translate { "translations" } else { "transcriptions" };
    pipeline::respond(endpoint, &id, async {
        let body = body.map_err(|r| upload_error(r, state.audio.max_upload_bytes))?;
        let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
        let req = TranscriptionRequest::from_form(Form::read(content_type, body).await?, translate)?;
        let model = state.models.get(&req.model).await?;
        record_model(&model);
        metrics::counter!(m::REQUESTS, "endpoint" => endpoint, "model" => model.name.clone()).increment(1);
        model.require(Capability::Asr)?;
        check_model_can(&model, &req)?;
        let limits =
            llmr_audio::DecodeLimits { max_bytes: state.audio.max_upload_bytes, max_seconds: state.audio.max_seconds };
        let file = req.file.clone();
        let pcm = tokio::task::spawn_blocking(move || {
            llmr_audio::decode(&file.bytes, file.name.as_deref(), ASR_RATE, &limits)
        })
        .await
        .map_err(|e| ApiError::server(format!("audio decoding panicked: {e}")))?
        .map_err(|e| audio_error(&e))?;
        let duration = pcm.duration_seconds();
        let permit = model.admission.admit().await?;
        let request_id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        let worker = model.clone();
        let params = Params::of(&req);
        let job = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let p = params.borrowed(request_id, &pcm.samples);
            // A receiver gone (the client left) cancels the engine at its next segment.
            worker.engine.transcribe(&p, &mut |segment| tx.send(segment).is_ok())
        });
        let guard = CancelOnDrop::new(model.clone(), request_id);
        if req.stream {
            return Ok(stream(rx, job, guard, duration));
        }
        let (segments, language) = collect(rx, job, guard).await?;
        let language = language.or(req.language.clone()).unwrap_or_else(|| "en".into());
        let (content_type, body) = render(&req, &segments, &language, duration);
        Ok(([(header::CONTENT_TYPE, content_type)], body).into_response())
    })
    .await
}

/// What the model cannot do is the request's fault (400 on the field), found before decoding.
fn check_model_can(model: &LoadedModel, req: &TranscriptionRequest) -> Result<(), ApiError> {
    let info = model.engine.info();
    if req.translate && info.translates == Some(false) {
        return Err(ApiError::invalid(
            "model",
            format!("`{}` hears English only, so it cannot translate; use /v1/audio/transcriptions", model.name),
        ));
    }
    if let Some(lang) = &req.language {
        if !info.languages.is_empty() && !info.languages.contains(lang) {
            let known = if info.languages.len() <= 5 { info.languages.join(", ") } else { "its own".into() };
            return Err(ApiError::invalid(
                "language",
                format!("`{}` hears {known} languages, not `{lang}`", model.name),
            ));
        }
    }
    Ok(())
}

/// The request's decoding settings, owned, to move onto the engine's thread.
struct Params {
    language: Option<String>,
    prompt: Option<String>,
    temperature: f32,
    translate: bool,
    word_timestamps: bool,
}

impl Params {
    fn of(req: &TranscriptionRequest) -> Self {
        Params {
            language: req.language.clone(),
            prompt: req.prompt.clone(),
            temperature: req.temperature,
            translate: req.translate,
            word_timestamps: req.word_timestamps,
        }
    }

    fn borrowed<'a>(&'a self, request_id: u64, samples: &'a [f32]) -> TranscribeParams<'a> {
        TranscribeParams {
            request_id,
            model_id: "",
            samples,
            sample_rate: ASR_RATE,
            language: self.language.as_deref(),
            prompt: self.prompt.as_deref(),
            temperature: self.temperature,
            translate: self.translate,
            word_timestamps: self.word_timestamps,
            beam_size: 0,
        }
    }
}

type Job = tokio::task::JoinHandle<Result<(), llmr_engine_host::CallError>>;

fn heard(s: Segment) -> HeardSegment {
    let secs = |ms: u64| ms as f64 / 1000.0;
    HeardSegment {
        start: secs(s.start_ms),
        end: secs(s.end_ms),
        words: s
            .words
            .into_iter()
            .map(|w| TranscriptionWord { word: w.text.trim().to_owned(), start: secs(w.start_ms), end: secs(w.end_ms) })
            .collect(),
        text: s.text,
        tokens: s.tokens,
        temperature: s.temperature,
        avg_logprob: s.avg_logprob,
        no_speech_prob: s.no_speech_prob,
    }
}

async fn finish(job: Job, mut guard: CancelOnDrop) -> Result<(), ApiError> {
    let outcome = job.await.map_err(|e| ApiError::server(format!("transcription panicked: {e}")))?;
    guard.disarm();
    outcome.map_err(|e| pipeline::Blame(Some("file")).error(NodeError::Engine(e)))
}

async fn collect(
    mut rx: mpsc::UnboundedReceiver<Segment>,
    job: Job,
    guard: CancelOnDrop,
) -> Result<(Vec<HeardSegment>, Option<String>), ApiError> {
    let mut segments = Vec::new();
    let mut language = None;
    while let Some(s) = rx.recv().await {
        language = language.or(s.language.clone());
        segments.push(heard(s));
    }
    finish(job, guard).await?;
    Ok((segments, language))
}

/// `transcript.text.delta` per segment as it is heard, then `transcript.text.done`.
fn stream(rx: mpsc::UnboundedReceiver<Segment>, job: Job, guard: CancelOnDrop, duration: f64) -> Response {
    let start = (rx, job, guard, String::new(), 0u64);
    let events = futures_util::stream::unfold(Some(start), move |running| async move {
        let (mut rx, job, guard, mut text, mut tokens) = running?;
        match rx.recv().await {
            Some(s) => {
                let delta = if text.is_empty() { s.text.trim_start().to_owned() } else { s.text };
                text.push_str(&delta);
                tokens += s.tokens.len() as u64;
                let event = llmr_openai::sse::event(&TranscriptEvent::Delta { delta });
                Some((event, Some((rx, job, guard, text, tokens))))
            }
            None => {
                let event = match finish(job, guard).await {
                    Ok(()) => llmr_openai::sse::event(&TranscriptEvent::Done {
                        text: text.trim().to_owned(),
                        usage: TokenUsage::new(duration, tokens),
                    }),
                    Err(e) => llmr_openai::sse::error_event(&e),
                };
                Some((event, None))
            }
        }
    });
    sse::response(events)
}
