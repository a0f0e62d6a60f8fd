//! The whisper.cpp plugin on the real Whisper tiny.en model and `jfk.wav`, through the host
//! exactly as a node drives it.
//!
//! Needs the release plugin beside this test binary (`cargo test --release -p llmr-whisper-cpp`)
//! and `scripts/fetch-models whisper-tiny.en jfk` (scripts/test does both).

use llmr_engine_host::{
    load_one, EngineInstance, EngineRegistry, EngineStatus, Format, InstanceConfig, Manifest, ModelSpec, Segment,
    TranscribeParams,
};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
const JFK: &str =
    "and so my fellow americans ask not what your country can do for you ask what you can do for your country";

fn cached(file: &str) -> PathBuf {
    let cache = std::env::var("LLMR_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/llmr/models"));
    let p = cache.join(file);
    assert!(p.is_file(), "{} is missing: run scripts/fetch-models whisper-tiny.en jfk", p.display());
    p
}

fn plugin() -> Arc<llmr_engine_host::Plugin> {
    static PLUGIN: OnceLock<Arc<llmr_engine_host::Plugin>> = OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            let exe = std::env::current_exe().unwrap();
            let lib = exe.parent().unwrap().parent().unwrap().join("libllmr_whisper_cpp.so");
            assert!(lib.is_file(), "{} is missing: run `cargo build --release -p llmr-whisper-cpp`", lib.display());
            let dir =
                std::env::temp_dir().join(format!("llmr-whisper-test-{}", std::process::id())).join("whisper_cpp/cpu");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::copy(format!("{REPO}/engines/whisper_cpp/cpu/manifest.json"), dir.join("manifest.json")).unwrap();
            std::fs::copy(&lib, dir.join("libllmr_whisper_cpp.so")).unwrap();
            let mut registry = EngineRegistry::new();
            load_one(&dir, Manifest::load(&dir, 1).unwrap(), &mut registry).unwrap()
        })
        .clone()
}

fn engine() -> &'static EngineInstance {
    static ENGINE: OnceLock<EngineInstance> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let engine = EngineInstance::create(&plugin(), &InstanceConfig::default()).unwrap();
        let model = cached("whisper/ggml-tiny.en.bin");
        engine.load_model(&ModelSpec::new("tiny.en", Format::Ggml, model.display().to_string())).unwrap();
        engine
    })
}

fn jfk() -> &'static [f32] {
    static PCM: OnceLock<Vec<f32>> = OnceLock::new();
    PCM.get_or_init(|| {
        let bytes = std::fs::read(cached("audio/jfk.wav")).unwrap();
        let limits = llmr_audio::DecodeLimits { max_bytes: 1 << 30, max_seconds: 60.0 };
        llmr_audio::decode(&bytes, Some("jfk.wav"), 16_000, &limits).unwrap().samples
    })
}

fn params(samples: &[f32]) -> TranscribeParams<'_> {
    TranscribeParams {
        request_id: 1,
        model_id: "tiny.en",
        samples,
        sample_rate: 16_000,
        language: None,
        prompt: None,
        temperature: 0.0,
        translate: false,
        word_timestamps: false,
        beam_size: 0,
    }
}

fn transcribe(p: &TranscribeParams<'_>) -> Result<Vec<Segment>, llmr_engine_host::CallError> {
    let mut segments = Vec::new();
    engine().transcribe(p, |s| {
        segments.push(s);
        true
    })?;
    Ok(segments)
}

/// Lowercase words without punctuation: word error rate 0 means these are equal.
fn normalized(text: &str) -> String {
    text.to_lowercase()
        .chars()
        .map(|c| if c.is_alphanumeric() || c == '\'' { c } else { ' ' })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

fn text(segments: &[Segment]) -> String {
    segments.iter().map(|s| s.text.as_str()).collect()
}

#[test]
fn jfk_is_transcribed_word_for_word_in_timed_segments() {
    let segments = transcribe(&params(jfk())).unwrap();
    assert_eq!(normalized(&text(&segments)), JFK, "{segments:#?}");
    let mut last_end = 0;
    for s in &segments {
        assert!(s.start_ms >= last_end && s.end_ms > s.start_ms && s.end_ms <= 11_100, "{s:?}");
        last_end = s.end_ms;
        assert_eq!(s.language.as_deref(), Some("en"));
        assert!(!s.tokens.is_empty() && s.avg_logprob < 0.0 && s.avg_logprob > -1.5, "{s:?}");
        assert!((0.0..=1.0).contains(&s.no_speech_prob));
    }
}

#[test]
fn beam_search_and_a_prompt_hear_the_same_words() {
    let beams = transcribe(&TranscribeParams { beam_size: 5, ..params(jfk()) }).unwrap();
    assert_eq!(normalized(&text(&beams)), JFK);
    let prompted = transcribe(&TranscribeParams { prompt: Some("Inaugural address, 1961."), ..params(jfk()) }).unwrap();
    assert_eq!(normalized(&text(&prompted)), JFK);
}

#[test]
fn word_timestamps_follow_the_speech() {
    let segments = transcribe(&TranscribeParams { word_timestamps: true, ..params(jfk()) }).unwrap();
    let words: Vec<_> = segments.iter().flat_map(|s| s.words.clone()).collect();
    let spoken: Vec<String> = words.iter().map(|w| normalized(&w.text)).collect();
    assert_eq!(spoken.join(" "), JFK, "{words:#?}");
    let mut last = 0;
    for w in &words {
        assert!(w.start_ms >= last.min(w.start_ms) && w.end_ms >= w.start_ms && w.end_ms <= 11_100, "{w:?}");
        assert!(w.probability > 0.0 && w.probability <= 1.0, "{w:?}");
        last = w.start_ms;
    }
    // "country" is said last, near the end of the 11 s clip.
    assert!(words.last().unwrap().start_ms > 8_000, "{words:#?}");
}

#[test]
fn what_the_model_cannot_do_is_refused_before_any_work() {
    let e = transcribe(&TranscribeParams { sample_rate: 44_100, ..params(jfk()) }).unwrap_err();
    assert_eq!(e.status, EngineStatus::Unsupported, "{}", e.message);
    assert!(e.message.contains("16000 Hz"), "{}", e.message);
    let e = transcribe(&TranscribeParams { language: Some("fr"), ..params(jfk()) }).unwrap_err();
    assert!(e.status == EngineStatus::Unsupported && e.message.contains("English-only"), "{}", e.message);
    let e = transcribe(&TranscribeParams { translate: true, ..params(jfk()) }).unwrap_err();
    assert!(e.status == EngineStatus::Unsupported && e.message.contains("English-only"), "{}", e.message);
    // And the engine keeps serving.
    assert_eq!(normalized(&text(&transcribe(&params(jfk())).unwrap())), JFK);
}

#[test]
fn the_host_cancels_between_segments_and_from_another_thread() {
    // Five copies of the clip: at least five segments, so there is audio left to stop before.
    let long: Vec<f32> = jfk().iter().copied().cycle().take(jfk().len() * 5).collect();
    let mut seen = 0;
    let e = engine()
        .transcribe(&TranscribeParams { request_id: 7, ..params(&long) }, |_| {
            seen += 1;
            false
        })
        .unwrap_err();
    assert_eq!((e.status, seen), (EngineStatus::Cancelled, 1), "{}", e.message);

    // A cancel by request id, as the node sends when a client leaves, sent while the host holds
    // the first segment: whisper.cpp hands over nothing more and stops at its next abort check.
    let (first_tx, first_rx) = std::sync::mpsc::channel();
    let (cancelled_tx, cancelled_rx) = std::sync::mpsc::channel::<()>();
    let (outcome, heard) = std::thread::scope(|scope| {
        let run = scope.spawn(move || {
            let mut heard = 0;
            let outcome = engine().transcribe(&TranscribeParams { request_id: 8, ..params(&long) }, |_| {
                heard += 1;
                if heard == 1 {
                    first_tx.send(()).unwrap();
                    cancelled_rx.recv().unwrap();
                }
                true
            });
            (outcome, heard)
        });
        first_rx.recv().unwrap();
        engine().cancel(8).unwrap();
        cancelled_tx.send(()).unwrap();
        run.join().unwrap()
    });
    assert_eq!(outcome.unwrap_err().status, EngineStatus::Cancelled);
    assert_eq!(heard, 1, "segments heard after the cancel");
    // The engine serves the next request as usual.
    assert_eq!(normalized(&text(&transcribe(&params(jfk())).unwrap())), JFK);
}

#[test]
fn silence_and_empty_audio_are_not_errors() {
    let quiet = vec![0.0f32; 16_000 * 3];
    let segments = transcribe(&params(&quiet)).unwrap();
    // Whisper may mark silence ([BLANK_AUDIO]) but hears no words in it.
    assert!(normalized(&text(&segments)).split(' ').count() <= 2, "{segments:?}");
    assert!(transcribe(&params(&[])).unwrap().is_empty());
}

#[test]
fn a_file_that_is_not_a_whisper_model_is_refused_cleanly() {
    let engine = EngineInstance::create(&plugin(), &InstanceConfig::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.bin");
    std::fs::write(&junk, b"definitely not ggml").unwrap();
    let e = engine.load_model(&ModelSpec::new("junk", Format::Ggml, junk.display().to_string())).unwrap_err();
    assert_eq!(e.status, EngineStatus::ModelCorrupt, "{}", e.message);
    // A real model cut short: whisper.cpp must fail to load it, not crash.
    let model = std::fs::read(cached("whisper/ggml-tiny.en.bin")).unwrap();
    let cut = dir.path().join("cut.bin");
    std::fs::write(&cut, &model[..model.len() / 2]).unwrap();
    let e = engine.load_model(&ModelSpec::new("cut", Format::Ggml, cut.display().to_string())).unwrap_err();
    assert_eq!(e.status, EngineStatus::ModelCorrupt, "{}", e.message);
}
