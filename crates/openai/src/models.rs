//! `/v1/models` and `/v1/models/{id}`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelObject {
    pub id: String,
    /// `model`
    #[serde(default)]
    pub object: String,
    /// Other servers may leave this and `owned_by` out; a reader needs only the id.
    #[serde(default)]
    pub created: u64,
    #[serde(default)]
    pub owned_by: String,
    /// llmr's addition: what the model serves (`text`, `embedding`, `vision`, `asr` for
    /// transcriptions and translations, `tts` for speech), so a client can pick a model for an
    /// endpoint without trying it. Left out where not known yet (a model still downloading).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
}

impl ModelObject {
    pub fn new(id: impl Into<String>, created: u64) -> Self {
        ModelObject {
            id: id.into(),
            object: "model".into(),
            created,
            owned_by: "llmr".into(),
            capabilities: Vec::new(),
        }
    }

    pub fn with_capabilities(mut self, capabilities: Vec<String>) -> Self {
        self.capabilities = capabilities;
        self
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelList {
    /// `list`
    #[serde(default)]
    pub object: String,
    pub data: Vec<ModelObject>,
}

impl ModelList {
    pub fn new(data: Vec<ModelObject>) -> Self {
        ModelList { object: "list".into(), data }
    }
}
