//! `/v1/audio/speech`: the request, validated, and the events of its SSE stream.

use crate::ApiError;
use serde::{Deserialize, Serialize};

/// OpenAI's bounds on `speed`.
pub const MIN_SPEED: f32 = 0.25;
pub const MAX_SPEED: f32 = 4.0;
/// OpenAI's limit on `input`, in characters; a node may set a lower one.
pub const MAX_SPEECH_INPUT_CHARS: usize = 4096;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpeechRequest {
    model: String,
    input: String,
    #[serde(default)]
    voice: Option<String>,
    #[serde(default)]
    response_format: Option<String>,
    #[serde(default)]
    speed: Option<f32>,
    #[serde(default)]
    stream_format: Option<String>,
    /// Tone instructions of OpenAI's newer voices; a Piper voice has no such control.
    #[serde(default)]
    instructions: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamFormat {
    /// The encoded audio itself, sent as it is made.
    Audio,
    /// `speech.audio.delta` events with base64 audio, then `speech.audio.done`.
    Sse,
}

/// A validated speech request. `response_format` stays a name: which encoders exist is the
/// node's business (it answers 400 on the field for one it lacks).
#[derive(Clone, Debug)]
pub struct SpeechRequest {
    pub model: String,
    pub input: String,
    pub voice: Option<String>,
    pub response_format: String,
    pub speed: f32,
    pub stream_format: StreamFormat,
}

impl SpeechRequest {
    pub fn parse(body: &[u8], max_input_chars: usize) -> Result<Self, ApiError> {
        let raw: RawSpeechRequest = crate::parse_body(body)?;
        if raw.model.trim().is_empty() {
            return Err(ApiError::invalid("model", "is required"));
        }
        if raw.input.trim().is_empty() {
            return Err(ApiError::invalid("input", "is empty: give the text to speak"));
        }
        let chars = raw.input.chars().count();
        if chars > max_input_chars {
            let mut e = ApiError::invalid("input", format!("is {chars} characters; the limit is {max_input_chars}"));
            e.status = 413;
            return Err(e);
        }
        let speed = raw.speed.unwrap_or(1.0);
        if !(MIN_SPEED..=MAX_SPEED).contains(&speed) {
            return Err(ApiError::invalid("speed", format!("{speed} is outside {MIN_SPEED}..={MAX_SPEED}")));
        }
        let stream_format = match raw.stream_format.as_deref() {
            None | Some("audio") => StreamFormat::Audio,
            Some("sse") => StreamFormat::Sse,
            Some(other) => {
                return Err(ApiError::invalid("stream_format", format!("`{other}` is not one of audio, sse")))
            }
        };
        let _ = raw.instructions;
        Ok(SpeechRequest {
            model: raw.model,
            input: raw.input,
            voice: raw.voice.filter(|v| !v.is_empty()),
            response_format: raw.response_format.unwrap_or_else(|| "mp3".into()),
            speed,
            stream_format,
        })
    }
}

/// `speech.audio.delta` / `speech.audio.done`.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type")]
pub enum SpeechEvent {
    #[serde(rename = "speech.audio.delta")]
    Delta { audio: String },
    #[serde(rename = "speech.audio.done")]
    Done { usage: SpeechUsage },
}

#[derive(Clone, Debug, Serialize)]
pub struct SpeechUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_checked_and_named() {
        let r = SpeechRequest::parse(br#"{"model":"joe","input":"Hi.","voice":"alloy"}"#, 100).unwrap();
        assert_eq!((r.response_format.as_str(), r.speed, r.stream_format), ("mp3", 1.0, StreamFormat::Audio));
        for (body, param, status) in [
            (&br#"{"model":"joe","input":"  "}"#[..], "input", 400),
            (br#"{"model":"joe","input":"hello there"}"#, "input", 413),
            (br#"{"model":"joe","input":"Hi.","speed":9}"#, "speed", 400),
            (br#"{"model":"joe","input":"Hi.","stream_format":"ws"}"#, "stream_format", 400),
            (br#"{"model":"","input":"Hi."}"#, "model", 400),
        ] {
            let e = SpeechRequest::parse(body, 5).unwrap_err();
            assert_eq!((e.param.as_deref(), e.status), (Some(param), status), "{}", e.message);
        }
        assert_eq!(SpeechRequest::parse(br#"{"model":"joe"}"#, 5).unwrap_err().status, 400);
    }
}
