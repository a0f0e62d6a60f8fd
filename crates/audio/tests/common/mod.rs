//! Test signals, files made from them, and measurements.
#![allow(dead_code)]

use std::f64::consts::PI;
use std::io::Cursor;

pub fn sine(freq: f64, rate: u32, seconds: f64, amplitude: f32) -> Vec<f32> {
    let n = (seconds * f64::from(rate)).round() as usize;
    (0..n).map(|i| amplitude * (2.0 * PI * freq * i as f64 / f64::from(rate)).sin() as f32).collect()
}

/// A linear sweep from `f0` to `f1` Hz.
pub fn sweep(f0: f64, f1: f64, rate: u32, seconds: f64, amplitude: f32) -> Vec<f32> {
    let n = (seconds * f64::from(rate)).round() as usize;
    let k = (f1 - f0) / seconds;
    (0..n)
        .map(|i| {
            let t = i as f64 / f64::from(rate);
            amplitude * (2.0 * PI * (f0 * t + 0.5 * k * t * t)).sin() as f32
        })
        .collect()
}

/// Interleave equal-length channels.
pub fn interleave(channels: &[Vec<f32>]) -> Vec<f32> {
    let n = channels[0].len();
    (0..n).flat_map(|i| channels.iter().map(move |c| c[i])).collect()
}

/// A 16-bit PCM WAV of interleaved samples.
pub fn wav_i16(interleaved: &[f32], channels: u16, rate: u32) -> Vec<u8> {
    let spec =
        hound::WavSpec { channels, sample_rate: rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut cursor = Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut cursor, spec).unwrap();
    for &s in interleaved {
        w.write_sample((s * 32768.0).round().clamp(-32768.0, 32767.0) as i16).unwrap();
    }
    w.finalize().unwrap();
    cursor.into_inner()
}

/// A 24-bit integer WAV.
pub fn wav_i24(interleaved: &[f32], channels: u16, rate: u32) -> Vec<u8> {
    let spec =
        hound::WavSpec { channels, sample_rate: rate, bits_per_sample: 24, sample_format: hound::SampleFormat::Int };
    let mut cursor = Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut cursor, spec).unwrap();
    for &s in interleaved {
        w.write_sample((s * 8_388_608.0).round().clamp(-8_388_608.0, 8_388_607.0) as i32).unwrap();
    }
    w.finalize().unwrap();
    cursor.into_inner()
}

/// A 32-bit float WAV.
pub fn wav_f32(interleaved: &[f32], channels: u16, rate: u32) -> Vec<u8> {
    let spec =
        hound::WavSpec { channels, sample_rate: rate, bits_per_sample: 32, sample_format: hound::SampleFormat::Float };
    let mut cursor = Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut cursor, spec).unwrap();
    for &s in interleaved {
        w.write_sample(s).unwrap();
    }
    w.finalize().unwrap();
    cursor.into_inner()
}

/// The amplitude of the `freq` Hz component (Goertzel), for a sinusoid that fits the window.
pub fn amplitude_at(samples: &[f32], rate: u32, freq: f64) -> f64 {
    let w = 2.0 * PI * freq / f64::from(rate);
    let coeff = 2.0 * w.cos();
    let (mut s1, mut s2) = (0.0f64, 0.0f64);
    for &x in samples {
        let s0 = f64::from(x) + coeff * s1 - s2;
        s2 = s1;
        s1 = s0;
    }
    let power = s1 * s1 + s2 * s2 - coeff * s1 * s2;
    2.0 * power.max(0.0).sqrt() / samples.len() as f64
}

/// Frequency from zero crossings: fine for one clean tone.
pub fn zero_crossing_frequency(samples: &[f32], rate: u32) -> f64 {
    let crossings = samples.windows(2).filter(|w| (w[0] < 0.0) != (w[1] < 0.0)).count();
    crossings as f64 / 2.0 / (samples.len() as f64 / f64::from(rate))
}

pub fn rms(samples: &[f32]) -> f64 {
    (samples.iter().map(|&s| f64::from(s) * f64::from(s)).sum::<f64>() / samples.len().max(1) as f64).sqrt()
}

/// Drop `edge` samples from both ends, where filters ring.
pub fn middle(samples: &[f32], edge: usize) -> &[f32] {
    &samples[edge.min(samples.len())..samples.len().saturating_sub(edge).max(edge.min(samples.len()))]
}

/// Deterministic pseudo-random bytes (xorshift).
pub fn noise_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}
