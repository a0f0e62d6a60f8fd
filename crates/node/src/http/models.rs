//! `/v1/models` and `/v1/models/{id}`.

use super::SharedState;
use crate::models::CatalogEntry;
use axum::extract::{Path, State};
use axum::Json;
use llmr_openai::{ApiError, ModelList, ModelObject};

pub async fn list(State(state): State<SharedState>) -> Json<ModelList> {
    Json(ModelList::new(state.models.entries().iter().map(|e| object(e)).collect()))
}

pub async fn get(State(state): State<SharedState>, Path(id): Path<String>) -> Result<Json<ModelObject>, ApiError> {
    match state.models.entry(&id) {
        Some(e) => Ok(Json(object(&e))),
        None => Err(ApiError::model_not_found(&id)),
    }
}

fn object(e: &CatalogEntry) -> ModelObject {
    ModelObject::new(e.desc.name.clone(), e.created).with_capabilities(e.desc.capability_names())
}
