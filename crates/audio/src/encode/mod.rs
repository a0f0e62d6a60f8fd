//! Synthesized mono PCM to the bytes of a `response_format`, streamed: every [`StreamEncoder::push`]
//! returns what can be sent now, so a client hears the first sentence while the rest is synthesized.

mod flac;
#[cfg(feature = "mp3")]
mod mp3;
#[cfg(feature = "opus")]
mod ogg_opus;
mod raw;
mod wav;

use crate::error::AudioError;
use crate::format::OutputFormat;
use crate::resample::{check_rate, StreamResampler};

/// One output format's encoder, fed mono samples at the rate it was made for.
trait FormatEncoder: Send {
    /// Bytes that precede any audio (a container header); called once, before the first `push`.
    fn header(&mut self) -> Result<Vec<u8>, AudioError>;
    fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), AudioError>;
    fn finish(self: Box<Self>, out: &mut Vec<u8>) -> Result<(), AudioError>;
}

/// Encodes a stream of mono f32 chunks (nominally in [-1, 1]; what lies outside is clamped) into
/// one output format. The concatenation of everything `push` and `finish` return is a complete
/// file (or, for `pcm`, a complete raw stream).
pub struct StreamEncoder {
    format: OutputFormat,
    input_rate: u32,
    resampler: Option<StreamResampler>,
    encoder: Box<dyn FormatEncoder>,
    header_sent: bool,
    resampled: Vec<f32>,
}

impl StreamEncoder {
    /// `input_rate` is the rate of the samples that will be pushed (the speech engine's). The
    /// output may be at another rate: see [`OutputFormat::output_rate`].
    ///
    /// Fails with [`AudioError::UnsupportedOutput`] for a format this build cannot produce, and
    /// with [`AudioError::Encode`] for an input rate no audio has (an engine bug, not the client's).
    pub fn new(format: OutputFormat, input_rate: u32) -> Result<Self, AudioError> {
        if !format.is_supported() {
            return Err(AudioError::UnsupportedOutput(format.as_str().to_string()));
        }
        check_rate(input_rate).map_err(|e| AudioError::Encode(format!("speech engine output: {e}")))?;
        let rate = format.output_rate(input_rate);
        let resampler = (rate != input_rate).then(|| StreamResampler::new(input_rate, rate)).transpose()?;
        let encoder: Box<dyn FormatEncoder> = match format {
            OutputFormat::Wav => Box::new(wav::WavEncoder::new(rate)),
            OutputFormat::Pcm => Box::new(raw::RawEncoder),
            OutputFormat::Flac => Box::new(flac::FlacEncoder::new(rate)?),
            #[cfg(feature = "mp3")]
            OutputFormat::Mp3 => Box::new(mp3::Mp3Encoder::new(rate)?),
            #[cfg(feature = "opus")]
            OutputFormat::Opus => Box::new(ogg_opus::OggOpusEncoder::new(rate)?),
            #[allow(unreachable_patterns)]
            _ => return Err(AudioError::UnsupportedOutput(format.as_str().to_string())),
        };
        Ok(StreamEncoder { format, input_rate, resampler, encoder, header_sent: false, resampled: Vec::new() })
    }

    pub fn format(&self) -> OutputFormat {
        self.format
    }

    pub fn input_rate(&self) -> u32 {
        self.input_rate
    }

    /// The sample rate of the encoded audio.
    pub fn output_rate(&self) -> u32 {
        self.format.output_rate(self.input_rate)
    }

    /// Encode a chunk and return the bytes ready to send. The first call also returns the
    /// container header, so `push(&[])` right away gets the header out before any audio exists.
    /// Some bytes may be held back until a later call: encoders work in frames, and the
    /// resampler in blocks.
    pub fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        let mut out = self.take_header()?;
        match &mut self.resampler {
            Some(resampler) => {
                self.resampled.clear();
                resampler.push(samples, &mut self.resampled)?;
                self.encoder.push(&self.resampled, &mut out)?;
            }
            None => self.encoder.push(samples, &mut out)?,
        }
        Ok(out)
    }

    /// Flush everything held back and end the stream (trailing frames, end-of-stream page).
    pub fn finish(mut self) -> Result<Vec<u8>, AudioError> {
        let mut out = self.take_header()?;
        if let Some(resampler) = self.resampler.take() {
            self.resampled.clear();
            resampler.finish(&mut self.resampled)?;
            self.encoder.push(&self.resampled, &mut out)?;
        }
        self.encoder.finish(&mut out)?;
        Ok(out)
    }

    fn take_header(&mut self) -> Result<Vec<u8>, AudioError> {
        if self.header_sent {
            return Ok(Vec::new());
        }
        self.header_sent = true;
        self.encoder.header()
    }
}

/// Encode a whole clip at once. Unlike a stream, the file states its real length: a WAV header
/// gets its sizes filled in.
pub fn encode(format: OutputFormat, samples: &[f32], rate: u32) -> Result<Vec<u8>, AudioError> {
    let mut encoder = StreamEncoder::new(format, rate)?;
    let mut bytes = encoder.push(samples)?;
    bytes.extend(encoder.finish()?);
    if format == OutputFormat::Wav {
        wav::fill_in_sizes(&mut bytes);
    }
    Ok(bytes)
}

/// Samples clamped to [-1, 1], NaN as silence, for encoders that take floats.
#[cfg(any(feature = "mp3", feature = "opus"))]
fn clamped(samples: &[f32]) -> impl Iterator<Item = f32> + '_ {
    samples.iter().map(|&s| if s.is_nan() { 0.0 } else { s.clamp(-1.0, 1.0) })
}
