//! The plugin conformance suite behind `llmr engines check`: loads one plugin folder and drives
//! every export the way a node would, plus the bad inputs a careless host might send.
//!
//! Each check yields a line; model-dependent checks are skipped (not failed) when no model is
//! given. Third parties run it on their own plugins; our tests run it on ours.

use crate::discovery::load_one;
use crate::instance::{EngineInstance, FinishReason, InferParams, InstanceConfig, ModelSpec};
use crate::manifest::Manifest;
use crate::registry::EngineRegistry;
use crate::status::EngineStatus;
use llmr_engine_abi as abi;
use llmr_engine_types::{Constraint, Format};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

#[derive(Clone, Debug)]
pub struct Check {
    pub name: &'static str,
    pub outcome: Outcome,
    pub detail: String,
}

#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    /// Model file for the model-dependent checks; without it they are skipped.
    pub model: Option<PathBuf>,
    /// Format of `model`; guessed from the extension when `None`.
    pub format: Option<Format>,
    /// Prompt for generation checks.
    pub prompt: Option<String>,
    pub threads: u32,
}

#[derive(Default)]
struct Report {
    checks: Vec<Check>,
}

impl Report {
    fn record(&mut self, name: &'static str, result: Result<String, String>) -> bool {
        let (outcome, detail) = match result {
            Ok(d) => (Outcome::Pass, d),
            Err(e) => (Outcome::Fail(e.clone()), e),
        };
        let ok = outcome == Outcome::Pass;
        self.checks.push(Check { name, outcome, detail });
        ok
    }
    fn skip(&mut self, name: &'static str, why: &str) {
        self.checks.push(Check { name, outcome: Outcome::Skip(why.into()), detail: why.into() });
    }
}

const MODEL_ID: &str = "conformance-model";
const DEFAULT_PROMPT: &str =
    "The quick brown fox jumps over the lazy dog and then runs far away into the deep green forest near the river";

fn format_of(path: &Path) -> Option<Format> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("gguf") => Some(Format::Gguf),
        Some("safetensors") | Some("json") => Some(Format::Safetensors),
        Some("onnx") => Some(Format::Onnx),
        Some("bin") => Some(Format::Ggml),
        _ => None,
    }
}

fn expect_error(
    result: Result<impl std::fmt::Debug, crate::CallError>,
    want: Option<EngineStatus>,
) -> Result<String, String> {
    match result {
        Ok(v) => Err(format!("expected an error, got OK ({v:?})")),
        Err(e) if e.message.trim().is_empty() || e.message.starts_with("(the plugin gave no") => {
            Err(format!("{} without a last_error message", e.status.code()))
        }
        Err(e) if want.is_some_and(|w| w != e.status) => {
            Err(format!("expected {}, got {}: {}", want.unwrap().code(), e.status.code(), e.message))
        }
        Err(e) => Ok(format!("{}: {}", e.status.code(), e.message)),
    }
}

/// Runs the suite on the plugin in `dir` (a folder holding manifest.json and the library).
pub fn check_plugin(dir: &Path, options: &CheckOptions) -> Vec<Check> {
    let mut r = Report::default();
    let manifest = match Manifest::load(dir, abi::LLMR_ENGINE_ABI_MAJOR) {
        Ok(m) => m,
        Err(e) => {
            r.record("manifest", Err(e.to_string()));
            return r.checks;
        }
    };
    r.record("manifest", Ok(format!("{} {} ({})", manifest.id, manifest.version, manifest.binary)));
    let mut registry = EngineRegistry::new();
    let plugin = match load_one(dir, manifest, &mut registry) {
        Ok(p) => p,
        Err(e) => {
            r.record("load", Err(e.to_string()));
            return r.checks;
        }
    };
    r.record("load", Ok("all ABI 1.0 exports resolved".into()));
    let caps = plugin.info.capabilities;
    let modalities = &plugin.manifest.modalities;
    let cap_matches = [
        ("text", abi::LLMR_CAP_TEXT),
        ("embedding", abi::LLMR_CAP_EMBEDDING),
        ("asr", abi::LLMR_CAP_ASR),
        ("tts", abi::LLMR_CAP_TTS),
        ("image", abi::LLMR_CAP_IMAGE),
    ]
    .iter()
    .filter(|(name, bit)| modalities.iter().any(|m| m == name) != (caps & bit != 0))
    .map(|(name, _)| *name)
    .collect::<Vec<_>>();
    r.record(
        "info",
        if cap_matches.is_empty() {
            Ok(format!(
                "abi {}.{}, capabilities {:#x} match the manifest",
                plugin.info.abi_major, plugin.info.abi_minor, caps
            ))
        } else {
            Err(format!("capabilities {caps:#x} disagree with manifest modalities on {cap_matches:?}"))
        },
    );

    let config = InstanceConfig { slots: 4, threads: options.threads, ..Default::default() };
    let engine = match EngineInstance::create(&plugin, &config) {
        Ok(e) => e,
        Err(e) => {
            r.record("create", Err(e.to_string()));
            return r.checks;
        }
    };
    r.record("create", Ok("instance created with 4 slots".into()));

    r.record(
        "unknown model",
        expect_error(engine.infer(&InferParams::greedy(1, "no-such-model", "hello"), |_| true), None),
    );
    r.record(
        "bad arguments: NULL request",
        // SAFETY: the header lets a plugin refuse NULL; a crash here is the failure being tested.
        expect_error(unsafe { engine.raw_infer(std::ptr::null(), std::ptr::null_mut()) }, None),
    );
    r.record("bad arguments: struct too small", {
        let model_id = std::ffi::CString::new(MODEL_ID).unwrap();
        let mut req: abi::llmr_infer_request = unsafe { std::mem::zeroed() };
        req.struct_size = 8;
        req.model_id = model_id.as_ptr();
        expect_error(unsafe { engine.raw_infer(&req, std::ptr::null_mut()) }, None)
    });
    r.record(
        "set_config: unknown key",
        expect_error(
            engine.set_config(None, "no_such_setting_xyz", &serde_json::json!(1)),
            Some(EngineStatus::Unsupported),
        ),
    );
    r.record(
        "metrics",
        engine.metrics().map_err(|e| e.to_string()).and_then(|m| {
            if m.is_object() {
                Ok(format!("{} keys", m.as_object().unwrap().len()))
            } else {
                Err(format!("not a JSON object: {m}"))
            }
        }),
    );

    let Some(model) = options.model.as_ref() else {
        for name in [
            "load model",
            "model info",
            "tokenize",
            "infer: streaming",
            "infer: max_tokens",
            "infer: cancel from callback",
            "infer: cancel from another thread",
            "infer: constrained output",
            "infer: token-id prompt",
            "unsupported calls",
            "unload model",
        ] {
            r.skip(name, "no --model given");
        }
        drop(engine);
        r.record("destroy", Ok("instance destroyed".into()));
        return r.checks;
    };
    let Some(format) = options.format.or_else(|| format_of(model)) else {
        r.record("load model", Err(format!("cannot tell the format of {} from its extension", model.display())));
        return r.checks;
    };
    let spec = ModelSpec::new(MODEL_ID, format, model.display().to_string());
    if !r
        .record("load model", engine.load_model(&spec).map(|()| model.display().to_string()).map_err(|e| e.to_string()))
    {
        return r.checks;
    }
    r.record("load model twice", expect_error(engine.load_model(&spec), None));
    r.record(
        "model info",
        engine.model_info(MODEL_ID).map_err(|e| e.to_string()).map(|info| match serde_json::to_value(&info) {
            Ok(serde_json::Value::Object(o)) => o.keys().cloned().collect::<Vec<_>>().join(", "),
            _ => "no keys".into(),
        }),
    );
    let prompt = options.prompt.as_deref().unwrap_or(DEFAULT_PROMPT);
    r.record(
        "tokenize",
        engine.tokenize(MODEL_ID, prompt, true, false).map_err(|e| e.to_string()).and_then(|t| {
            if t.is_empty() {
                Err("no tokens".into())
            } else {
                Ok(format!("{} tokens", t.len()))
            }
        }),
    );

    if caps & abi::LLMR_CAP_TEXT != 0 {
        check_generation(&mut r, &engine, prompt);
        check_minor_1(&mut r, &engine, prompt, caps);
    } else {
        r.record(
            "infer: unsupported",
            expect_error(
                engine.infer(&InferParams::greedy(2, MODEL_ID, prompt), |_| true),
                Some(EngineStatus::Unsupported),
            ),
        );
    }
    check_other_modalities(&mut r, &engine, caps);

    r.record("unload model", engine.unload_model(MODEL_ID).map(|()| "unloaded".into()).map_err(|e| e.to_string()));
    r.record("unload model twice", expect_error(engine.unload_model(MODEL_ID), None));
    drop(engine);
    r.record("destroy", Ok("instance destroyed".into()));
    r.checks
}

fn check_generation(r: &mut Report, engine: &EngineInstance, prompt: &str) {
    let mut params = InferParams::greedy(10, MODEL_ID, prompt);
    params.sampling.max_tokens = Some(16);
    let mut pieces = Vec::new();
    let res = engine.infer(&params, |t| {
        pieces.push(t.text.to_string());
        true
    });
    r.record(
        "infer: streaming",
        res.map_err(|e| e.to_string()).and_then(|res| {
            let text: String = pieces.concat();
            if pieces.is_empty() || res.completion_tokens == 0 {
                Err("no tokens streamed".into())
            } else if pieces.len() > res.completion_tokens as usize {
                Err(format!("{} callbacks for {} completion tokens", pieces.len(), res.completion_tokens))
            } else {
                Ok(format!(
                    "{} callbacks, {} prompt tokens, {:?}, text {:?}",
                    pieces.len(),
                    res.prompt_tokens,
                    res.finish_reason,
                    text
                ))
            }
        }),
    );

    params.request_id = 11;
    params.sampling.max_tokens = Some(3);
    params.ignore_eos = true;
    r.record(
        "infer: max_tokens",
        engine.infer(&params, |_| true).map_err(|e| e.to_string()).and_then(|res| {
            match (res.completion_tokens, res.finish_reason) {
                (n, FinishReason::Length) if n <= 3 => Ok(format!("{n} tokens, finish length")),
                (n, f) => Err(format!("max_tokens 3 gave {n} tokens, finish {f:?}")),
            }
        }),
    );

    params.request_id = 12;
    params.sampling.max_tokens = Some(64);
    let mut calls = 0;
    r.record(
        "infer: cancel from callback",
        engine
            .infer(&params, |_| {
                calls += 1;
                false
            })
            .map_err(|e| e.to_string())
            .and_then(|res| match (res.finish_reason, calls) {
                (FinishReason::Cancelled, 1) => Ok("stopped after the first token".into()),
                (f, n) => Err(format!("finish {f:?} after {n} callbacks (want Cancelled after 1)")),
            }),
    );

    // Cancel from another thread: the first token's callback waits until cancel() has returned,
    // so the engine must stop within one more token.
    params.request_id = 13;
    let (first_tx, first_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let outcome = std::thread::scope(|s| {
        let params = &params;
        let worker = s.spawn(move || {
            let mut n = 0u32;
            let res = engine.infer(params, |_| {
                n += 1;
                if n == 1 {
                    let _ = first_tx.send(());
                    let _ = go_rx.recv_timeout(Duration::from_secs(10));
                }
                true
            });
            (res, n)
        });
        let started = first_rx.recv_timeout(Duration::from_secs(60)).is_ok();
        let cancel = engine.cancel(params.request_id);
        let _ = go_tx.send(());
        let t = Instant::now();
        let (res, n) = worker.join().expect("infer thread panicked");
        (started, cancel, res, n, t.elapsed())
    });
    r.record("infer: cancel from another thread", {
        let (started, cancel, res, n, waited) = outcome;
        match (started, cancel, res) {
            (false, _, _) => Err("no first token within 60 s".into()),
            (_, Err(e), _) => Err(format!("cancel failed: {e}")),
            (_, _, Err(e)) => Err(format!("infer failed: {e}")),
            (_, _, Ok(res)) if res.finish_reason == FinishReason::Cancelled && n <= 2 => {
                Ok(format!("stopped after {n} tokens, {:.1} ms after cancel", waited.as_secs_f64() * 1e3))
            }
            (_, _, Ok(res)) => {
                Err(format!("finish {:?} after {n} tokens (want Cancelled within one token)", res.finish_reason))
            }
        }
    });
}

/// What ABI minor 1 added, where the plugin says it has it: a constraint is followed, and a
/// prompt given as token ids is read as its text is.
fn check_minor_1(r: &mut Report, engine: &EngineInstance, prompt: &str, caps: u32) {
    if caps & abi::LLMR_CAP_CONSTRAINED == 0 {
        r.skip("infer: constrained output", "the plugin does not report LLMR_CAP_CONSTRAINED");
    } else {
        let mut params = InferParams::greedy(20, MODEL_ID, prompt);
        params.sampling.max_tokens = Some(8);
        params.sampling.constraint = Some(Constraint::Regex("[0-9]{3}".into()));
        let mut text = String::new();
        let res = engine.infer(&params, |t| {
            text.push_str(&t.text);
            true
        });
        r.record(
            "infer: constrained output",
            res.map_err(|e| e.to_string()).and_then(|res| {
                let digits = text.len() == 3 && text.bytes().all(|b| b.is_ascii_digit());
                match (digits, res.finish_reason) {
                    (true, FinishReason::Stop) => Ok(format!("{text:?} under the regex [0-9]{{3}}, finish stop")),
                    (_, f) => Err(format!("{text:?}, finish {f:?}, under the regex [0-9]{{3}} (want 3 digits, stop)")),
                }
            }),
        );
    }
    if caps & abi::LLMR_CAP_TOKEN_INPUT == 0 {
        r.skip("infer: token-id prompt", "the plugin does not report LLMR_CAP_TOKEN_INPUT");
        return;
    }
    let generate = |params: &InferParams<'_>| {
        let mut text = String::new();
        engine
            .infer(params, |t| {
                text.push_str(&t.text);
                true
            })
            .map(|res| (text, res.prompt_tokens))
    };
    let outcome = engine.tokenize(MODEL_ID, prompt, true, true).map_err(|e| e.to_string()).and_then(|ids| {
        let mut params = InferParams::greedy(21, MODEL_ID, prompt);
        params.sampling.max_tokens = Some(8);
        let by_text = generate(&params).map_err(|e| e.to_string())?;
        params.request_id = 22;
        params.prompt_tokens = Some(&ids);
        let by_ids = generate(&params).map_err(|e| e.to_string())?;
        if by_ids == by_text && by_ids.1 as usize == ids.len() {
            Ok(format!("{} ids gave the text prompt's answer {:?}", ids.len(), by_ids.0))
        } else {
            Err(format!("{} ids gave {by_ids:?}, the text prompt {by_text:?}", ids.len()))
        }
    });
    r.record("infer: token-id prompt", outcome);
}

fn check_other_modalities(r: &mut Report, engine: &EngineInstance, caps: u32) {
    if caps & abi::LLMR_CAP_EMBEDDING != 0 {
        let mut dims = Vec::new();
        r.record(
            "embed",
            engine
                .embed(20, MODEL_ID, &["hello world", "a second input"], true, |i, v| {
                    dims.push((i, v.len(), v.iter().map(|x| x * x).sum::<f32>().sqrt()));
                    true
                })
                .map_err(|e| e.to_string())
                .and_then(|_| match dims.as_slice() {
                    [(0, d0, n0), (1, d1, n1)]
                        if d0 == d1 && *d0 > 0 && (n0 - 1.0).abs() < 1e-3 && (n1 - 1.0).abs() < 1e-3 =>
                    {
                        Ok(format!("2 vectors of {d0} dims, normalized"))
                    }
                    other => Err(format!("unexpected embeddings (index, dim, norm): {other:?}")),
                }),
        );
    }
    let mut unsupported = Vec::new();
    let mut problems = Vec::new();
    let probes: [(&str, u32, Result<(), crate::CallError>); 4] = [
        (
            "embed",
            abi::LLMR_CAP_EMBEDDING,
            if caps & abi::LLMR_CAP_EMBEDDING == 0 {
                engine.embed(21, MODEL_ID, &["x"], false, |_, _| true).map(|_| ())
            } else {
                Ok(())
            },
        ),
        (
            "transcribe",
            abi::LLMR_CAP_ASR,
            if caps & abi::LLMR_CAP_ASR == 0 { engine.probe_transcribe(MODEL_ID) } else { Ok(()) },
        ),
        (
            "synthesize",
            abi::LLMR_CAP_TTS,
            if caps & abi::LLMR_CAP_TTS == 0 { engine.probe_synthesize(MODEL_ID) } else { Ok(()) },
        ),
        (
            "generate_image",
            abi::LLMR_CAP_IMAGE,
            if caps & abi::LLMR_CAP_IMAGE == 0 { engine.probe_generate_image(MODEL_ID) } else { Ok(()) },
        ),
    ];
    for (name, bit, result) in probes {
        if caps & bit != 0 {
            continue;
        }
        match expect_error(result, Some(EngineStatus::Unsupported)) {
            Ok(_) => unsupported.push(name),
            Err(e) => problems.push(format!("{name}: {e}")),
        }
    }
    r.record(
        "unsupported calls",
        if problems.is_empty() {
            Ok(format!("{} answer UNSUPPORTED with a message", unsupported.join(", ")))
        } else {
            Err(problems.join("; "))
        },
    );
}
