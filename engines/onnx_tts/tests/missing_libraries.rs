//! A voice load without espeak-ng or ONNX Runtime fails with a message saying what to do, and
//! the instance loads the voice once the library is there.
//!
//! Its own test binary: both libraries are opened once per process, so this must run before any
//! successful load. Needs the assets of `scripts/fetch-models piper-joe onnxruntime`.

use llmr_engine_sdk::{serde_json, Engine, EngineConfig, ErrorCode, Format, Logger, ModelDesc};
use llmr_onnx_tts::OnnxTts;
use std::path::PathBuf;

fn cache() -> PathBuf {
    std::env::var_os("LLMR_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/llmr/models"))
}

fn asset(rel: &str) -> PathBuf {
    let p = cache().join(rel);
    assert!(p.is_file(), "{} is missing: run `scripts/fetch-models piper-joe onnxruntime`", p.display());
    p
}

fn engine(params: serde_json::Value) -> OnnxTts {
    OnnxTts::create(EngineConfig {
        gpu_backend: llmr_engine_sdk::abi::LLMR_GPU_CPU,
        device_id: -1,
        slots: 1,
        vram_limit_bytes: 0,
        context_length: 0,
        threads: 1,
        logger: Logger::disabled(),
        device_name: None,
        device_memory_total_bytes: 0,
        device_memory_free_bytes: 0,
        host_memory_total_bytes: 0,
        params,
    })
    .expect("an instance is created without either library")
}

fn joe() -> ModelDesc {
    let file = asset("piper-joe/en_US-joe-medium.onnx");
    ModelDesc {
        format: Format::Onnx,
        model_id: "joe".into(),
        model_dir: file.parent().unwrap().to_path_buf(),
        primary_file: file,
        architecture: None,
        quantization: None,
        mmproj_file: None,
        context_length: 0,
        options: serde_json::Value::Null,
    }
}

#[test]
fn missing_libraries_are_named_and_the_instance_recovers() {
    let runtime = asset("onnxruntime/libonnxruntime.so.1.31.1");
    let desc = joe();

    let e = engine(serde_json::json!({ "espeak_library": "/no/such/libespeak-ng.so.1" }));
    let err = e.load_model(desc.clone()).unwrap_err();
    assert_eq!(err.code, ErrorCode::LoadFailed);
    assert!(err.message.contains("espeak-ng") && err.message.contains("install"), "{err}");

    let e = engine(serde_json::json!({ "onnxruntime_library": "/no/such/libonnxruntime.so" }));
    let err = e.load_model(desc.clone()).unwrap_err();
    // ORT_DYLIB_PATH, when the environment sets it, wins over the parameter.
    if std::env::var_os("ORT_DYLIB_PATH").is_none() {
        assert_eq!(err.code, ErrorCode::LoadFailed);
        assert!(err.message.contains("/no/such/libonnxruntime.so"), "{err}");
        assert!(err.message.contains("scripts/fetch-models onnxruntime"), "{err}");

        // Nothing configured and nothing in the model cache.
        let empty = tempfile::tempdir().unwrap();
        let cache = std::env::var_os("LLMR_MODEL_CACHE");
        std::env::set_var("LLMR_MODEL_CACHE", empty.path());
        let err = engine(serde_json::Value::Null).load_model(desc.clone()).unwrap_err();
        match cache {
            Some(c) => std::env::set_var("LLMR_MODEL_CACHE", c),
            None => std::env::remove_var("LLMR_MODEL_CACHE"),
        }
        assert_eq!(err.code, ErrorCode::LoadFailed);
        assert!(err.message.contains("ORT_DYLIB_PATH") && err.message.contains("onnxruntime_library"), "{err}");
    }

    // The same instance loads the voice once told where the runtime is, here through the
    // variable a deployment may set.
    std::env::set_var("ORT_DYLIB_PATH", &runtime);
    e.load_model(desc).unwrap();
    let mut samples = 0;
    e.speak(
        &llmr_engine_sdk::SynthesizeRequest {
            request_id: 1,
            model_id: "joe",
            text: "It works now.",
            voice: None,
            speed: 1.0,
        },
        |s, _| {
            samples += s.len();
            true
        },
    )
    .unwrap();
    assert!(samples > 22_050 / 2, "{samples} samples");
}
