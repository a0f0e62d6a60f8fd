//! Uploaded audio files to mono f32 at the rate a speech engine wants.
//!
//! Symphonia demuxes and decodes (libopus decodes Opus, which symphonia only demuxes); every
//! decoded packet is downmixed and pushed through a streaming resampler straight away, so memory
//! holds only the output, and the duration limit is checked packet by packet: a two-hour upload
//! costs no more than decoding up to the limit.

use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};

use symphonia::core::codecs::audio::well_known::*;
use symphonia::core::codecs::audio::{
    AudioCodecId, AudioCodecParameters, AudioDecoder, AudioDecoderOptions, CODEC_ID_NULL_AUDIO,
};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;

use crate::error::AudioError;
#[cfg(feature = "opus")]
use crate::opus_decode::{OpusDecoder, OPUS_RATE};
use crate::pcm::Pcm;
use crate::resample::{check_rate, StreamResampler};

/// What an upload may cost. Both are checked: bytes before anything is parsed, seconds while
/// decoding (decoding stops at the first packet past the limit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeLimits {
    pub max_bytes: usize,
    /// `f64::INFINITY` for no limit.
    pub max_seconds: f64,
}

impl Default for DecodeLimits {
    /// OpenAI's documented upload limit of 25 MB, and an hour of audio.
    fn default() -> Self {
        DecodeLimits { max_bytes: 25 * 1024 * 1024, max_seconds: 3600.0 }
    }
}

/// Decode any supported container and codec, downmix to mono by averaging the channels, and
/// resample to `rate` Hz.
///
/// `filename_hint` (the upload's file name) only helps the format probe; the content decides.
/// Truncated files give what decoded before the damage; a file from which nothing at all decodes
/// is [`AudioError::Corrupt`]. A panic inside a decoder on malformed input is caught and reported
/// as `Corrupt` too.
pub fn decode(bytes: &[u8], filename_hint: Option<&str>, rate: u32, limits: &DecodeLimits) -> Result<Pcm, AudioError> {
    check_rate(rate)?;
    if bytes.is_empty() {
        return Err(AudioError::Empty);
    }
    if bytes.len() > limits.max_bytes {
        return Err(AudioError::TooLarge { bytes: bytes.len(), max_bytes: limits.max_bytes });
    }
    // Symphonia is pure Rust but has panicked on crafted input before (arithmetic overflow in
    // header parsing); one bad upload must not take a request thread down with it.
    match catch_unwind(AssertUnwindSafe(|| decode_unguarded(bytes, filename_hint, rate, limits))) {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            tracing::warn!(panic = %what, "audio decoder panicked on an upload");
            Err(AudioError::Corrupt(format!("the decoder failed on malformed data: {what}")))
        }
    }
}

fn decode_unguarded(
    bytes: &[u8],
    filename_hint: Option<&str>,
    rate: u32,
    limits: &DecodeLimits,
) -> Result<Pcm, AudioError> {
    let mut reader = open(bytes, filename_hint)?;
    let track = reader
        .default_track(TrackType::Audio)
        .ok_or_else(|| AudioError::NotAudio("the file has no audio track".into()))?;
    let track_id = track.id;
    let declared_frames = track.num_frames;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .cloned()
        .ok_or_else(|| AudioError::NotAudio("the file has no audio track".into()))?;
    if let Some(declared) = params.sample_rate {
        check_rate(declared)?;
    }
    let mut decoder = make_decoder(&params)?;

    let mut state = Output::new(rate, limits.max_seconds);
    let mut mono = Vec::new();
    let mut interleaved: Vec<f32> = Vec::new();
    let mut bad_packets = 0usize;
    let mut last_problem: Option<String> = None;
    loop {
        let packet = match reader.next_packet() {
            Ok(Some(packet)) => packet,
            Ok(None) => break,
            // A chained Ogg stream starts over with new tracks; the first is the upload.
            Err(SymphoniaError::ResetRequired) => break,
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                // Truncated: keep what decoded so far.
                last_problem = Some("the file is truncated".into());
                break;
            }
            Err(e) => {
                // The container breaks further on: keep what decoded so far.
                last_problem = Some(e.to_string());
                break;
            }
        };
        if packet.track_id != track_id {
            continue;
        }
        mono.clear();
        let packet_rate = match &mut decoder {
            #[cfg(feature = "opus")]
            TrackDecoder::Opus(opus) => match opus.decode(&packet, &mut mono) {
                Ok(_) => OPUS_RATE,
                Err(e) => {
                    bad_packets += 1;
                    last_problem = Some(format!("Opus: {e}"));
                    continue;
                }
            },
            TrackDecoder::Symphonia(dec) => match dec.decode(&packet) {
                Ok(buf) => {
                    let channels = buf.spec().channels().count().max(1);
                    buf.copy_to_vec_interleaved(&mut interleaved);
                    downmix(&interleaved, channels, &mut mono);
                    buf.spec().rate()
                }
                // A damaged packet is skipped, as players do; the rest may be fine.
                Err(e @ (SymphoniaError::DecodeError(_) | SymphoniaError::IoError(_))) => {
                    bad_packets += 1;
                    last_problem = Some(e.to_string());
                    continue;
                }
                Err(SymphoniaError::Unsupported(what)) => {
                    return Err(AudioError::Unsupported(format!("{}: {what}", codec_name(params.codec))))
                }
                Err(SymphoniaError::ResetRequired) => break,
                Err(e) => return Err(AudioError::Corrupt(e.to_string())),
            },
        };
        if !mono.is_empty() {
            state.push(&mono, packet_rate)?;
        }
    }
    if state.decoded_frames == 0 {
        return Err(match last_problem {
            Some(problem) if bad_packets > 0 => AudioError::Corrupt(format!("no packet could be decoded: {problem}")),
            // A header that says "no samples" (a WAV with an empty data chunk) is empty audio;
            // anything else that yields nothing ended before its first whole packet.
            None if declared_frames == Some(0) => AudioError::Empty,
            _ => AudioError::Corrupt("the file ends before any audio could be decoded".into()),
        });
    }
    if bad_packets > 0 || last_problem.is_some() {
        tracing::debug!(bad_packets, problem = ?last_problem, "audio upload partly decoded");
    }
    state.finish()
}

/// Probe the container. Symphonia scans up to 1 MB for a known marker; finding none means the
/// bytes are not audio we know, while an error after a marker was found means a broken file.
fn open<'a>(bytes: &'a [u8], filename_hint: Option<&str>) -> Result<Box<dyn FormatReader + 'a>, AudioError> {
    let mut hint = Hint::new();
    if let Some(ext) = filename_hint.and_then(extension) {
        hint.with_extension(&ext);
    }
    let source = MediaSourceStream::new(Box::new(Cursor::new(bytes)), Default::default());
    symphonia::default::get_probe()
        .probe(&hint, source, FormatOptions::default(), MetadataOptions::default())
        .map_err(probe_error)
}

fn probe_error(e: SymphoniaError) -> AudioError {
    match e {
        SymphoniaError::Unsupported(what) if what.contains("no suitable format reader") => AudioError::NotAudio(
            "expected wav, mp3, flac, ogg (vorbis, opus, flac), webm/mkv, m4a/mp4 (aac, alac), aac, aiff or caf".into(),
        ),
        SymphoniaError::Unsupported(what) => AudioError::Unsupported(what.to_string()),
        SymphoniaError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            AudioError::Corrupt("the file ends inside its header".into())
        }
        other => AudioError::Corrupt(other.to_string()),
    }
}

fn extension(name: &str) -> Option<String> {
    let (_, ext) = name.rsplit_once('.')?;
    (!ext.is_empty() && ext.len() <= 5 && ext.bytes().all(|b| b.is_ascii_alphanumeric()))
        .then(|| ext.to_ascii_lowercase())
}

fn make_decoder(params: &AudioCodecParameters) -> Result<TrackDecoder, AudioError> {
    #[cfg(feature = "opus")]
    if params.codec == CODEC_ID_OPUS {
        return Ok(TrackDecoder::Opus(OpusDecoder::new(params)?));
    }
    symphonia::default::get_codecs()
        .make_audio_decoder(params, &AudioDecoderOptions::default())
        .map(TrackDecoder::Symphonia)
        .map_err(|e| match e {
            SymphoniaError::Unsupported(_) => AudioError::Unsupported(codec_name(params.codec)),
            other => AudioError::Corrupt(other.to_string()),
        })
}

enum TrackDecoder {
    Symphonia(Box<dyn AudioDecoder>),
    #[cfg(feature = "opus")]
    Opus(OpusDecoder),
}

/// Average interleaved channels into one.
fn downmix(interleaved: &[f32], channels: usize, mono: &mut Vec<f32>) {
    if channels == 1 {
        mono.extend_from_slice(interleaved);
        return;
    }
    let scale = 1.0 / channels as f32;
    mono.extend(interleaved.chunks_exact(channels).map(|frame| frame.iter().sum::<f32>() * scale));
}

/// Resampled output and the duration budget.
struct Output {
    target_rate: u32,
    max_seconds: f64,
    samples: Vec<f32>,
    resampler: Option<StreamResampler>,
    decoded_frames: u64,
    /// Duration decoded at earlier sample rates, and frames at the current one: counted in whole
    /// frames so that a file exactly at the limit is not pushed over it by rounding.
    earlier_seconds: f64,
    frames_at_rate: u64,
}

impl Output {
    fn new(target_rate: u32, max_seconds: f64) -> Self {
        Output {
            target_rate,
            max_seconds,
            samples: Vec::new(),
            resampler: None,
            decoded_frames: 0,
            earlier_seconds: 0.0,
            frames_at_rate: 0,
        }
    }

    fn push(&mut self, mono: &[f32], rate: u32) -> Result<(), AudioError> {
        check_rate(rate)?;
        // MP3 and chained streams may change rate mid-file: flush and start a new resampler.
        if self.resampler.as_ref().map(StreamResampler::input_rate) != Some(rate) {
            if let Some(done) = self.resampler.take() {
                self.earlier_seconds += self.frames_at_rate as f64 / f64::from(done.input_rate());
                self.frames_at_rate = 0;
                done.finish(&mut self.samples)?;
            }
            self.resampler = Some(StreamResampler::new(rate, self.target_rate)?);
        }
        self.decoded_frames += mono.len() as u64;
        self.frames_at_rate += mono.len() as u64;
        let seconds = self.earlier_seconds + self.frames_at_rate as f64 / f64::from(rate);
        if seconds > self.max_seconds {
            return Err(AudioError::TooLong { seconds, max_seconds: self.max_seconds });
        }
        if let Some(resampler) = &mut self.resampler {
            resampler.push(mono, &mut self.samples)?;
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Pcm, AudioError> {
        if let Some(done) = self.resampler.take() {
            done.finish(&mut self.samples)?;
        }
        Ok(Pcm { samples: self.samples, sample_rate: self.target_rate })
    }
}

/// A readable name for a codec symphonia demuxed but cannot decode.
fn codec_name(codec: AudioCodecId) -> String {
    let name = match codec {
        CODEC_ID_AAC => "AAC",
        CODEC_ID_ALAC => "ALAC",
        CODEC_ID_AC3 => "AC-3",
        CODEC_ID_EAC3 => "E-AC-3",
        CODEC_ID_DCA => "DTS",
        CODEC_ID_WMA => "WMA",
        CODEC_ID_OPUS => "Opus (this build has no libopus)",
        CODEC_ID_SPEEX => "Speex",
        CODEC_ID_WAVPACK => "WavPack",
        CODEC_ID_MONKEYS_AUDIO => "Monkey's Audio",
        CODEC_ID_MUSEPACK => "Musepack",
        CODEC_ID_ADPCM_G722 | CODEC_ID_ADPCM_G726 | CODEC_ID_ADPCM_G726LE => "G.72x ADPCM",
        CODEC_ID_NULL_AUDIO => "an unknown codec",
        _ => return format!("codec {codec} cannot be decoded"),
    };
    format!("{name} cannot be decoded")
}
