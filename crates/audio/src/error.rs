//! One error type for decoding, resampling and encoding, with what an HTTP layer needs to answer:
//! the status ([`AudioError::status`]), the request field at fault ([`AudioError::field`]) and a
//! stable machine-readable code ([`AudioError::code`]).

/// Which side is at fault, and so which HTTP status fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The client sent something we cannot use (400).
    InvalidInput,
    /// The client sent more than the configured limits allow (413).
    TooLarge,
    /// Our side failed: an encoder error or nonsense from the speech engine (500).
    Internal,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AudioError {
    #[error("the audio file is empty (no audio samples)")]
    Empty,
    #[error("the audio file is {bytes} bytes, over the limit of {max_bytes} bytes")]
    TooLarge { bytes: usize, max_bytes: usize },
    /// `seconds` is how far decoding had got when it stopped: decoding stops as soon as the limit
    /// is passed, so the file may be longer still.
    #[error("the audio is longer than the limit of {max_seconds} s (decoding stopped at {seconds:.1} s)")]
    TooLong { seconds: f64, max_seconds: f64 },
    /// No supported container or stream was recognised: a text file, random bytes, a video-only file.
    #[error("not a recognised audio file ({0})")]
    NotAudio(String),
    /// The container was recognised but is damaged or truncated before any audio could be decoded.
    #[error("the audio file is damaged or truncated ({0})")]
    Corrupt(String),
    /// The container was recognised but its codec (or a feature of it) cannot be decoded here.
    #[error("unsupported audio ({0})")]
    Unsupported(String),
    /// A sample rate of 0 Hz or outside what any real audio uses.
    #[error("invalid sample rate {0} Hz (supported: {min} to {max} Hz)", min = crate::MIN_SAMPLE_RATE, max = crate::MAX_SAMPLE_RATE)]
    BadSampleRate(u32),
    /// An unknown `response_format` name, or a known one this build cannot produce.
    #[error("unsupported response format `{0}` (supported: {list})", list = crate::OutputFormat::supported_names())]
    UnsupportedOutput(String),
    /// An encoder failed, or was given parameters it rejects; never the client's fault.
    #[error("audio encoding failed: {0}")]
    Encode(String),
}

impl AudioError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            AudioError::Empty
            | AudioError::NotAudio(_)
            | AudioError::Corrupt(_)
            | AudioError::Unsupported(_)
            | AudioError::BadSampleRate(_)
            | AudioError::UnsupportedOutput(_) => ErrorKind::InvalidInput,
            AudioError::TooLarge { .. } | AudioError::TooLong { .. } => ErrorKind::TooLarge,
            AudioError::Encode(_) => ErrorKind::Internal,
        }
    }

    /// The HTTP status: 400 for bad input, 413 for input over the limits, 500 for our failures.
    pub fn status(&self) -> u16 {
        match self.kind() {
            ErrorKind::InvalidInput => 400,
            ErrorKind::TooLarge => 413,
            ErrorKind::Internal => 500,
        }
    }

    /// The OpenAI request field the error is about (`param` in OpenAI's error body): `file` for
    /// everything [`decode`](crate::decode) returns, `response_format` for an output format we
    /// cannot produce, none for internal failures.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            AudioError::UnsupportedOutput(_) => Some("response_format"),
            AudioError::Encode(_) => None,
            _ => Some("file"),
        }
    }

    /// A stable, machine-readable code (OpenAI's `code`), for clients and logs.
    pub fn code(&self) -> &'static str {
        match self {
            AudioError::Empty => "empty_file",
            AudioError::TooLarge { .. } => "file_too_large",
            AudioError::TooLong { .. } => "audio_too_long",
            AudioError::NotAudio(_) => "invalid_audio_format",
            AudioError::Corrupt(_) => "corrupt_audio",
            AudioError::Unsupported(_) => "unsupported_audio_codec",
            AudioError::BadSampleRate(_) => "invalid_sample_rate",
            AudioError::UnsupportedOutput(_) => "unsupported_response_format",
            AudioError::Encode(_) => "audio_encoding_failed",
        }
    }
}
