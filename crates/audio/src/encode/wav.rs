//! Streaming RIFF WAVE, 16-bit PCM mono.
//!
//! The header goes out before the length is known, so both sizes (RIFF and `data`) are
//! 0xFFFFFFFF, the convention for "unknown, read to the end" that ffmpeg, libsndfile, symphonia
//! and OpenAI's own streamed WAV use. A size of 0 would be the other choice, but strict readers
//! (hound, Python's `wave`) then see an empty file; 0xFFFFFFFF makes them read until EOF.

use super::FormatEncoder;
use crate::error::AudioError;
use crate::pcm::extend_s16le;

const UNKNOWN_SIZE: u32 = u32::MAX;
pub(super) const HEADER_LEN: usize = 44;

pub(super) struct WavEncoder {
    rate: u32,
}

impl WavEncoder {
    pub(super) fn new(rate: u32) -> Self {
        WavEncoder { rate }
    }
}

impl FormatEncoder for WavEncoder {
    fn header(&mut self) -> Result<Vec<u8>, AudioError> {
        const CHANNELS: u16 = 1;
        const BITS: u16 = 16;
        let block_align = CHANNELS * BITS / 8;
        let mut h = Vec::with_capacity(HEADER_LEN);
        h.extend_from_slice(b"RIFF");
        h.extend_from_slice(&UNKNOWN_SIZE.to_le_bytes());
        h.extend_from_slice(b"WAVEfmt ");
        h.extend_from_slice(&16u32.to_le_bytes());
        h.extend_from_slice(&1u16.to_le_bytes()); // WAVE_FORMAT_PCM
        h.extend_from_slice(&CHANNELS.to_le_bytes());
        h.extend_from_slice(&self.rate.to_le_bytes());
        h.extend_from_slice(&(self.rate * u32::from(block_align)).to_le_bytes());
        h.extend_from_slice(&block_align.to_le_bytes());
        h.extend_from_slice(&BITS.to_le_bytes());
        h.extend_from_slice(b"data");
        h.extend_from_slice(&UNKNOWN_SIZE.to_le_bytes());
        debug_assert_eq!(h.len(), HEADER_LEN);
        Ok(h)
    }

    fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), AudioError> {
        extend_s16le(out, samples);
        Ok(())
    }

    fn finish(self: Box<Self>, _out: &mut Vec<u8>) -> Result<(), AudioError> {
        Ok(())
    }
}

/// Replace the unknown sizes in a complete file's header with the real ones (when they fit).
pub(super) fn fill_in_sizes(file: &mut [u8]) {
    let data = file.len().saturating_sub(HEADER_LEN);
    let (Ok(riff), Ok(data)) = (u32::try_from(file.len() - 8), u32::try_from(data)) else {
        return;
    };
    file[4..8].copy_from_slice(&riff.to_le_bytes());
    file[40..44].copy_from_slice(&data.to_le_bytes());
}
