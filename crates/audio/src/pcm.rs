//! Mono f32 audio in memory, and the one conversion every integer encoder shares.

/// Mono audio, samples nominally in [-1, 1].
#[derive(Debug, Clone, PartialEq)]
pub struct Pcm {
    pub samples: Vec<f32>,
    pub sample_rate: u32,
}

impl Pcm {
    pub fn duration_seconds(&self) -> f64 {
        if self.sample_rate == 0 {
            return 0.0;
        }
        self.samples.len() as f64 / f64::from(self.sample_rate)
    }
}

/// f32 in [-1, 1] to i16, rounding to nearest and clamping what lies outside (TTS output can
/// overshoot). NaN becomes 0. Scaled by 32768, the inverse of how decoders (symphonia among them)
/// turn i16 into f32, so 16-bit audio survives a round trip exactly; +1.0 clips by one step.
pub(crate) fn to_i16(sample: f32) -> i16 {
    if sample.is_nan() {
        return 0;
    }
    (sample * 32768.0).round().clamp(-32768.0, 32767.0) as i16
}

/// Append `samples` as signed 16-bit little-endian.
pub(crate) fn extend_s16le(out: &mut Vec<u8>, samples: &[f32]) {
    out.reserve(samples.len() * 2);
    for &s in samples {
        out.extend_from_slice(&to_i16(s).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamps_and_rounds() {
        assert_eq!(to_i16(0.0), 0);
        assert_eq!(to_i16(1.0), 32767);
        assert_eq!(to_i16(-1.0), -32768);
        assert_eq!(to_i16(3.5), 32767);
        assert_eq!(to_i16(-7.0), -32768);
        assert_eq!(to_i16(f32::INFINITY), 32767);
        assert_eq!(to_i16(f32::NEG_INFINITY), -32768);
        assert_eq!(to_i16(f32::NAN), 0);
        assert_eq!(to_i16(0.5), 16384);
        // Every i16, as a decoder turns it into f32, comes back unchanged.
        for i in i16::MIN..=i16::MAX {
            assert_eq!(to_i16(f32::from(i) / 32768.0), i);
        }
    }

    #[test]
    fn duration() {
        let pcm = Pcm { samples: vec![0.0; 24_000], sample_rate: 16_000 };
        assert_eq!(pcm.duration_seconds(), 1.5);
    }
}
