//! The audio endpoints: transcriptions and translations (multipart uploads) and speech.

mod form;
mod languages;
mod speech;
mod transcription;

pub use form::{Form, FormFile};
pub use languages::language_name;
pub use speech::*;
pub use transcription::*;

/// OpenAI's limit on an uploaded audio file.
pub const DEFAULT_MAX_AUDIO_BYTES: usize = 25 << 20;
