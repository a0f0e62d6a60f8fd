//! Uploads: every supported input shape to mono 16 kHz, and every way an upload can be wrong.
mod common;

use common::*;
use llmr_audio::{decode, encode, AudioError, DecodeLimits, OutputFormat, Pcm};

const WHISPER_RATE: u32 = 16_000;

fn limits() -> DecodeLimits {
    DecodeLimits::default()
}

fn decode16(bytes: &[u8]) -> Result<Pcm, AudioError> {
    decode(bytes, None, WHISPER_RATE, &limits())
}

/// Within one output frame of the expected duration.
fn assert_duration(pcm: &Pcm, seconds: f64) {
    let frame = 1.0 / f64::from(pcm.sample_rate);
    assert!(
        (pcm.duration_seconds() - seconds).abs() <= frame + 1e-9,
        "duration {} s, expected {seconds} s",
        pcm.duration_seconds()
    );
}

/// `freq` dominates: close to `amplitude`, and another frequency is absent.
fn assert_tone(samples: &[f32], rate: u32, freq: f64, amplitude: f64, tolerance: f64) {
    let m = middle(samples, rate as usize / 20);
    let a = amplitude_at(m, rate, freq);
    assert!((a - amplitude).abs() <= tolerance, "{freq} Hz at amplitude {a}, expected {amplitude}");
    let other = amplitude_at(m, rate, freq * 1.37);
    assert!(other < 0.02, "{} Hz present at amplitude {other}", freq * 1.37);
}

#[test]
fn stereo_44k_wav_is_downmixed_and_resampled_to_16k() {
    let left = sine(440.0, 44_100, 1.5, 0.5);
    let right = left.clone();
    let pcm = decode16(&wav_i16(&interleave(&[left, right]), 2, 44_100)).unwrap();
    assert_eq!(pcm.sample_rate, WHISPER_RATE);
    assert_duration(&pcm, 1.5);
    assert_tone(&pcm.samples, WHISPER_RATE, 440.0, 0.5, 0.005);
    let f = zero_crossing_frequency(middle(&pcm.samples, 800), WHISPER_RATE);
    assert!((f - 440.0).abs() < 2.0, "zero crossings say {f} Hz");
}

#[test]
fn channels_are_averaged() {
    // Opposite channels cancel.
    let left = sine(440.0, 48_000, 0.5, 0.5);
    let right: Vec<f32> = left.iter().map(|s| -s).collect();
    let pcm = decode16(&wav_i16(&interleave(&[left, right]), 2, 48_000)).unwrap();
    assert!(rms(&pcm.samples) < 1e-3, "rms {}", rms(&pcm.samples));

    // Different tones each come through at half their amplitude.
    let left = sine(440.0, 48_000, 1.0, 0.8);
    let right = sine(1_000.0, 48_000, 1.0, 0.8);
    let pcm = decode16(&wav_i16(&interleave(&[left, right]), 2, 48_000)).unwrap();
    let m = middle(&pcm.samples, 800);
    assert!((amplitude_at(m, WHISPER_RATE, 440.0) - 0.4).abs() < 0.005);
    assert!((amplitude_at(m, WHISPER_RATE, 1_000.0) - 0.4).abs() < 0.005);

    // Six channels (written as WAVE_FORMAT_EXTENSIBLE): one tone in the first channel only.
    let mut channels = vec![vec![0.0f32; 16_000]; 6];
    channels[0] = sine(440.0, 16_000, 1.0, 0.6);
    let pcm = decode16(&wav_i16(&interleave(&channels), 6, 16_000)).unwrap();
    assert_duration(&pcm, 1.0);
    assert_tone(&pcm.samples, WHISPER_RATE, 440.0, 0.1, 0.002);
}

#[test]
fn telephone_8k_is_upsampled() {
    let pcm = decode16(&wav_i16(&sine(300.0, 8_000, 2.0, 0.5), 1, 8_000)).unwrap();
    assert_eq!(pcm.samples.len(), 32_000);
    assert_tone(&pcm.samples, WHISPER_RATE, 300.0, 0.5, 0.005);
}

#[test]
fn wav_at_the_target_rate_is_bit_exact() {
    let x = sweep(100.0, 7_000.0, WHISPER_RATE, 1.0, 0.9);
    let pcm = decode16(&wav_i16(&x, 1, WHISPER_RATE)).unwrap();
    assert_eq!(pcm.samples.len(), x.len());
    let worst = pcm.samples.iter().zip(&x).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst <= 0.5 / 32_768.0, "{worst}");
}

#[test]
fn wav_sample_formats() {
    let x = sine(440.0, 22_050, 1.0, 0.5);
    for (name, bytes) in [("24-bit", wav_i24(&x, 1, 22_050)), ("float", wav_f32(&x, 1, 22_050))] {
        let pcm = decode16(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_duration(&pcm, 1.0);
        assert_tone(&pcm.samples, WHISPER_RATE, 440.0, 0.5, 0.005);
    }
}

#[test]
fn flac_is_lossless() {
    let x = sweep(50.0, 10_000.0, 22_050, 1.7, 0.9);
    let flac = encode(OutputFormat::Flac, &x, 22_050).unwrap();
    let pcm = decode(&flac, Some("speech.flac"), 22_050, &limits()).unwrap();
    assert_eq!(pcm.samples.len(), x.len());
    let worst = pcm.samples.iter().zip(&x).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst <= 0.5 / 32_768.0, "{worst}");
}

#[cfg(feature = "mp3")]
#[test]
fn mp3_decodes() {
    let mp3 = encode(OutputFormat::Mp3, &sine(440.0, 22_050, 3.0, 0.5), 22_050).unwrap();
    let pcm = decode(&mp3, Some("speech.mp3"), WHISPER_RATE, &limits()).unwrap();
    // A streamed MP3 has no info tag, so the encoder's delay and padding (about a frame and a
    // half of silence) stay in.
    assert!(pcm.duration_seconds() >= 3.0 && pcm.duration_seconds() < 3.1, "{} s", pcm.duration_seconds());
    assert_tone(&pcm.samples, WHISPER_RATE, 440.0, 0.5, 0.05);
}

#[cfg(feature = "opus")]
#[test]
fn ogg_opus_decodes_to_the_exact_length() {
    // Pre-skip and the end trim make Ogg Opus sample-exact.
    let opus = encode(OutputFormat::Opus, &sine(440.0, 24_000, 2.5, 0.5), 24_000).unwrap();
    let pcm = decode(&opus, Some("speech.opus"), WHISPER_RATE, &limits()).unwrap();
    assert_duration(&pcm, 2.5);
    assert_tone(&pcm.samples, WHISPER_RATE, 440.0, 0.5, 0.05);
}

#[test]
fn the_file_name_is_only_a_hint() {
    let wav = wav_i16(&sine(440.0, 16_000, 0.5, 0.5), 1, 16_000);
    for name in ["audio.mp3", "recording.webm", "file", "no.extension.", "x.TXT"] {
        let pcm = decode(&wav, Some(name), WHISPER_RATE, &limits()).unwrap();
        assert_duration(&pcm, 0.5);
    }
}

#[test]
fn truncated_files_give_what_is_there() {
    let x = sine(440.0, 22_050, 4.0, 0.5);
    let files = [
        Some(("wav", wav_i16(&x, 1, 22_050))),
        Some(("flac", encode(OutputFormat::Flac, &x, 22_050).unwrap())),
        cfg!(feature = "mp3").then(|| ("mp3", encode(OutputFormat::Mp3, &x, 22_050).unwrap())),
        cfg!(feature = "opus").then(|| ("opus", encode(OutputFormat::Opus, &x, 22_050).unwrap())),
    ];
    for (name, bytes) in files.into_iter().flatten() {
        // Cut at 60%, mid-packet (and mid-page for Ogg): the last partial packet is lost, the rest decodes.
        let cut = &bytes[..bytes.len() * 6 / 10 + 3];
        let pcm = decode16(cut).unwrap_or_else(|e| panic!("{name}: {e}"));
        let d = pcm.duration_seconds();
        assert!(d > 1.5 && d < 2.7, "{name}: {d} s from 60% of a 4 s file");
        assert_tone(&pcm.samples, WHISPER_RATE, 440.0, 0.5, 0.05);
    }
}

#[test]
fn files_cut_before_any_audio_are_corrupt() {
    let x = sine(440.0, 22_050, 1.0, 0.5);
    let wav = wav_i16(&x, 1, 22_050);
    let flac = encode(OutputFormat::Flac, &x, 22_050).unwrap();
    // Inside the header, right after it, and inside the first FLAC frame.
    for (name, cut) in [("wav", &wav[..30]), ("wav", &wav[..44]), ("flac", &flac[..30]), ("flac", &flac[..100])] {
        match decode16(cut) {
            Err(e @ AudioError::Corrupt(_)) => {
                assert_eq!((e.status(), e.field()), (400, Some("file")));
            }
            other => panic!("{name} cut to {} bytes: {other:?}", cut.len()),
        }
    }
}

#[test]
fn nothing_to_decode_is_empty() {
    assert!(matches!(decode16(&[]), Err(AudioError::Empty)));
    // A valid WAV whose data chunk holds no samples.
    assert!(matches!(decode16(&wav_i16(&[], 1, 16_000)), Err(AudioError::Empty)));
}

#[test]
fn things_that_are_not_audio() {
    let text = b"WEBVTT\n\n00:00.000 --> 00:01.000\nThis is a subtitle file, not audio.\n".repeat(50);
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("text", text),
        ("json", br#"{"model":"whisper-1","language":"en"}"#.to_vec()),
        ("zeros", vec![0; 50_000]),
        ("random 1 KB", noise_bytes(1_000, 7)),
        ("random 2 MB", noise_bytes(2_000_000, 8)),
        ("png", [b"\x89PNG\r\n\x1a\n".as_slice(), &noise_bytes(5_000, 9)].concat()),
    ];
    for (name, bytes) in inputs {
        match decode16(&bytes) {
            Err(e @ AudioError::NotAudio(_)) => assert_eq!((e.status(), e.code()), (400, "invalid_audio_format")),
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn too_long_stops_decoding_at_the_limit() {
    // 10 minutes at 8 kHz; a 30 s limit must stop right after 30 s, not decode the rest.
    let minutes = sine(200.0, 8_000, 600.0, 0.3);
    let wav = wav_i16(&minutes, 1, 8_000);
    let limits = DecodeLimits { max_bytes: usize::MAX, max_seconds: 30.0 };
    match decode(&wav, None, WHISPER_RATE, &limits) {
        Err(e @ AudioError::TooLong { seconds, max_seconds }) => {
            assert_eq!(max_seconds, 30.0);
            assert!(seconds > 30.0 && seconds < 30.5, "stopped at {seconds} s");
            assert_eq!((e.status(), e.field()), (413, Some("file")));
        }
        other => panic!("{other:?}"),
    }
    // Exactly at the limit is fine.
    let wav = wav_i16(&sine(200.0, 8_000, 5.0, 0.3), 1, 8_000);
    let limits = DecodeLimits { max_bytes: usize::MAX, max_seconds: 5.0 };
    assert_duration(&decode(&wav, None, WHISPER_RATE, &limits).unwrap(), 5.0);
}

#[test]
fn too_large_is_checked_before_parsing() {
    let limits = DecodeLimits { max_bytes: 1_000, max_seconds: 60.0 };
    // Even bytes that are not audio are refused for their size first: nothing is parsed.
    match decode(&noise_bytes(1_001, 3), None, WHISPER_RATE, &limits) {
        Err(e @ AudioError::TooLarge { bytes: 1_001, max_bytes: 1_000 }) => {
            assert_eq!((e.status(), e.field(), e.code()), (413, Some("file"), "file_too_large"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn impossible_sample_rates() {
    let wav = wav_i16(&sine(440.0, 16_000, 0.2, 0.5), 1, 16_000);
    for rate in [0u32, 10_000_000, u32::MAX] {
        let mut bad = wav.clone();
        bad[24..28].copy_from_slice(&rate.to_le_bytes());
        match decode16(&bad) {
            Err(e @ AudioError::BadSampleRate(r)) => {
                assert_eq!(r, rate);
                assert_eq!((e.status(), e.field()), (400, Some("file")));
                assert!(e.to_string().contains(&format!("{rate} Hz")), "{e}");
            }
            other => panic!("{rate} Hz: {other:?}"),
        }
    }
    // The caller's target rate is checked too.
    assert!(matches!(decode(&wav, None, 0, &limits()), Err(AudioError::BadSampleRate(0))));
}

#[test]
fn damaged_headers_are_errors_not_panics() {
    let wav = wav_i16(&sine(440.0, 16_000, 0.2, 0.5), 1, 16_000);
    // RIFF size 0, no channels, 0 bits per sample, a format tag nobody uses.
    for (offset, bytes) in [(4usize, vec![0u8; 4]), (22, vec![0; 2]), (34, vec![0; 2]), (20, vec![0x34, 0x12])] {
        let mut bad = wav.clone();
        bad[offset..offset + bytes.len()].copy_from_slice(&bytes);
        match decode16(&bad) {
            Err(AudioError::Corrupt(_) | AudioError::Unsupported(_)) => {}
            other => panic!("header byte {offset}: {other:?}"),
        }
    }
}
