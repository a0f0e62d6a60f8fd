//! Streaming FLAC, 16-bit mono, with flacenc (pure Rust).
//!
//! STREAMINFO goes out first, so what is only known at the end stays "unknown" as the format
//! allows: total samples 0, frame sizes 0, MD5 all zero. Blocks are fixed at 4096 samples (the
//! reference encoder's default); each full block is encoded and sent as it fills, the short last
//! one at the end.

use flacenc::bitsink::MemSink;
use flacenc::component::{BitRepr, Stream};
use flacenc::config;
use flacenc::error::{Verified, Verify};
use flacenc::source::{Fill, FrameBuf};

use super::FormatEncoder;
use crate::error::AudioError;
use crate::pcm::to_i16;

const BLOCK: usize = 4096;
const BITS: usize = 16;

pub(super) struct FlacEncoder {
    stream: Stream,
    config: Verified<config::Encoder>,
    frame: FrameBuf,
    frame_number: usize,
    pending: Vec<i32>,
    sink: MemSink<u8>,
}

fn err(what: &str, e: impl std::fmt::Display) -> AudioError {
    AudioError::Encode(format!("FLAC {what}: {e}"))
}

impl FlacEncoder {
    pub(super) fn new(rate: u32) -> Result<Self, AudioError> {
        let mut stream = Stream::new(rate as usize, 1, BITS).map_err(|e| err("stream", e))?;
        let info = stream.stream_info_mut();
        info.set_block_sizes(BLOCK, BLOCK).map_err(|e| err("block size", e))?;
        info.set_frame_sizes(0, 0).map_err(|e| err("frame size", e))?;
        let mut encoder_config = config::Encoder::default();
        encoder_config.block_size = BLOCK;
        encoder_config.multithread = false;
        let config = encoder_config.into_verified().map_err(|(_, e)| err("config", e))?;
        Ok(FlacEncoder {
            stream,
            config,
            frame: FrameBuf::with_size(1, BLOCK).map_err(|e| err("frame buffer", e))?,
            frame_number: 0,
            pending: Vec::with_capacity(BLOCK),
            sink: MemSink::new(),
        })
    }

    fn encode_block(&mut self, block: &[i32], out: &mut Vec<u8>) -> Result<(), AudioError> {
        self.frame.fill_interleaved(block).map_err(|e| err("input", e))?;
        let frame =
            flacenc::encode_fixed_size_frame(&self.config, &self.frame, self.frame_number, self.stream.stream_info())
                .map_err(|e| err("frame", e))?;
        self.frame_number += 1;
        self.sink.clear();
        frame.write(&mut self.sink).map_err(|e| err("frame", e))?;
        out.extend_from_slice(self.sink.as_slice());
        Ok(())
    }
}

impl FormatEncoder for FlacEncoder {
    fn header(&mut self) -> Result<Vec<u8>, AudioError> {
        self.sink.clear();
        // A stream with no frames yet writes as "fLaC" + STREAMINFO.
        self.stream.write(&mut self.sink).map_err(|e| err("header", e))?;
        Ok(self.sink.as_slice().to_vec())
    }

    fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), AudioError> {
        for &s in samples {
            self.pending.push(i32::from(to_i16(s)));
            if self.pending.len() == BLOCK {
                let block = std::mem::take(&mut self.pending);
                self.encode_block(&block, out)?;
                self.pending = block;
                self.pending.clear();
            }
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>, out: &mut Vec<u8>) -> Result<(), AudioError> {
        if !self.pending.is_empty() {
            let block = std::mem::take(&mut self.pending);
            self.encode_block(&block, out)?;
        }
        Ok(())
    }
}
