//! The engine on a real Piper voice, driven through the `Engine` trait as the SDK's C exports
//! drive it (synthesis through `speak`, which `synthesize` wraps around the host's callback).
//!
//! Needs the assets of `scripts/fetch-models piper-joe onnxruntime` (in `$LLMR_MODEL_CACHE`,
//! else `~/.cache/llmr/models`) and libespeak-ng (scripts/install-deps).

use llmr_engine_sdk::{
    serde_json, Capability, Engine, EngineConfig, EngineError, ErrorCode, Format, Logger, ModelDesc, SynthesizeRequest,
};
use llmr_onnx_tts::OnnxTts;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

const RATE: u32 = 22_050;
const VOICE: &str = "piper-joe/en_US-joe-medium.onnx";
const RUNTIME: &str = "onnxruntime/libonnxruntime.so.1.31.1";
/// Three sentences of clearly different lengths: short, long, medium.
const THREE: &str = "Hello there. This second sentence is quite a lot longer than the one before it was. \
                     And now the third one!";

fn asset(rel: &str) -> PathBuf {
    let cache = std::env::var_os("LLMR_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/llmr/models"));
    let p = cache.join(rel);
    assert!(p.is_file(), "{} is missing: run `scripts/fetch-models piper-joe onnxruntime`", p.display());
    p
}

fn new_engine(threads: u32) -> OnnxTts {
    OnnxTts::create(EngineConfig {
        gpu_backend: llmr_engine_sdk::abi::LLMR_GPU_CPU,
        device_id: -1,
        slots: 4,
        vram_limit_bytes: 0,
        context_length: 0,
        threads,
        logger: Logger::disabled(),
        device_name: None,
        device_memory_total_bytes: 0,
        device_memory_free_bytes: 0,
        host_memory_total_bytes: 0,
        params: serde_json::json!({ "onnxruntime_library": asset(RUNTIME) }),
    })
    .unwrap()
}

fn desc(model_id: &str, file: &Path) -> ModelDesc {
    ModelDesc {
        format: Format::Onnx,
        model_id: model_id.into(),
        model_dir: file.parent().unwrap().to_path_buf(),
        primary_file: file.to_path_buf(),
        architecture: Some("piper".into()),
        quantization: None,
        mmproj_file: None,
        context_length: 0,
        options: serde_json::Value::Null,
    }
}

/// The instance most tests share, with the voice loaded as "joe" and 2 ONNX Runtime threads.
fn engine() -> &'static OnnxTts {
    static ENGINE: OnceLock<OnnxTts> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let e = new_engine(2);
        e.load_model(desc("joe", &asset(VOICE))).unwrap();
        e
    })
}

fn request<'a>(id: u64, text: &'a str, voice: Option<&'a str>, speed: f32) -> SynthesizeRequest<'a> {
    SynthesizeRequest { request_id: id, model_id: "joe", text, voice, speed }
}

type Chunks = Vec<(Vec<f32>, u32)>;

/// The chunks one request emitted (samples, rate), and how it ended.
fn speak(req: &SynthesizeRequest<'_>) -> (Result<(), EngineError>, Chunks) {
    let mut chunks = Vec::new();
    let res = engine().speak(req, |samples, rate| {
        chunks.push((samples.to_vec(), rate));
        true
    });
    (res, chunks)
}

fn seconds(samples: &[f32]) -> f64 {
    samples.len() as f64 / RATE as f64
}

fn total_seconds(chunks: &Chunks) -> f64 {
    chunks.iter().map(|(s, _)| seconds(s)).sum()
}

fn rms(samples: &[f32]) -> f32 {
    (samples.iter().map(|s| s * s).sum::<f32>() / samples.len().max(1) as f32).sqrt()
}

#[test]
fn three_sentences_stream_as_three_chunks_in_order() {
    let (res, chunks) = speak(&request(1, THREE, None, 1.0));
    res.unwrap();
    assert_eq!(chunks.len(), 3, "one chunk per sentence");
    for (samples, rate) in &chunks {
        assert_eq!(*rate, RATE);
        let d = seconds(samples);
        assert!((0.5..10.0).contains(&d), "a sentence lasted {d:.2} s");
        assert!(rms(samples) > 0.02, "near silence: rms {}", rms(samples));
        assert!(samples.iter().all(|s| s.is_finite() && s.abs() <= 1.0), "samples outside [-1, 1]");
    }
    // In the text's order: the short one, the long one, the medium one.
    let d: Vec<f64> = chunks.iter().map(|(s, _)| seconds(s)).collect();
    assert!(d[0] < d[2] && d[2] < d[1], "durations {d:?} do not follow the sentences' lengths");
}

#[test]
fn speed_two_is_clearly_shorter_and_zero_reads_as_one() {
    let text = "Speaking faster should make this sentence take much less time.";
    let normal = total_seconds(&speak(&request(2, text, None, 1.0)).1);
    let fast = total_seconds(&speak(&request(3, text, None, 2.0)).1);
    let zero = total_seconds(&speak(&request(4, text, None, 0.0)).1);
    assert!(fast < 0.7 * normal, "speed 2: {fast:.2} s, speed 1: {normal:.2} s");
    assert!((zero - normal).abs() < 0.2 * normal, "speed 0: {zero:.2} s, speed 1: {normal:.2} s");
}

#[test]
fn the_voice_answers_to_its_name_and_refuses_others() {
    let (res, chunks) = speak(&request(5, "Named voice.", Some("joe"), 1.0));
    res.unwrap();
    assert_eq!(chunks.len(), 1);
    let (res, chunks) = speak(&request(6, "Hello.", Some("alloy"), 1.0));
    let e = res.unwrap_err();
    assert_eq!(e.code, ErrorCode::Unsupported, "{e}");
    assert!(e.message.contains("`voice`") && e.message.contains("alloy") && e.message.contains("joe"), "{e}");
    assert!(chunks.is_empty());
}

#[test]
fn bad_requests_error_cleanly_and_the_engine_goes_on() {
    for (text, speed, field) in [("", 1.0, "`input`"), ("  \n\t ", 1.0, "`input`"), ("...", 1.0, "`input`")]
        .into_iter()
        .chain([("Hello.", 10.0, "`speed`"), ("Hello.", 0.1, "`speed`"), ("Hello.", f32::NAN, "`speed`")])
    {
        let (res, chunks) = speak(&request(7, text, None, speed));
        let e = res.unwrap_err();
        assert_eq!(e.code, ErrorCode::Unsupported, "{text:?} at {speed}: {e}");
        assert!(e.message.contains(field), "{text:?} at {speed}: {e}");
        assert!(chunks.is_empty());
    }
    let e = engine().speak(&SynthesizeRequest { model_id: "nope", ..request(8, "Hi.", None, 1.0) }, |_, _| true);
    assert_eq!(e.unwrap_err().code, ErrorCode::LoadFailed);
    let (res, chunks) = speak(&request(9, "Still working after all that.", None, 1.0));
    res.unwrap();
    assert_eq!(chunks.len(), 1);
    assert!(rms(&chunks[0].0) > 0.02);
}

#[test]
fn returning_false_from_the_callback_stops_after_that_sentence() {
    let mut calls = 0;
    let res = engine().speak(&request(10, THREE, None, 1.0), |_, _| {
        calls += 1;
        false
    });
    assert_eq!(res.unwrap_err().code, ErrorCode::Cancelled);
    assert_eq!(calls, 1, "no sentence after the one refused");
}

#[test]
fn cancel_from_another_thread_stops_early() {
    let text = "One sentence here. Two sentences here. Three sentences here. Four sentences here. \
                Five sentences here. Six sentences here. Seven sentences here. Eight sentences here.";
    let (first_tx, first_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    std::thread::scope(|s| {
        let worker = s.spawn(move || {
            let mut calls = 0;
            let res = engine().speak(&request(11, text, None, 1.0), |_, _| {
                calls += 1;
                if calls == 1 {
                    first_tx.send(()).unwrap();
                    // Hold the request here until cancel() has returned.
                    go_rx.recv_timeout(Duration::from_secs(30)).unwrap();
                }
                true
            });
            (res, calls)
        });
        first_rx.recv_timeout(Duration::from_secs(120)).expect("no first sentence");
        engine().cancel(11).unwrap();
        go_tx.send(()).unwrap();
        let (res, calls) = worker.join().unwrap();
        assert_eq!(res.unwrap_err().code, ErrorCode::Cancelled);
        assert_eq!(calls, 1, "the request went on after cancel");
    });
    // Cancelling what is not running is not an error.
    engine().cancel(11).unwrap();
    engine().cancel(987_654).unwrap();
}

#[test]
fn concurrent_requests_all_finish_with_their_own_audio() {
    let texts = ["First speaker talks.", "A second, rather longer request runs at the same time.", "Third."];
    let results: Vec<(Result<(), EngineError>, Chunks)> = std::thread::scope(|s| {
        let handles: Vec<_> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| s.spawn(move || speak(&request(20 + i as u64, t, None, 1.0))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (res, chunks) in &results {
        res.as_ref().unwrap();
        assert!(!chunks.is_empty() && rms(&chunks[0].0) > 0.02);
    }
    let d: Vec<f64> = results.iter().map(|(_, c)| total_seconds(c)).collect();
    assert!(d[1] > d[0] && d[0] > d[2], "each request got its own text's audio: {d:?}");
}

#[test]
fn model_info_and_metrics_describe_the_voice() {
    let info = engine().model_info("joe").unwrap();
    assert_eq!(info.architecture.as_deref(), Some("piper"));
    assert_eq!(info.sample_rate, Some(RATE));
    assert_eq!(info.voices, ["joe"]);
    assert_eq!(info.languages, ["en"]);
    assert_eq!(info.capabilities, [Capability::Tts]);
    assert!(info.size_bytes.unwrap() > 10_000_000);
    assert_eq!(info.extra["espeak_voice"], "en-us");

    speak(&request(30, "Counting for the metrics.", None, 1.0)).0.unwrap();
    let m = engine().metrics().unwrap();
    assert!(m["sentences_total"].as_u64().unwrap() >= 1, "{m}");
    assert!(m["audio_seconds_total"].as_f64().unwrap() > 0.5, "{m}");
    assert!(m["real_time_factor"].as_f64().unwrap() > 0.0, "{m}");
    assert_eq!(m["models"], serde_json::json!(["joe"]), "{m}");
}

/// What the PyPI piper-tts package feeds this voice (tests/golden/make_phoneme_ids.py).
#[test]
fn phoneme_ids_match_piper() {
    let golden: serde_json::Value = serde_json::from_str(include_str!("golden/phoneme_ids.json")).expect("golden JSON");
    for case in golden.as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<i32> = case["sentences"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["ids"].as_array().unwrap().iter().map(|id| id.as_i64().unwrap() as i32))
            .collect();
        let got = engine().tokenize("joe", text, true, false).unwrap();
        assert_eq!(got, want, "{text:?}: phonemes {:?}", case["sentences"]);
    }
}

#[test]
fn load_errors_say_what_is_wrong() {
    let e = new_engine(1);
    let dir = tempfile::tempdir().unwrap();
    let voice = asset(VOICE);
    let config = std::fs::read_to_string(format!("{}.json", voice.display())).unwrap();

    // The model without its .onnx.json.
    let lonely = dir.path().join("lonely.onnx");
    std::os::unix::fs::symlink(&voice, &lonely).unwrap();
    let err = e.load_model(desc("lonely", &lonely)).unwrap_err();
    assert_eq!(err.code, ErrorCode::LoadFailed, "{err}");
    assert!(err.message.contains("lonely.onnx.json"), "{err}");

    // A config that is not JSON.
    std::fs::write(dir.path().join("lonely.onnx.json"), "{ not json").unwrap();
    let err = e.load_model(desc("lonely", &lonely)).unwrap_err();
    assert_eq!(err.code, ErrorCode::ModelCorrupt, "{err}");

    // An ONNX model that is not a Piper voice.
    let other = dir.path().join("not_a_voice.onnx");
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/not_a_voice.onnx"), &other).unwrap();
    std::fs::write(dir.path().join("not_a_voice.onnx.json"), &config).unwrap();
    let err = e.load_model(desc("other", &other)).unwrap_err();
    assert_eq!(err.code, ErrorCode::LoadFailed, "{err}");
    assert!(err.message.contains("not a Piper voice") && err.message.contains("\"x\""), "{err}");

    // Bytes that are not ONNX at all.
    let junk = dir.path().join("junk.onnx");
    std::fs::write(&junk, b"this is not a protobuf").unwrap();
    std::fs::write(dir.path().join("junk.onnx.json"), &config).unwrap();
    assert_eq!(e.load_model(desc("junk", &junk)).unwrap_err().code, ErrorCode::ModelCorrupt);

    // Missing file, wrong format.
    let err = e.load_model(desc("gone", &dir.path().join("gone.onnx"))).unwrap_err();
    assert!(err.message.contains("gone.onnx"), "{err}");
    let err = e.load_model(ModelDesc { format: Format::Gguf, ..desc("gguf", &voice) }).unwrap_err();
    assert!(err.message.contains("ONNX"), "{err}");

    // None of that broke the instance: the real voice loads (also from its folder) and speaks.
    e.load_model(desc("joe", &voice)).unwrap();
    assert!(e.load_model(desc("joe", &voice)).is_err(), "loading the same id twice");
    let folder = ModelDesc { primary_file: PathBuf::new(), ..desc("joe-folder", &voice) };
    e.load_model(folder).unwrap();
    let mut samples = 0;
    e.speak(
        &SynthesizeRequest { model_id: "joe-folder", ..request(40, "Loaded from its folder.", None, 1.0) },
        |s, _| {
            samples += s.len();
            true
        },
    )
    .unwrap();
    assert!(samples as f64 / RATE as f64 > 0.5, "{samples} samples");

    // Unloaded: gone for requests, and can come back.
    e.unload_model("joe").unwrap();
    assert_eq!(e.unload_model("joe").unwrap_err().code, ErrorCode::LoadFailed);
    let err = e.speak(&request(41, "Anyone there?", None, 1.0), |_, _| true).unwrap_err();
    assert!(err.message.contains("not loaded"), "{err}");
    e.load_model(desc("joe", &voice)).unwrap();
    e.speak(&request(42, "Back again.", None, 1.0), |_, _| true).unwrap();
}
