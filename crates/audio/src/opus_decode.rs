//! Opus packets to mono f32 at 48 kHz with libopus. Symphonia 0.6 demuxes Opus (from Ogg and
//! from Matroska/WebM, which is what browsers record) but has no Opus decoder of its own.

use symphonia::core::codecs::audio::AudioCodecParameters;
use symphonia::core::packet::Packet;

use crate::error::AudioError;

/// Opus always decodes at 48 kHz; the rate in OpusHead is only the original input's.
pub(crate) const OPUS_RATE: u32 = 48_000;

/// The longest Opus packet: 120 ms at 48 kHz.
const MAX_PACKET_FRAMES: usize = 5_760;

pub(crate) struct OpusDecoder {
    decoder: opus::Decoder,
    buf: Vec<f32>,
    /// Samples still to drop from the start when the demuxer does not trim packets itself
    /// (Matroska gives pre-skip only through OpusHead).
    pre_skip_left: usize,
    first_packet: bool,
}

/// The fields of an OpusHead identification header (RFC 7845, section 5.1) that decoding needs.
struct OpusHead {
    channels: u8,
    pre_skip: u16,
    output_gain_q8: i16,
    /// Opus streams per packet: 1 for mapping family 0, from the mapping table otherwise.
    streams: u8,
}

fn parse_head(data: &[u8]) -> Option<OpusHead> {
    if data.len() < 19 || &data[..8] != b"OpusHead" {
        return None;
    }
    let mapping_family = data[18];
    Some(OpusHead {
        channels: data[9],
        pre_skip: u16::from_le_bytes([data[10], data[11]]),
        output_gain_q8: i16::from_le_bytes([data[16], data[17]]),
        streams: if mapping_family == 0 { 1 } else { *data.get(19)? },
    })
}

impl OpusDecoder {
    pub(crate) fn new(params: &AudioCodecParameters) -> Result<Self, AudioError> {
        let head = params.extra_data.as_deref().and_then(parse_head);
        let channels = match &head {
            Some(h) => usize::from(h.channels),
            None => params.channels.as_ref().map_or(1, |c| c.count()),
        };
        // A mono libopus decoder downmixes a mono or stereo stream itself; packets holding several
        // streams (surround) need the multistream API, which speech uploads have no use for.
        if channels > 2 || head.as_ref().is_some_and(|h| h.streams != 1) {
            return Err(AudioError::Unsupported(format!("multichannel Opus ({channels} channels)")));
        }
        let mut decoder = opus::Decoder::new(OPUS_RATE, opus::Channels::Mono)
            .map_err(|e| AudioError::Unsupported(format!("Opus decoder: {e}")))?;
        if let Some(h) = &head {
            if h.output_gain_q8 != 0 {
                decoder
                    .set_gain(i32::from(h.output_gain_q8))
                    .map_err(|e| AudioError::Corrupt(format!("Opus output gain: {e}")))?;
            }
        }
        Ok(OpusDecoder {
            decoder,
            buf: vec![0.0; MAX_PACKET_FRAMES],
            pre_skip_left: head.map_or(0, |h| usize::from(h.pre_skip)),
            first_packet: true,
        })
    }

    /// Decode one packet, apply the demuxer's trims, and append the mono samples to `out`.
    pub(crate) fn decode(&mut self, packet: &Packet, out: &mut Vec<f32>) -> Result<usize, String> {
        let frames = self.decoder.decode_float(&packet.data, &mut self.buf, false).map_err(|e| e.to_string())?;
        let mut start = (packet.trim_start.get() as usize).min(frames);
        if self.first_packet {
            self.first_packet = false;
            // A demuxer that trims (Ogg) already accounts for pre-skip; one that doesn't (Matroska)
            // leaves it to us.
            if start > 0 {
                self.pre_skip_left = 0;
            }
        }
        if self.pre_skip_left > 0 {
            let skip = self.pre_skip_left.min(frames - start);
            start += skip;
            self.pre_skip_left -= skip;
        }
        let end = frames - (packet.trim_end.get() as usize).min(frames - start);
        out.extend_from_slice(&self.buf[start..end]);
        Ok(end - start)
    }
}
