//! `POST /v1/audio/speech`: text spoken by a TTS engine, encoded as it is synthesized and
//! streamed, as raw audio in the asked format or as SSE events carrying it in base64.

use super::audio_error::audio_error;
use super::cancel_guard::CancelOnDrop;
use super::pipeline::{self, record_model};
use super::{sse, SharedState};
use crate::error::NodeError;
use crate::metrics as m;
use crate::models::LoadedModel;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use llmr_audio::{OutputFormat, StreamEncoder};
use llmr_engine_host::{Capability, SynthesizeParams};
use llmr_openai::audio::{SpeechEvent, SpeechRequest, SpeechUsage, StreamFormat};
use llmr_openai::ApiError;
use llmr_telemetry::RequestId;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;

const ENDPOINT: &str = "speech";
/// Speech request ids live in their own range.
static NEXT_ID: AtomicU64 = AtomicU64::new(1 << 60);
/// OpenAI's voice names. Clients send one (the SDK requires it); a model with voices of its own
/// speaks them in its default voice, any other unknown name is refused.
const OPENAI_VOICES: &[&str] =
    &["alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer", "verse"];

/// What the synthesis thread sends: a chunk of samples at a rate, or how it ended.
enum Chunk {
    Audio(Vec<f32>, u32),
    Done(Result<(), llmr_engine_host::CallError>),
}

pub async fn handle(State(state): State<SharedState>, id: RequestId, body: Result<Bytes, BytesRejection>) -> Response {
    pipeline::respond(ENDPOINT, &id, async {
        let body = body.map_err(|r| ApiError::bad_request(format!("could not read the request body: {r}")))?;
        let req = SpeechRequest::parse(&body, state.audio.max_speech_chars)?;
        let format: OutputFormat = req.response_format.parse().map_err(|e| audio_error(&e))?;
        if !format.is_supported() {
            return Err(audio_error(&llmr_audio::AudioError::UnsupportedOutput(req.response_format.clone())));
        }
        let model = state.models.get(&req.model).await?;
        record_model(&model);
        metrics::counter!(m::REQUESTS, "endpoint" => ENDPOINT, "model" => model.name.clone()).increment(1);
        model.require(Capability::Tts)?;
        let voice = voice(&model, req.voice.as_deref())?;
        let permit = model.admission.admit().await?;
        let request_id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let worker = model.clone();
        let (text, speed) = (req.input.clone(), req.speed);
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let params = SynthesizeParams { request_id, model_id: "", text: &text, voice: voice.as_deref(), speed };
            let outcome = worker
                .engine
                .synthesize(&params, &mut |samples, rate| tx.send(Chunk::Audio(samples.to_vec(), rate)).is_ok());
            let _ = tx.send(Chunk::Done(outcome));
        });
        let guard = CancelOnDrop::new(model.clone(), request_id);
        // The status is decided by the first chunk: an engine that fails before speaking gets
        // its error answered properly; after that the audio is already on its way.
        let (first, rate) = match rx.recv().await {
            Some(Chunk::Audio(samples, rate)) => (samples, rate),
            Some(Chunk::Done(Err(e))) => return Err(pipeline::Blame(Some("input")).error(NodeError::Engine(e))),
            Some(Chunk::Done(Ok(()))) | None => {
                return Err(ApiError::server("the engine finished without producing audio"))
            }
        };
        let encoder = StreamEncoder::new(format, rate).map_err(|e| audio_error(&e))?;
        let chars = req.input.chars().count() as u64;
        let audio = Encoded { rx, encoder: Some(encoder), pending: Some(first), guard };
        Ok(match req.stream_format {
            StreamFormat::Audio => raw_response(format, audio),
            StreamFormat::Sse => sse_response(audio, chars),
        })
    })
    .await
}

/// The engine's voice for the request's: one of the model's own, or its default for an OpenAI
/// name; anything else is a 400 listing the voices there are.
fn voice(model: &LoadedModel, asked: Option<&str>) -> Result<Option<String>, ApiError> {
    let voices = &model.engine.info().voices;
    match asked {
        None => Ok(None),
        Some(v) if voices.iter().any(|known| known == v) => Ok(Some(v.to_owned())),
        Some(v) if OPENAI_VOICES.contains(&v) => Ok(None),
        Some(v) => Err(ApiError::invalid(
            "voice",
            format!(
                "`{}` has no voice `{v}`; its voices: {} (or any OpenAI voice name, for its default)",
                model.name,
                if voices.is_empty() { "one, unnamed".to_owned() } else { voices.join(", ") }
            ),
        )),
    }
}

/// The engine's chunks, encoded as they come.
struct Encoded {
    rx: mpsc::UnboundedReceiver<Chunk>,
    encoder: Option<StreamEncoder>,
    pending: Option<Vec<f32>>,
    guard: CancelOnDrop,
}

impl Encoded {
    /// The next encoded bytes; `None` when the audio is over (or failed: logged, since the status
    /// was sent already; the client sees the audio end early).
    async fn next(&mut self) -> Option<Vec<u8>> {
        loop {
            let encoder = self.encoder.as_mut()?;
            let samples = match self.pending.take() {
                Some(s) => s,
                None => match self.rx.recv().await {
                    Some(Chunk::Audio(s, _)) => s,
                    Some(Chunk::Done(outcome)) => {
                        self.guard.disarm();
                        if let Err(e) = outcome {
                            tracing::warn!(model = %self.guard.model().name, "speech failed mid-stream: {}", e.message);
                        }
                        let tail = self.encoder.take()?.finish();
                        return tail.map_err(|e| tracing::warn!("speech encoding failed: {e}")).ok();
                    }
                    None => return None,
                },
            };
            match encoder.push(&samples) {
                Ok(bytes) if bytes.is_empty() => continue,
                Ok(bytes) => return Some(bytes),
                Err(e) => {
                    tracing::warn!("speech encoding failed: {e}");
                    return None;
                }
            }
        }
    }
}

fn raw_response(format: OutputFormat, audio: Encoded) -> Response {
    let stream = futures_util::stream::unfold(audio, |mut audio| async move {
        let bytes = audio.next().await?;
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(bytes)), audio))
    });
    ([(header::CONTENT_TYPE, format.content_type())], Body::from_stream(stream)).into_response()
}

fn sse_response(audio: Encoded, chars: u64) -> Response {
    let events = futures_util::stream::unfold(Some(audio), move |audio| async move {
        let mut audio = audio?;
        match audio.next().await {
            Some(bytes) => {
                let delta = SpeechEvent::Delta { audio: base64::engine::general_purpose::STANDARD.encode(bytes) };
                Some((llmr_openai::sse::event(&delta), Some(audio)))
            }
            None => {
                // Piper has no token count: the usage counts the input's characters.
                let usage = SpeechUsage { input_tokens: chars, output_tokens: 0, total_tokens: chars };
                Some((llmr_openai::sse::event(&SpeechEvent::Done { usage }), None))
            }
        }
    });
    sse::response(events)
}
