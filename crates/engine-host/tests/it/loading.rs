//! Loading plugins and calling them: identity checks, panics, cancellation, the C template.

use crate::support::*;
use llmr_engine_host::abi;
use llmr_engine_host::{
    discover, load_one, DiscoveryOptions, EngineInstance, EngineRegistry, EngineStatus, FinishReason, InferParams,
    InstanceConfig, Manifest, PluginState,
};
use std::sync::Arc;

const CPU_ONLY: DiscoveryOptions = DiscoveryOptions { gpu: None, allow_cpu: true };

fn single_plugin(root: &std::path::Path) -> Arc<llmr_engine_host::Plugin> {
    let mut registry = EngineRegistry::new();
    let found = discover(root, &CPU_ONLY, &mut registry);
    match &found[0].state {
        PluginState::Loaded(p) => p.clone(),
        other => panic!("plugin not loaded: {other:?}"),
    }
}

fn instance_with_model(plugin: &Arc<llmr_engine_host::Plugin>, model_dir: &std::path::Path) -> EngineInstance {
    let engine = EngineInstance::create(plugin, &InstanceConfig { slots: 2, ..Default::default() }).unwrap();
    let model = dummy_model(model_dir);
    load_as_m(&engine, &model);
    engine
}

#[test]
fn a_second_plugin_with_the_same_id_is_refused_whatever_its_version() {
    let root = tempfile::tempdir().unwrap();
    let first = install_echo(root.path());
    let other_root = tempfile::tempdir().unwrap();
    let second = install(
        other_root.path(),
        "echo",
        "cpu",
        &echo_manifest(|m| m["version"] = "0.2.0".into()),
        Some(&echo_library()),
    );
    let mut registry = EngineRegistry::new();
    load_one(&first, Manifest::load(&first, 1).unwrap(), &mut registry).unwrap();
    let err = load_one(&second, Manifest::load(&second, 1).unwrap(), &mut registry).unwrap_err();
    assert_eq!(err.to_string(), "Plugin ID conflict: echo already loaded");
    assert_eq!(registry.plugins().len(), 1);
}

#[test]
fn abi_mismatch_reported_by_the_binary_is_refused_before_any_other_call() {
    let root = tempfile::tempdir().unwrap();
    let build = tempfile::tempdir().unwrap();
    let lib = build_c_template(build.path(), &["-DECHO_ABI_MAJOR=2"]);
    install(root.path(), "c_echo", "cpu", &c_template_manifest(), Some(&lib));
    let mut registry = EngineRegistry::new();
    let found = discover(root.path(), &CPU_ONLY, &mut registry);
    match &found[0].state {
        PluginState::Refused(reason) => assert_eq!(reason, "ABI version mismatch: expected 1, got 2"),
        other => panic!("expected refusal, got {other:?}"),
    }
}

#[test]
fn the_binary_must_report_the_manifest_id() {
    let root = tempfile::tempdir().unwrap();
    let build = tempfile::tempdir().unwrap();
    let lib = build_c_template(build.path(), &["-DECHO_ENGINE_ID=\"impostor\""]);
    install(root.path(), "c_echo", "cpu", &c_template_manifest(), Some(&lib));
    let mut registry = EngineRegistry::new();
    let found = discover(root.path(), &CPU_ONLY, &mut registry);
    match &found[0].state {
        PluginState::Refused(reason) => assert!(reason.contains("the binary reports \"impostor\""), "{reason}"),
        other => panic!("expected refusal, got {other:?}"),
    }
}

#[test]
fn a_panic_inside_infer_becomes_internal_and_the_host_keeps_working() {
    let root = tempfile::tempdir().unwrap();
    install_echo(root.path());
    let plugin = single_plugin(root.path());
    let engine = instance_with_model(&plugin, root.path());
    let err = engine.infer(&InferParams::greedy(1, "m", "please PANIC_IN_INFER now"), |_| true).unwrap_err();
    assert_eq!(err.status, EngineStatus::Internal);
    assert_eq!(err.message, "engine panicked: the echo engine was asked to panic");
    assert_eq!(err.status.http_status(), 500);
    // Same instance, next request: fine.
    let mut text = String::new();
    let res = engine
        .infer(&InferParams::greedy(2, "m", "still alive"), |t| {
            text.push_str(&t.text);
            true
        })
        .unwrap();
    assert_eq!(text, "still alive");
    assert_eq!(res.finish_reason, FinishReason::Stop);
}

#[test]
fn returning_false_from_the_callback_stops_within_one_token() {
    let root = tempfile::tempdir().unwrap();
    install_echo(root.path());
    let plugin = single_plugin(root.path());
    let engine = instance_with_model(&plugin, root.path());
    let prompt = "one two three four five six seven eight nine ten";
    let mut seen = Vec::new();
    let res = engine
        .infer(&InferParams::greedy(3, "m", prompt), |t| {
            seen.push(t.text.to_string());
            seen.len() < 3
        })
        .unwrap();
    assert_eq!(res.finish_reason, FinishReason::Cancelled);
    assert_eq!(seen, vec!["one", " two", " three"]);
    assert_eq!(res.completion_tokens, 3);
}

#[test]
fn cancel_from_another_thread_by_request_id() {
    let root = tempfile::tempdir().unwrap();
    install_echo(root.path());
    let plugin = single_plugin(root.path());
    let engine = instance_with_model(&plugin, root.path());
    engine.set_config(None, "token_delay_ms", &serde_json::json!(20)).unwrap();
    let prompt = (0..200).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" ");
    let (tx, rx) = std::sync::mpsc::channel();
    let res = std::thread::scope(|s| {
        let h = s.spawn(|| {
            engine.infer(&InferParams::greedy(77, "m", &prompt), |_| {
                let _ = tx.send(());
                true
            })
        });
        rx.recv().unwrap();
        engine.cancel(77).unwrap();
        h.join().unwrap()
    })
    .unwrap();
    assert_eq!(res.finish_reason, FinishReason::Cancelled);
    assert!(res.completion_tokens <= 3, "{} tokens after cancel", res.completion_tokens);
}

#[test]
fn a_panicking_host_callback_does_not_unwind_through_the_plugin() {
    let root = tempfile::tempdir().unwrap();
    install_echo(root.path());
    let plugin = single_plugin(root.path());
    let engine = instance_with_model(&plugin, root.path());
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        engine.infer(&InferParams::greedy(5, "m", "a b c"), |_| panic!("host bug")).ok();
    }));
    assert!(caught.is_err(), "the host's panic is resumed after the plugin call returns");
    let res = engine.infer(&InferParams::greedy(6, "m", "a b c"), |_| true).unwrap();
    assert_eq!(res.completion_tokens, 3);
}

#[test]
fn stop_sequences_max_tokens_logprobs_and_usage_cross_the_abi() {
    let root = tempfile::tempdir().unwrap();
    install_echo(root.path());
    let plugin = single_plugin(root.path());
    let engine = instance_with_model(&plugin, root.path());
    let mut p = InferParams::greedy(8, "m", "the quick brown fox jumps over");
    p.sampling.stop = vec!["fox jumps".to_string()];
    p.sampling.logprobs = Some(2);
    let mut text = String::new();
    let mut tops = Vec::new();
    let res = engine
        .infer(&p, |t| {
            text.push_str(&t.text);
            tops.push((t.logprob, t.top.clone()));
            true
        })
        .unwrap();
    assert_eq!(text, "the quick brown ");
    assert_eq!(res.finish_reason, FinishReason::Stop);
    assert_eq!(res.prompt_tokens, 7, "6 words + BOS");
    assert_eq!(tops[0].0, -0.5);
    assert_eq!(tops[0].1.len(), 2);
    assert_eq!(tops[0].1[1].text, " alt1");

    let mut p = InferParams::greedy(9, "m", "a b c d e");
    p.sampling.max_tokens = Some(2);
    let res = engine.infer(&p, |_| true).unwrap();
    assert_eq!((res.completion_tokens, res.finish_reason), (2, FinishReason::Length));
}

#[test]
fn the_c_template_loads_and_generates() {
    let root = tempfile::tempdir().unwrap();
    let build = tempfile::tempdir().unwrap();
    let lib = build_c_template(build.path(), &[]);
    install(root.path(), "c_echo", "cpu", &c_template_manifest(), Some(&lib));
    let plugin = single_plugin(root.path());
    assert_eq!(plugin.info.engine_id, "c_echo");
    let engine = instance_with_model(&plugin, root.path());
    let mut text = String::new();
    let res = engine
        .infer(&InferParams::greedy(1, "m", "  hello   C  world "), |t| {
            text.push_str(&t.text);
            true
        })
        .unwrap();
    assert_eq!(text, "hello   C  world");
    assert_eq!(res.completion_tokens, 3);
    assert_eq!(engine.tokenize("m", "hello C world", true, false).unwrap().len(), 4);
    let err = engine.embed(1, "m", &["x"], false, |_, _| true).unwrap_err();
    assert_eq!(err.status, EngineStatus::Unsupported);
    assert_eq!(err.message, "embeddings are not supported by c_echo");
}

#[test]
fn engine_errors_keep_their_message_per_handle() {
    let root = tempfile::tempdir().unwrap();
    install_echo(root.path());
    let plugin = single_plugin(root.path());
    let a = instance_with_model(&plugin, root.path());
    let b = EngineInstance::create(&plugin, &InstanceConfig::default()).unwrap();
    let err_a = a.unload_model("ghost").unwrap_err();
    let err_b = b.set_config(None, "token_delay_ms", &serde_json::json!("slow")).unwrap_err();
    assert_eq!(err_a.message, "model 'ghost' is not loaded");
    assert_eq!(err_b.status, EngineStatus::Unsupported);
    assert_eq!(err_b.message, "`token_delay_ms` takes a non-negative integer, got \"slow\"");
}

/// A host of ABI 1.0 sends the 1.0 struct: its `struct_size` ends where minor 1's fields begin,
/// and it says nothing about what lies beyond (here 0xFF bytes). A minor-1 plugin serves it as
/// an unconstrained text prompt.
#[test]
fn a_request_of_abi_1_0_is_served_whatever_lies_beyond_its_size() {
    let root = tempfile::tempdir().unwrap();
    install_echo(root.path());
    let plugin = single_plugin(root.path());
    let engine = instance_with_model(&plugin, root.path());
    let model_id = std::ffi::CString::new("m").unwrap();
    let prompt = "one two three";
    let mut raw = std::mem::MaybeUninit::<abi::llmr_infer_request>::uninit();
    // SAFETY: every byte is written before the struct is read; 0xFF bytes are valid for every
    // field type (integers, floats, pointers that the 1.0 size keeps the plugin from reading).
    let mut req = unsafe {
        raw.as_mut_ptr().cast::<u8>().write_bytes(0xFF, std::mem::size_of::<abi::llmr_infer_request>());
        raw.assume_init()
    };
    req.struct_size = std::mem::offset_of!(abi::llmr_infer_request, constraint) as u32;
    req.flags = 0;
    req.request_id = 1;
    req.model_id = model_id.as_ptr();
    req.prompt = abi::llmr_str { ptr: prompt.as_ptr().cast(), len: prompt.len() };
    (req.max_tokens, req.top_k, req.temperature, req.top_p, req.min_p) = (8, 0, 0.0, 1.0, 0.0);
    (req.repeat_penalty, req.presence_penalty, req.frequency_penalty, req.seed) = (1.0, 0.0, 0.0, 0);
    (req.stop, req.stop_count, req.top_logprobs) = (std::ptr::null(), 0, 0);
    let mut result = abi::llmr_infer_result {
        struct_size: std::mem::size_of::<abi::llmr_infer_result>() as u32,
        ..Default::default()
    };
    // SAFETY: `req` and `result` are valid for the call; no token callback (the plugin may skip it).
    unsafe { engine.raw_infer(&req, &mut result) }.unwrap();
    assert_eq!((result.finish_reason, result.completion_tokens), (abi::LLMR_FINISH_STOP, 3));
}
