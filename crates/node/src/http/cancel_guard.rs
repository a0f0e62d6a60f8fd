//! Cancels an engine request when the HTTP request that owns it is dropped before the engine
//! finished (the client left): for the endpoints that call the engine directly, outside the
//! generation pipeline (which owns its generations the same way).

use crate::models::LoadedModel;
use std::sync::Arc;

pub struct CancelOnDrop {
    model: Arc<LoadedModel>,
    request_id: u64,
    armed: bool,
}

impl CancelOnDrop {
    pub fn new(model: Arc<LoadedModel>, request_id: u64) -> Self {
        CancelOnDrop { model, request_id, armed: true }
    }

    /// The engine finished: nothing to cancel any more.
    pub fn disarm(&mut self) {
        self.armed = false;
    }

    pub fn model(&self) -> &LoadedModel {
        &self.model
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.model.engine.cancel(self.request_id);
        }
    }
}
