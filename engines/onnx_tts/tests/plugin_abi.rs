//! The built plugin (`libllmr_onnx_tts.so`) through the real C ABI, loaded by llmr-engine-host
//! exactly as a node loads it: the conformance suite, then streaming synthesis.
//!
//! Needs the assets of `scripts/fetch-models piper-joe onnxruntime` and libespeak-ng.

use llmr_engine_host::conformance::{check_plugin, CheckOptions, Outcome};
use llmr_engine_host::{
    load_one, EngineInstance, EngineRegistry, EngineStatus, Format, InstanceConfig, Manifest, ModelSpec,
    SynthesizeParams,
};
use std::path::PathBuf;
use std::sync::OnceLock;

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn asset(rel: &str) -> PathBuf {
    let cache = std::env::var_os("LLMR_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/llmr/models"));
    let p = cache.join(rel);
    assert!(p.is_file(), "{} is missing: run `scripts/fetch-models piper-joe onnxruntime`", p.display());
    p
}

fn voice() -> PathBuf {
    asset("piper-joe/en_US-joe-medium.onnx")
}

/// A plugin folder holding the committed manifest, with `onnxruntime_library` pointing at the
/// fetched runtime (as a node configures it), and the library cargo built for this test run.
fn plugin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // `cargo test` refreshes the cdylib beside the test binary (deps/); `cargo build` also
        // copies it one level up.
        let exe = std::env::current_exe().unwrap();
        let lib = [exe.parent().unwrap(), exe.parent().unwrap().parent().unwrap()]
            .iter()
            .map(|d| d.join("libllmr_onnx_tts.so"))
            .find(|p| p.is_file())
            .expect("libllmr_onnx_tts.so was not built: run `cargo test -p llmr-onnx-tts`");
        let dir = std::env::temp_dir().join(format!("llmr-onnx-tts-test-{}", std::process::id())).join("onnx_tts/cpu");
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = format!("{REPO}/engines/onnx_tts/cpu/manifest.json");
        let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
        m["parameters"]["onnxruntime_library"] =
            asset("onnxruntime/libonnxruntime.so.1.31.1").display().to_string().into();
        std::fs::write(dir.join("manifest.json"), serde_json::to_vec_pretty(&m).unwrap()).unwrap();
        std::fs::copy(&lib, dir.join("libllmr_onnx_tts.so")).unwrap();
        dir
    })
    .clone()
}

#[test]
fn conformance_suite_passes_with_the_voice() {
    let checks = check_plugin(&plugin_dir(), &CheckOptions { model: Some(voice()), threads: 2, ..Default::default() });
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Fail(_)))
        .map(|c| format!("{}: {}", c.name, c.detail))
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
    for name in ["load model", "model info", "tokenize", "unsupported calls", "unload model"] {
        assert!(checks.iter().any(|c| c.name == name && c.outcome == Outcome::Pass), "{name} did not run: {checks:#?}");
    }
}

#[test]
fn synthesis_streams_through_the_c_abi() {
    let dir = plugin_dir();
    let mut registry = EngineRegistry::new();
    let plugin = load_one(&dir, Manifest::load(&dir, 1).unwrap(), &mut registry).unwrap();
    assert_eq!(plugin.info.engine_id, "onnx_tts");
    let engine = EngineInstance::create(&plugin, &InstanceConfig { threads: 2, ..Default::default() }).unwrap();
    engine.load_model(&ModelSpec::new("joe", Format::Onnx, voice().display().to_string())).unwrap();
    let info = engine.model_info("joe").unwrap();
    assert_eq!((info.architecture.as_deref(), info.sample_rate), (Some("piper"), Some(22_050)));

    let params = |id, text| SynthesizeParams { request_id: id, model_id: "joe", text, voice: None, speed: 1.0 };
    let mut chunks: Vec<(usize, u32)> = Vec::new();
    engine
        .synthesize(&params(1, "First sentence. Second sentence. Third one!"), |samples, rate| {
            chunks.push((samples.len(), rate));
            true
        })
        .unwrap();
    assert_eq!(chunks.len(), 3, "{chunks:?}");
    assert!(chunks.iter().all(|&(n, rate)| rate == 22_050 && n > 22_050 / 2), "{chunks:?}");

    // Cancelled from the callback: LLMR_ERR_CANCELLED after one chunk.
    let mut calls = 0;
    let e = engine
        .synthesize(&params(2, "One. Two. Three."), |_, _| {
            calls += 1;
            false
        })
        .unwrap_err();
    assert_eq!((e.status, calls), (EngineStatus::Cancelled, 1), "{e}");

    // Bad input comes back with its message through llmr_engine_last_error.
    let e =
        engine.synthesize(&SynthesizeParams { voice: Some("nobody"), ..params(3, "Hi.") }, |_, _| true).unwrap_err();
    assert_eq!(e.status, EngineStatus::Unsupported);
    assert!(e.message.contains("nobody"), "{e}");
    let e = engine.synthesize(&params(4, " "), |_, _| true).unwrap_err();
    assert!(e.message.contains("`input`"), "{e}");

    let m = engine.metrics().unwrap();
    assert!(m["sentences_total"].as_u64().unwrap() >= 4, "{m}");
}
