//! OpenAI's `pcm`: headerless signed 16-bit little-endian mono (the caller resamples to 24 kHz).

use super::FormatEncoder;
use crate::error::AudioError;
use crate::pcm::extend_s16le;

pub(super) struct RawEncoder;

impl FormatEncoder for RawEncoder {
    fn header(&mut self) -> Result<Vec<u8>, AudioError> {
        Ok(Vec::new())
    }

    fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), AudioError> {
        extend_s16le(out, samples);
        Ok(())
    }

    fn finish(self: Box<Self>, _out: &mut Vec<u8>) -> Result<(), AudioError> {
        Ok(())
    }
}
