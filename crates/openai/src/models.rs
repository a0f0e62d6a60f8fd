//! `/v1/models` and `/v1/models/{id}`.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct ModelObject {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: String,
}

impl ModelObject {
    pub fn new(id: impl Into<String>, created: u64) -> Self {
        ModelObject { id: id.into(), object: "model", created, owned_by: "llmr".into() }
    }
}

#[derive(Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelObject>,
}

impl ModelList {
    pub fn new(data: Vec<ModelObject>) -> Self {
        ModelList { object: "list", data }
    }
}
