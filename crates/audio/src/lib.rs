//! Audio in and out of llmr's speech endpoints, in Rust, with no ffmpeg process.
//!
//! - [`decode`]: an uploaded file (`/v1/audio/transcriptions`, `/v1/audio/translations`) to mono
//!   f32 at the engine's rate (16 kHz for whisper.cpp). WAV, MP3, FLAC, Ogg (Vorbis, Opus, FLAC),
//!   WebM/Matroska (Opus, Vorbis, ...), MP4/M4A (AAC-LC, ALAC), ADTS AAC, AIFF and CAF.
//! - [`StreamEncoder`]: synthesized mono f32 chunks (`/v1/audio/speech`) to `wav`, `pcm`, `flac`,
//!   `mp3` or `opus`, streamed chunk by chunk. `aac` is not produced (see [`OutputFormat::is_supported`]).
//! - [`resample`] / [`StreamResampler`]: the rate conversion both use.
//!
//! Every error says which side is at fault and which request field it is about
//! ([`AudioError::status`], [`AudioError::field`]).

mod decode;
mod encode;
mod error;
mod format;
#[cfg(feature = "opus")]
mod opus_decode;
mod pcm;
mod resample;

pub use decode::{decode, DecodeLimits};
pub use encode::{encode, StreamEncoder};
pub use error::{AudioError, ErrorKind};
pub use format::{OutputFormat, PCM_RATE};
pub use pcm::Pcm;
pub use resample::{resample, StreamResampler};

/// The lowest sample rate accepted anywhere: below telephone quality nothing is speech.
pub const MIN_SAMPLE_RATE: u32 = 1_000;
/// The highest: 768 kHz is the top of what professional audio formats use.
pub const MAX_SAMPLE_RATE: u32 = 768_000;
