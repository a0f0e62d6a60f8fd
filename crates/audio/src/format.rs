//! The `response_format` values of OpenAI's `POST /v1/audio/speech`.

use std::fmt;
use std::str::FromStr;

use crate::error::AudioError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputFormat {
    /// RIFF WAVE, 16-bit PCM, mono, at the engine's rate; streamed with unknown sizes.
    Wav,
    /// Headerless signed 16-bit little-endian, mono, 24 kHz (as OpenAI documents it).
    Pcm,
    /// FLAC, 16-bit, mono, at the engine's rate.
    Flac,
    /// MPEG-1/2 layer III, mono, 64 kbit/s CBR.
    Mp3,
    /// Opus in Ogg (RFC 7845), mono, 48 kbit/s.
    Opus,
    /// AAC. Not produced: see [`OutputFormat::is_supported`].
    Aac,
}

impl OutputFormat {
    pub const ALL: [OutputFormat; 6] = [
        OutputFormat::Wav,
        OutputFormat::Pcm,
        OutputFormat::Flac,
        OutputFormat::Mp3,
        OutputFormat::Opus,
        OutputFormat::Aac,
    ];

    /// OpenAI's name for the format.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputFormat::Wav => "wav",
            OutputFormat::Pcm => "pcm",
            OutputFormat::Flac => "flac",
            OutputFormat::Mp3 => "mp3",
            OutputFormat::Opus => "opus",
            OutputFormat::Aac => "aac",
        }
    }

    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            OutputFormat::Wav => "audio/wav",
            // No registered type means little-endian 16-bit (audio/L16 is big-endian); this is the
            // conventional one for raw PCM.
            OutputFormat::Pcm => "audio/pcm",
            OutputFormat::Flac => "audio/flac",
            OutputFormat::Mp3 => "audio/mpeg",
            // RFC 7845's type for Ogg Opus; browsers play it.
            OutputFormat::Opus => "audio/ogg",
            OutputFormat::Aac => "audio/aac",
        }
    }

    /// Whether this build can produce the format. AAC never: the only maintained encoder crate
    /// (`fdk-aac`) builds Fraunhofer's FDK library, whose licence is not open source in the OSI
    /// sense and is incompatible with the GPL family; MP3 and Opus need the `mp3` and `opus`
    /// features (both on by default).
    pub fn is_supported(self) -> bool {
        match self {
            OutputFormat::Wav | OutputFormat::Pcm | OutputFormat::Flac => true,
            OutputFormat::Mp3 => cfg!(feature = "mp3"),
            OutputFormat::Opus => cfg!(feature = "opus"),
            OutputFormat::Aac => false,
        }
    }

    /// The formats this build produces, comma-separated, for error messages.
    pub fn supported_names() -> String {
        let names: Vec<&str> = Self::ALL.iter().filter(|f| f.is_supported()).map(|f| f.as_str()).collect();
        names.join(", ")
    }

    /// The sample rate the encoded audio will have for input at `input_rate`: the input's own
    /// rate where the format can carry it, else the nearest standard rate.
    pub fn output_rate(self, input_rate: u32) -> u32 {
        match self {
            OutputFormat::Wav | OutputFormat::Flac | OutputFormat::Aac => input_rate,
            OutputFormat::Pcm => PCM_RATE,
            OutputFormat::Mp3 => {
                if MP3_RATES.contains(&input_rate) {
                    input_rate
                } else {
                    24_000
                }
            }
            OutputFormat::Opus => {
                if OPUS_RATES.contains(&input_rate) {
                    input_rate
                } else {
                    48_000
                }
            }
        }
    }
}

/// OpenAI's `pcm` is 24 kHz: clients hard-code it, since raw samples carry no rate.
pub const PCM_RATE: u32 = 24_000;
/// The rates MPEG-1, 2 and 2.5 layer III can carry.
pub(crate) const MP3_RATES: [u32; 9] = [8_000, 11_025, 12_000, 16_000, 22_050, 24_000, 32_000, 44_100, 48_000];
/// The input rates libopus accepts.
pub(crate) const OPUS_RATES: [u32; 5] = [8_000, 12_000, 16_000, 24_000, 48_000];

impl FromStr for OutputFormat {
    type Err = AudioError;

    /// OpenAI's names, case-insensitively. A name this build cannot produce (`aac`) parses; check
    /// [`is_supported`](Self::is_supported) or let [`StreamEncoder::new`](crate::StreamEncoder::new) refuse it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        Self::ALL
            .into_iter()
            .find(|f| f.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| AudioError::UnsupportedOutput(s.to_string()))
    }
}

impl fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_openai_names() {
        for f in OutputFormat::ALL {
            assert_eq!(f.as_str().parse::<OutputFormat>().unwrap(), f);
        }
        assert_eq!(" MP3 ".parse::<OutputFormat>().unwrap(), OutputFormat::Mp3);
        let err = "ogg".parse::<OutputFormat>().unwrap_err();
        assert_eq!(err.field(), Some("response_format"));
        assert_eq!(err.status(), 400);
        assert!(err.to_string().contains("`ogg`"), "{err}");
    }

    #[test]
    fn output_rates() {
        assert_eq!(OutputFormat::Pcm.output_rate(22_050), 24_000);
        assert_eq!(OutputFormat::Wav.output_rate(22_050), 22_050);
        assert_eq!(OutputFormat::Mp3.output_rate(22_050), 22_050);
        assert_eq!(OutputFormat::Mp3.output_rate(23_000), 24_000);
        assert_eq!(OutputFormat::Opus.output_rate(22_050), 48_000);
        assert_eq!(OutputFormat::Opus.output_rate(24_000), 24_000);
    }
}
