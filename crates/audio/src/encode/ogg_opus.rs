//! Opus in Ogg (RFC 7845) with libopus (vendored and statically linked by `opusic-sys`): mono,
//! 20 ms frames, 48 kbit/s VBR. Every push ends an Ogg page, so its audio goes out at once, and
//! pages hold at most a second: a player decodes whole pages only, and a file cut short loses
//! no more than its last page.
//!
//! Granule positions count 48 kHz samples whatever the encoder's rate. The encoder's lookahead
//! becomes the header's pre-skip, and the last page's granule position trims the padding that
//! completes the last frame, so a decoder gives back exactly the samples pushed.

use ogg::writing::{PacketWriteEndInfo, PacketWriter};

use super::{clamped, FormatEncoder};
use crate::error::AudioError;

const GRANULE_RATE: u64 = 48_000;
const BITRATE: i32 = 48_000;
/// libopus's recommended maximum packet size.
const MAX_PACKET: usize = 4_000;
/// 50 frames of 20 ms.
const MAX_PAGE_PACKETS: usize = 50;
/// Any value will do for a file with a single logical stream.
const SERIAL: u32 = 0x6c6c_6d72;

pub(super) struct OggOpusEncoder {
    opus: opus::Encoder,
    rate: u32,
    /// Samples per 20 ms frame at `rate`.
    frame: usize,
    /// 48 kHz samples per input sample.
    granule_step: u64,
    pre_skip: u16,
    pending: Vec<f32>,
    /// Input samples pushed so far (at `rate`).
    pushed: u64,
    /// Samples encoded so far (at `rate`), padding included.
    encoded: u64,
    packet: Vec<u8>,
    writer: PacketWriter<'static, Vec<u8>>,
}

fn err(what: &str, e: impl std::fmt::Display) -> AudioError {
    AudioError::Encode(format!("Opus {what}: {e}"))
}

impl OggOpusEncoder {
    /// `rate` must be one libopus accepts (see `format::OPUS_RATES`).
    pub(super) fn new(rate: u32) -> Result<Self, AudioError> {
        let mut opus =
            opus::Encoder::new(rate, opus::Channels::Mono, opus::Application::Audio).map_err(|e| err("encoder", e))?;
        opus.set_bitrate(opus::Bitrate::Bits(BITRATE)).map_err(|e| err("bitrate", e))?;
        let granule_step = GRANULE_RATE / u64::from(rate);
        let lookahead = opus.get_lookahead().map_err(|e| err("lookahead", e))?;
        let pre_skip = u16::try_from(lookahead.max(0) as u64 * granule_step).map_err(|e| err("pre-skip", e))?;
        Ok(OggOpusEncoder {
            opus,
            rate,
            frame: rate as usize / 50,
            granule_step,
            pre_skip,
            pending: Vec::new(),
            pushed: 0,
            encoded: 0,
            packet: vec![0; MAX_PACKET],
            writer: PacketWriter::new(Vec::new()),
        })
    }

    /// Encode every full frame in `pending`; the last one ends its Ogg page with `end`.
    fn encode_frames(&mut self, end: PacketWriteEndInfo, final_granule: Option<u64>) -> Result<(), AudioError> {
        let frames = self.pending.len() / self.frame;
        for i in 0..frames {
            let input = &self.pending[i * self.frame..(i + 1) * self.frame];
            let len = self.opus.encode_float(input, &mut self.packet).map_err(|e| err("encoding", e))?;
            self.encoded += self.frame as u64;
            let last = i + 1 == frames;
            let granule = match final_granule {
                Some(g) if last => g,
                _ => self.encoded * self.granule_step,
            };
            let info = if last {
                end
            } else if (i + 1) % MAX_PAGE_PACKETS == 0 {
                PacketWriteEndInfo::EndPage
            } else {
                PacketWriteEndInfo::NormalPacket
            };
            self.writer.write_packet(self.packet[..len].to_vec(), SERIAL, info, granule).map_err(|e| err("page", e))?;
        }
        self.pending.drain(..frames * self.frame);
        Ok(())
    }

    fn drain_pages(&mut self, out: &mut Vec<u8>) {
        out.append(self.writer.inner_mut());
    }
}

impl FormatEncoder for OggOpusEncoder {
    fn header(&mut self) -> Result<Vec<u8>, AudioError> {
        let mut head = Vec::with_capacity(19);
        head.extend_from_slice(b"OpusHead");
        head.push(1); // version
        head.push(1); // channels
        head.extend_from_slice(&self.pre_skip.to_le_bytes());
        head.extend_from_slice(&self.rate.to_le_bytes()); // original rate, informational
        head.extend_from_slice(&0i16.to_le_bytes()); // output gain
        head.push(0); // channel mapping family 0: mono or stereo, no table
        let vendor = format!("llmr, libopus {}", opus::version());
        let mut tags = Vec::with_capacity(16 + vendor.len());
        tags.extend_from_slice(b"OpusTags");
        tags.extend_from_slice(&(vendor.len() as u32).to_le_bytes());
        tags.extend_from_slice(vendor.as_bytes());
        tags.extend_from_slice(&0u32.to_le_bytes()); // no user comments

        // Each header packet must end its own page (RFC 7845, section 3).
        for packet in [head, tags] {
            self.writer.write_packet(packet, SERIAL, PacketWriteEndInfo::EndPage, 0).map_err(|e| err("header", e))?;
        }
        let mut out = Vec::new();
        self.drain_pages(&mut out);
        Ok(out)
    }

    fn push(&mut self, samples: &[f32], out: &mut Vec<u8>) -> Result<(), AudioError> {
        self.pushed += samples.len() as u64;
        self.pending.extend(clamped(samples));
        self.encode_frames(PacketWriteEndInfo::EndPage, None)?;
        self.drain_pages(out);
        Ok(())
    }

    fn finish(mut self: Box<Self>, out: &mut Vec<u8>) -> Result<(), AudioError> {
        // Feed silence past the encoder's lookahead so the last real samples come out, completing
        // the last frame; at least one packet, since the end-of-stream flag rides on a packet.
        let lookahead = u64::from(self.pre_skip) / self.granule_step;
        let needed = (self.pushed + lookahead).saturating_sub(self.encoded).max(1);
        let total = (needed as usize).div_ceil(self.frame) * self.frame;
        self.pending.resize(total, 0.0);
        let final_granule = u64::from(self.pre_skip) + self.pushed * self.granule_step;
        self.encode_frames(PacketWriteEndInfo::EndStream, Some(final_granule))?;
        self.drain_pages(out);
        Ok(())
    }
}
