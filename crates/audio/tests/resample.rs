mod common;

use common::*;
use llmr_audio::{resample, AudioError, StreamResampler};

#[test]
fn output_length_is_exact_for_common_rate_pairs() {
    for (from, to, n) in [
        (44_100, 16_000, 44_100),
        (48_000, 16_000, 12_345),
        (22_050, 24_000, 22_050 * 2 + 7),
        (8_000, 16_000, 8_000),
        (16_000, 16_000, 999),
        (11_025, 48_000, 1),
        (24_000, 22_050, 0),
    ] {
        let out = resample(&vec![0.1; n], from, to).unwrap();
        let want = (n as u64 * to as u64).div_ceil(from as u64) as usize;
        assert_eq!(out.len(), want, "{from} -> {to}, {n} samples");
    }
}

#[test]
fn equal_rates_pass_samples_through_untouched() {
    let x = sine(440.0, 16_000, 0.1, 0.5);
    assert_eq!(resample(&x, 16_000, 16_000).unwrap(), x);
}

#[test]
fn a_tone_keeps_its_frequency_amplitude_and_phase() {
    // Downsampling: compare with the same tone generated directly at the output rate, which
    // also shows the filter delay is removed (a shift would show as a large difference).
    let x = sine(440.0, 44_100, 1.0, 0.5);
    let y = resample(&x, 44_100, 16_000).unwrap();
    let reference = sine(440.0, 16_000, 1.0, 0.5);
    assert_eq!(y.len(), reference.len());
    let worst = middle(&y, 800).iter().zip(middle(&reference, 800)).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst < 2e-3, "max deviation from the ideal tone {worst}");

    // Upsampling 8 kHz telephone audio.
    let x = sine(300.0, 8_000, 1.0, 0.5);
    let y = resample(&x, 8_000, 16_000).unwrap();
    let reference = sine(300.0, 16_000, 1.0, 0.5);
    let worst = middle(&y, 800).iter().zip(middle(&reference, 800)).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst < 2e-3, "max deviation from the ideal tone {worst}");
}

#[test]
fn content_above_the_new_nyquist_frequency_is_removed() {
    // 10 kHz cannot exist at 16 kHz; without an anti-aliasing filter it would fold to 6 kHz.
    let x = sine(10_000.0, 44_100, 1.0, 0.5);
    let y = resample(&x, 44_100, 16_000).unwrap();
    let folded = amplitude_at(middle(&y, 800), 16_000, 6_000.0);
    assert!(folded < 0.5 * 1e-5, "aliased 6 kHz at amplitude {folded} (should be 100 dB down at least)");
    assert!(rms(middle(&y, 800)) < 1e-5);
    // A sweep across the band keeps what is below ~7.8 kHz.
    let x = sweep(100.0, 7_000.0, 48_000, 2.0, 0.5);
    let y = resample(&x, 48_000, 16_000).unwrap();
    let (rin, rout) = (rms(middle(&x, 2400)), rms(middle(&y, 800)));
    assert!((rout / rin - 1.0).abs() < 0.01, "sweep rms {rin} -> {rout}");
}

#[test]
fn streaming_in_odd_chunks_matches_one_shot() {
    let x = sweep(50.0, 10_000.0, 22_050, 1.3, 0.8);
    let whole = resample(&x, 22_050, 24_000).unwrap();
    let mut r = StreamResampler::new(22_050, 24_000).unwrap();
    let mut streamed = Vec::new();
    let mut rest = &x[..];
    for size in [1, 17, 4096, 3, 10_000].iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (chunk, tail) = rest.split_at((*size).min(rest.len()));
        r.push(chunk, &mut streamed).unwrap();
        rest = tail;
    }
    r.finish(&mut streamed).unwrap();
    assert_eq!(streamed.len(), whole.len());
    let worst = streamed.iter().zip(&whole).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst < 1e-6, "streamed differs from one-shot by {worst}");
}

#[test]
fn streaming_returns_output_before_the_end() {
    let mut r = StreamResampler::new(22_050, 24_000).unwrap();
    let mut out = Vec::new();
    r.push(&sine(440.0, 22_050, 1.0, 0.5), &mut out).unwrap();
    // Only the filter's delay and the last partial block are held back: under 150 ms here.
    assert!(out.len() > 24_000 - 3_600, "only {} of 24000 samples out", out.len());
}

#[test]
fn absurd_rates_are_refused() {
    for (from, to) in [(0, 16_000), (16_000, 0), (10_000_000, 16_000), (500, 16_000)] {
        match resample(&[0.0; 10], from, to) {
            Err(AudioError::BadSampleRate(r)) => assert!(r == from || r == to),
            other => panic!("{from} -> {to}: {other:?}"),
        }
    }
}
