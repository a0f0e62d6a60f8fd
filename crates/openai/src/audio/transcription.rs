//! `/v1/audio/transcriptions` and `/v1/audio/translations`: the form's fields validated into a
//! request, and the five response formats (json, text, srt, verbose_json, vtt) plus the stream's
//! events, built from the engine's segments.

use super::form::{Form, FormFile};
use super::languages::language_name;
use crate::ApiError;
use serde::Serialize;
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TranscriptionFormat {
    Json,
    Text,
    Srt,
    VerboseJson,
    Vtt,
}

impl TranscriptionFormat {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "json" => Self::Json,
            "text" => Self::Text,
            "srt" => Self::Srt,
            "verbose_json" => Self::VerboseJson,
            "vtt" => Self::Vtt,
            _ => return None,
        })
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Self::Json | Self::VerboseJson => "application/json",
            Self::Text => "text/plain; charset=utf-8",
            Self::Srt => "application/x-subrip; charset=utf-8",
            Self::Vtt => "text/vtt; charset=utf-8",
        }
    }
}

/// A validated transcription (or translation) request.
#[derive(Clone, Debug)]
pub struct TranscriptionRequest {
    pub model: String,
    pub file: FormFile,
    /// ISO 639-1; `None`: detect.
    pub language: Option<String>,
    pub prompt: Option<String>,
    pub format: TranscriptionFormat,
    pub temperature: f32,
    pub word_timestamps: bool,
    pub stream: bool,
    /// `/v1/audio/translations`: English text whatever the speech's language.
    pub translate: bool,
}

fn boolean(name: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "true" | "True" | "1" => Ok(true),
        "false" | "False" | "0" => Ok(false),
        other => Err(ApiError::invalid(name, format!("expected true or false, got `{other}`"))),
    }
}

impl TranscriptionRequest {
    /// Validates a form sent to the transcriptions (`translate` false) or translations endpoint.
    pub fn from_form(form: Form, translate: bool) -> Result<Self, ApiError> {
        let model = form.get("model").map(str::trim).unwrap_or_default().to_owned();
        if model.is_empty() {
            return Err(ApiError::invalid("model", "is required"));
        }
        let format = match form.get("response_format") {
            None => TranscriptionFormat::Json,
            Some(f) => TranscriptionFormat::parse(f).ok_or_else(|| {
                ApiError::invalid("response_format", format!("`{f}` is not one of json, text, srt, verbose_json, vtt"))
            })?,
        };
        let temperature =
            match form.get("temperature") {
                None => 0.0,
                Some(t) => t.trim().parse::<f32>().ok().filter(|t| (0.0..=1.0).contains(t)).ok_or_else(|| {
                    ApiError::invalid("temperature", format!("expected a number from 0 to 1, got `{t}`"))
                })?,
            };
        // Translations take no language (the output is English; the input's is detected).
        let language = match form.get("language").map(str::trim).filter(|l| !l.is_empty() && !translate) {
            None => None,
            Some(l) if l.len() <= 3 && l.bytes().all(|b| b.is_ascii_lowercase()) => Some(l.to_owned()),
            Some(l) => {
                return Err(ApiError::invalid(
                    "language",
                    format!("expected an ISO 639-1 code such as `en`, got `{l}`"),
                ))
            }
        };
        let mut word_timestamps = false;
        for g in form.all("timestamp_granularities") {
            match g {
                "word" => word_timestamps = true,
                "segment" => {}
                other => {
                    return Err(ApiError::invalid(
                        "timestamp_granularities",
                        format!("`{other}` is not one of word, segment"),
                    ))
                }
            }
        }
        if !form.all("timestamp_granularities").is_empty() && format != TranscriptionFormat::VerboseJson {
            return Err(ApiError::invalid("timestamp_granularities", "needs response_format verbose_json"));
        }
        let stream = form.get("stream").map(|s| boolean("stream", s)).transpose()?.unwrap_or(false);
        if stream && !matches!(format, TranscriptionFormat::Json | TranscriptionFormat::Text) {
            return Err(ApiError::invalid("stream", "streams text only: use response_format json or text"));
        }
        let prompt = form.get("prompt").filter(|p| !p.is_empty()).map(str::to_owned);
        let file = form.file.ok_or_else(|| ApiError::invalid("file", "is required (the audio to transcribe)"))?;
        if file.bytes.is_empty() {
            return Err(ApiError::invalid("file", "is empty"));
        }
        Ok(TranscriptionRequest {
            model,
            file,
            language,
            prompt,
            format,
            temperature,
            word_timestamps,
            stream,
            translate,
        })
    }
}

/// What the engine heard, in the node's terms.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HeardSegment {
    pub start: f64,
    pub end: f64,
    pub text: String,
    pub tokens: Vec<i32>,
    pub words: Vec<TranscriptionWord>,
    pub temperature: f32,
    pub avg_logprob: f32,
    pub no_speech_prob: f32,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TranscriptionWord {
    pub word: String,
    pub start: f64,
    pub end: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct TranscriptionSegment {
    pub id: u32,
    /// Where the segment's 30 s window began, in mel frames (10 ms), as OpenAI reports it.
    pub seek: u64,
    pub start: f64,
    pub end: f64,
    pub text: String,
    pub tokens: Vec<i32>,
    pub temperature: f32,
    pub avg_logprob: f32,
    pub compression_ratio: f32,
    pub no_speech_prob: f32,
}

/// `usage` of a whisper-style transcription: seconds of audio heard.
#[derive(Clone, Debug, Serialize)]
pub struct DurationUsage {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub seconds: u64,
}

impl DurationUsage {
    pub fn new(duration: f64) -> Self {
        DurationUsage { kind: "duration", seconds: duration.ceil() as u64 }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Transcription {
    pub text: String,
    pub usage: DurationUsage,
}

#[derive(Clone, Debug, Serialize)]
pub struct VerboseTranscription {
    pub task: &'static str,
    pub language: String,
    pub duration: f64,
    pub text: String,
    pub segments: Vec<TranscriptionSegment>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub words: Option<Vec<TranscriptionWord>>,
    pub usage: DurationUsage,
}

/// The usage of a streamed transcription, in tokens as OpenAI's stream reports it: the audio's
/// are the encoder positions Whisper gave it (50 a second), the prompt's its text tokens, the
/// output the transcript's tokens.
#[derive(Clone, Debug, Serialize)]
pub struct TokenUsage {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub input_tokens: u64,
    pub input_token_details: InputTokenDetails,
    pub output_tokens: u64,
    pub total_tokens: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct InputTokenDetails {
    pub text_tokens: u64,
    pub audio_tokens: u64,
}

impl TokenUsage {
    /// Whisper's encoder takes 100 mel frames a second and halves them: 50 positions a second.
    pub const AUDIO_TOKENS_PER_SECOND: f64 = 50.0;

    pub fn new(duration: f64, output_tokens: u64) -> Self {
        let audio_tokens = (duration * Self::AUDIO_TOKENS_PER_SECOND).round() as u64;
        TokenUsage {
            kind: "tokens",
            input_tokens: audio_tokens,
            input_token_details: InputTokenDetails { text_tokens: 0, audio_tokens },
            output_tokens,
            total_tokens: audio_tokens + output_tokens,
        }
    }
}

/// `transcript.text.delta` / `transcript.text.done`.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type")]
pub enum TranscriptEvent {
    #[serde(rename = "transcript.text.delta")]
    Delta { delta: String },
    #[serde(rename = "transcript.text.done")]
    Done { text: String, usage: TokenUsage },
}

/// The whole text: segments joined as Whisper writes them (each begins with its own space).
pub fn joined_text(segments: &[HeardSegment]) -> String {
    segments.iter().map(|s| s.text.as_str()).collect::<String>().trim().to_owned()
}

/// Whisper's repetition check, as OpenAI reports it: the text's length over its zlib-compressed
/// length (a decoding stuck in a loop compresses well and scores above 2.4).
fn compression_ratio(text: &str) -> f32 {
    use std::io::Write;
    let bytes = text.as_bytes();
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    let compressed = z.write_all(bytes).and_then(|()| z.finish()).map(|c| c.len()).unwrap_or(0);
    if bytes.is_empty() || compressed == 0 {
        return 0.0;
    }
    bytes.len() as f32 / compressed as f32
}

/// A finished transcription in the format the request asked for: (content type, body).
pub fn render(
    request: &TranscriptionRequest,
    segments: &[HeardSegment],
    language: &str,
    duration: f64,
) -> (&'static str, String) {
    let text = joined_text(segments);
    let format = request.format;
    let body = match format {
        TranscriptionFormat::Json => {
            serde_json::to_string(&Transcription { text, usage: DurationUsage::new(duration) }).unwrap_or_default()
        }
        TranscriptionFormat::Text => format!("{text}\n"),
        TranscriptionFormat::Srt => srt(segments),
        TranscriptionFormat::Vtt => vtt(segments),
        TranscriptionFormat::VerboseJson => {
            let verbose = VerboseTranscription {
                task: if request.translate { "translate" } else { "transcribe" },
                language: language_name(language).unwrap_or(language).to_owned(),
                duration,
                text,
                segments: segments
                    .iter()
                    .enumerate()
                    .map(|(i, s)| TranscriptionSegment {
                        id: i as u32,
                        seek: (s.start * 100.0) as u64 / 3000 * 3000,
                        start: s.start,
                        end: s.end,
                        text: s.text.clone(),
                        tokens: s.tokens.clone(),
                        temperature: s.temperature,
                        avg_logprob: s.avg_logprob,
                        compression_ratio: compression_ratio(&s.text),
                        no_speech_prob: s.no_speech_prob,
                    })
                    .collect(),
                words: request.word_timestamps.then(|| segments.iter().flat_map(|s| s.words.clone()).collect()),
                usage: DurationUsage::new(duration),
            };
            serde_json::to_string(&verbose).unwrap_or_default()
        }
    };
    (format.content_type(), body)
}

/// `HH:MM:SS,mmm` (SubRip) or `HH:MM:SS.mmm` (WebVTT).
fn timestamp(seconds: f64, separator: char) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    format!("{:02}:{:02}:{:02}{separator}{:03}", ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000)
}

pub fn srt(segments: &[HeardSegment]) -> String {
    let mut out = String::new();
    for (i, s) in segments.iter().enumerate() {
        let _ =
            write!(out, "{}\n{} --> {}\n{}\n\n", i + 1, timestamp(s.start, ','), timestamp(s.end, ','), s.text.trim());
    }
    out
}

pub fn vtt(segments: &[HeardSegment]) -> String {
    let mut out = String::from("WEBVTT\n\n");
    for s in segments {
        let _ = write!(out, "{} --> {}\n{}\n\n", timestamp(s.start, '.'), timestamp(s.end, '.'), s.text.trim());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn form(fields: &[(&str, &str)]) -> Form {
        Form {
            fields: fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            file: Some(FormFile { name: Some("a.wav".into()), content_type: None, bytes: Bytes::from_static(b"RIFF") }),
        }
    }

    fn segments() -> Vec<HeardSegment> {
        vec![
            HeardSegment { start: 0.0, end: 3.5, text: " And so my fellow Americans,".into(), ..Default::default() },
            HeardSegment { start: 3.5, end: 3661.25, text: " ask not.".into(), ..Default::default() },
        ]
    }

    #[test]
    fn fields_are_validated_and_named() {
        let r = TranscriptionRequest::from_form(form(&[("model", "whisper-1")]), false).unwrap();
        assert_eq!(
            (r.format, r.temperature, r.stream, r.word_timestamps),
            (TranscriptionFormat::Json, 0.0, false, false)
        );
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[], "model"),
            (&[("model", "m"), ("response_format", "xml")], "response_format"),
            (&[("model", "m"), ("temperature", "1.5")], "temperature"),
            (&[("model", "m"), ("temperature", "hot")], "temperature"),
            (&[("model", "m"), ("language", "English")], "language"),
            (&[("model", "m"), ("timestamp_granularities[]", "word")], "timestamp_granularities"),
            (
                &[("model", "m"), ("response_format", "verbose_json"), ("timestamp_granularities[]", "letter")],
                "timestamp_granularities",
            ),
            (&[("model", "m"), ("stream", "yes")], "stream"),
            (&[("model", "m"), ("stream", "true"), ("response_format", "srt")], "stream"),
        ];
        for (fields, param) in cases {
            let e = TranscriptionRequest::from_form(form(fields), false).unwrap_err();
            assert_eq!((e.status, e.param.as_deref()), (400, Some(*param)), "{fields:?}: {}", e.message);
        }
        let mut no_file = form(&[("model", "m")]);
        no_file.file = None;
        assert_eq!(TranscriptionRequest::from_form(no_file, false).unwrap_err().param.as_deref(), Some("file"));
        let r = TranscriptionRequest::from_form(
            form(&[("model", "m"), ("response_format", "verbose_json"), ("timestamp_granularities[]", "word")]),
            false,
        )
        .unwrap();
        assert!(r.word_timestamps);
        // A translation's output is English; a language field does not apply to it.
        let r = TranscriptionRequest::from_form(form(&[("model", "m"), ("language", "fr")]), true).unwrap();
        assert_eq!((r.language, r.translate), (None, true));
    }

    #[test]
    fn subtitles_use_their_formats_timestamps() {
        assert_eq!(
            srt(&segments()),
            "1\n00:00:00,000 --> 00:00:03,500\nAnd so my fellow Americans,\n\n2\n00:00:03,500 --> 01:01:01,250\nask not.\n\n"
        );
        assert_eq!(
            vtt(&segments()),
            "WEBVTT\n\n00:00:00.000 --> 00:00:03.500\nAnd so my fellow Americans,\n\n00:00:03.500 --> 01:01:01.250\nask not.\n\n"
        );
    }

    #[test]
    fn verbose_json_names_the_language_and_the_task() {
        let mut r = TranscriptionRequest::from_form(form(&[("model", "m"), ("response_format", "verbose_json")]), true)
            .unwrap();
        r.word_timestamps = true;
        let (ct, body) = render(&r, &segments(), "en", 11.0);
        assert_eq!(ct, "application/json");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["task"], "translate");
        assert_eq!(v["language"], "english");
        assert_eq!(v["text"], "And so my fellow Americans, ask not.");
        assert_eq!(v["segments"][1]["id"], 1);
        assert_eq!(v["words"], serde_json::json!([]));
        assert_eq!(v["usage"], serde_json::json!({"type": "duration", "seconds": 11}));
        let repeated = compression_ratio(&" the the the the the the the the the the the the".repeat(4));
        assert!(repeated > 2.4 && compression_ratio(" And so my fellow Americans, ask not") < 2.0, "{repeated}");
    }
}
