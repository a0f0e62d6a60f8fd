//! Detection on the real chat templates of cached models (`scripts/fetch-models qwen2.5 smollm2`).

use std::path::PathBuf;

use llmr_model_store::gguf::GgufHeader;
use llmr_tool_calls::ToolCallFormat;

/// Where `scripts/fetch-models` caches the real models.
fn model_cache() -> PathBuf {
    match std::env::var_os("LLMR_MODEL_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME is not set")).join(".cache/llmr/models"),
    }
}

/// The format detected for a cached model; fails (never skips) when the model was not fetched.
fn detect(asset: &str, file: &str) -> ToolCallFormat {
    let path = model_cache().join(file);
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/fetch-models qwen2.5 smollm2` (or set LLMR_MODEL_CACHE to the cache holding {asset})",
        path.display()
    );
    let header = GgufHeader::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let template = header.chat_template();
    assert!(template.is_some(), "{} has no chat template", path.display());
    ToolCallFormat::detect(template, header.architecture().unwrap_or_default())
}

#[test]
fn qwen2_5_uses_hermes_blocks() {
    assert_eq!(detect("qwen2.5", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), ToolCallFormat::Hermes);
}

#[test]
fn smollm2_gives_no_hint() {
    assert_eq!(detect("smollm2", "smollm2-135m-instruct-q4_1.gguf"), ToolCallFormat::PlainJson);
}
