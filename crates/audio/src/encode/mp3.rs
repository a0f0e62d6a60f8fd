//! MP3 with LAME (vendored and statically linked by `mp3lame-sys`): mono, 64 kbit/s CBR, which
//! is transparent for speech at the 16 to 24 kHz rates TTS engines produce.
//!
//! No Xing/LAME info tag: it sits in the first frame and can only be written once the stream
//! has ended, which a streamed response cannot go back for.

use mp3lame_encoder::{Bitrate, Builder, FlushGap, Mode, MonoPcm, Quality, VbrMode};
use std::num::NonZeroU32;

use super::{clamped, FormatEncoder};
use crate::error::AudioError;

pub(super) struct Mp3Encoder {
    lame: mp3lame_encoder::Encoder,
    scratch: Vec<f32>,
}

fn err(what: &str, e: impl std::fmt::Display) -> AudioError {
    AudioError::Encode(format!("MP3 {what}: {e}"))
}

impl Mp3Encoder {
    /// `rate` must be one MP3 can carry (see `format::MP3_RATES`); LAME then does not resample.
    pub(super) fn new(rate: u32) -> Result<Self, AudioError> {
        let mut b = Builder::new().ok_or_else(|| err("encoder", "LAME could not allocate"))?;
        b.set_num_channels(1).map_err(|e| err("channels", e))?;
        b.set_sample_rate(rate).map_err(|e| err("input rate", e))?;
        b.set_output_sample_rate(NonZeroU32::new(rate)).map_err(|e| err("output rate", e))?;
        b.set_mode(Mode::Mono).map_err(|e| err("mode", e))?;
        b.set_vbr_mode(VbrMode::Off).map_err(|e| err("VBR mode", e))?;
        b.set_brate(Bitrate::Kbps64).map_err(|e| err("bitrate", e))?;
        // LAME's recommended "high quality" setting; 0 and 1 are much slower for no audible gain.
        b.set_quality(Quality::NearBest).map_err(|e| err("quality", e))?;
        b.set_to_write_vbr_tag(false).map_err(|e| err("info tag", e))?;
        Ok(Mp3Encoder { lame: b.build().map_err(|e| err("parameters", e))?, scratch: Vec::new() })
    }
}

impl FormatEncoder for Mp3Encoder {
    fn header(&mut self) -> Result<Vec<u8>, AudioError> {
        Ok(Vec::new())
    }

    fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), AudioError> {
        if samples.is_empty() {
            return Ok(());
        }
        self.scratch.clear();
        self.scratch.extend(clamped(samples));
        out.reserve(mp3lame_encoder::max_required_buffer_size(samples.len()));
        self.lame.encode_to_vec(MonoPcm(&self.scratch[..]), out).map_err(|e| err("encoding", e))?;
        Ok(())
    }

    fn finish(mut self: Box<Self>, out: &mut Vec<u8>) -> Result<(), AudioError> {
        // LAME documents 7200 bytes as enough for the final frames.
        out.reserve(7200);
        self.lame.flush_to_vec::<FlushGap>(out).map_err(|e| err("flush", e))?;
        Ok(())
    }
}
