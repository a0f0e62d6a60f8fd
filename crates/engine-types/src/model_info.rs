//! `llmr_engine_model_info`'s JSON document, typed. Plugins written with the SDK produce it from
//! this struct and the host reads it back into it, so no caller indexes the JSON by string keys.
//! Every key is optional (the header says so); engine-specific keys are kept in `extra`.

use crate::{Capability, SamplingDefaults};
use serde::{Deserialize, Deserializer, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Tokens per sequence the engine will hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_context_length: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding_length: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// `none`, `mean`, `cls`, `last` or `rank`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooling: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quantization: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<u64>,
    /// Requests the engine runs at once for this model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<u32>,
    /// The sampling settings the model recommends, for what requests leave unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_defaults: Option<SamplingDefaults>,
    /// Speech models: the ISO 639-1 codes of the languages it hears or speaks (one for an
    /// English-only Whisper), and whether it can translate speech into English.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub languages: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub translates: Option<bool>,
    /// Text-to-speech models: the voices a request may name (the first is the default) and the
    /// rate of the audio it makes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub voices: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_rate: Option<u32>,
    /// What this model (not the engine) can do. Names this host does not know are dropped: it
    /// could not serve them anyway.
    #[serde(default, deserialize_with = "known_capabilities", skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<Capability>,
    /// Engine-specific keys (`kv_cache_type`, `threads`, ...).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl ModelInfo {
    pub fn has(&self, capability: Capability) -> bool {
        self.capabilities.contains(&capability)
    }

    /// Parses the document an engine wrote; the error names the key that did not fit.
    pub fn from_json(text: &[u8]) -> Result<Self, String> {
        let value: serde_json::Value = serde_json::from_slice(text).map_err(|e| format!("not JSON: {e}"))?;
        if !value.is_object() {
            return Err("not a JSON object".into());
        }
        serde_json::from_value(value).map_err(|e| e.to_string())
    }
}

fn known_capabilities<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Capability>, D::Error> {
    let names = Option::<Vec<String>>::deserialize(d)?.unwrap_or_default();
    Ok(names.iter().filter_map(|n| Capability::parse(n)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_round_trips_with_its_extra_keys() {
        let info = ModelInfo::from_json(
            br#"{"architecture":"llama","context_length":2048,"vocab_size":49152,"chat_template":null,
                "capabilities":["text","embedding","telepathy"],"kv_cache_type":"f16","slots":4}"#,
        )
        .unwrap();
        assert_eq!(info.architecture.as_deref(), Some("llama"));
        assert_eq!((info.context_length, info.vocab_size, info.slots), (Some(2048), Some(49152), Some(4)));
        assert_eq!(info.capabilities, [Capability::Text, Capability::Embedding]);
        assert!(info.has(Capability::Text) && !info.has(Capability::Vision));
        assert_eq!(info.extra["kv_cache_type"], "f16");
        let again = ModelInfo::from_json(serde_json::to_string(&info).unwrap().as_bytes()).unwrap();
        assert_eq!(again, info);
    }

    #[test]
    fn a_wrong_type_names_the_key() {
        let e = ModelInfo::from_json(br#"{"context_length":"long"}"#).unwrap_err();
        assert!(e.contains("invalid type"), "{e}");
        assert!(ModelInfo::from_json(b"[1]").unwrap_err().contains("object"));
        assert!(ModelInfo::from_json(b"{").unwrap_err().contains("JSON"));
        assert_eq!(ModelInfo::from_json(b"{}").unwrap(), ModelInfo::default());
    }
}
