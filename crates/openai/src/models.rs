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
}

impl ModelObject {
    pub fn new(id: impl Into<String>, created: u64) -> Self {
        ModelObject { id: id.into(), object: "model".into(), created, owned_by: "llmr".into() }
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
