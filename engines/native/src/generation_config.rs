//! `generation_config.json`: the sampling settings the model's publisher recommends (Qwen2.5:
//! temperature 0.7, top-p 0.8, top-k 20, repetition penalty 1.05). They are reported in the
//! model's info and fill what a request leaves unset. `do_sample` is not read: as in vLLM, the
//! values are recommendations for sampling whenever a client samples.

use llmr_engine_sdk::SamplingDefaults;
use std::path::Path;

/// The recommendations of the model folder `dir`; `None` when it has none.
pub fn sampling_defaults(dir: &Path) -> Option<SamplingDefaults> {
    let text = std::fs::read_to_string(dir.join("generation_config.json")).ok()?;
    let gc: serde_json::Value = serde_json::from_str(&text).ok()?;
    let float = |key: &str| gc.get(key).and_then(serde_json::Value::as_f64).map(|v| v as f32);
    let defaults = SamplingDefaults {
        temperature: float("temperature"),
        top_p: float("top_p"),
        top_k: gc.get("top_k").and_then(serde_json::Value::as_u64).and_then(|k| u32::try_from(k).ok()),
        min_p: float("min_p"),
        repeat_penalty: float("repetition_penalty"),
    };
    (!defaults.is_empty()).then_some(defaults)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recommended_settings_are_read_and_a_file_without_them_has_none() {
        let dir = tempfile::tempdir().unwrap();
        let write = |text: &str| std::fs::write(dir.path().join("generation_config.json"), text).unwrap();
        write(
            r#"{"bos_token_id": 1, "do_sample": true, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}"#,
        );
        assert_eq!(
            sampling_defaults(dir.path()),
            Some(SamplingDefaults {
                temperature: Some(0.7),
                top_p: Some(0.8),
                top_k: Some(20),
                min_p: None,
                repeat_penalty: Some(1.05)
            })
        );
        write(r#"{"bos_token_id": 1, "eos_token_id": 2}"#);
        assert_eq!(sampling_defaults(dir.path()), None);
        write("not json");
        assert_eq!(sampling_defaults(dir.path()), None);
    }
}
