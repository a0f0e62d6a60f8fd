//! The one mapping from the node's errors to HTTP: status, OpenAI `type`, `param` and `code`.
//! Plain responses and in-stream SSE error events both go through it (an `ApiError` is a
//! response, and encoders write it as an event).

use crate::error::NodeError;
use llmr_openai::ApiError;

impl From<NodeError> for ApiError {
    fn from(e: NodeError) -> Self {
        let message = e.to_string();
        match e {
            NodeError::ModelNotFound(model) => ApiError::model_not_found(&model),
            NodeError::Incapable { .. } => ApiError::invalid("model", message),
            NodeError::Template(_) => ApiError::invalid("messages", message),
            NodeError::QueueFull { .. } | NodeError::DeviceBusy { .. } => ApiError::rate_limited(message, 1),
            NodeError::Unloading | NodeError::NoMemory { .. } | NodeError::NoDeviceMemory { .. } => {
                ApiError::unavailable(message)
            }
            NodeError::LoadFailed { error, .. } | NodeError::Engine(error) => {
                ApiError::with_status(error.status.http_status(), message).with_code(error.status.code())
            }
            NodeError::Internal(_) => ApiError::server(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llmr_engine_host::{CallError, Capability, EngineStatus};

    #[test]
    fn each_error_gets_its_status_and_field() {
        let engine = |status| CallError { status, message: "boom".into() };
        let cases = [
            (NodeError::ModelNotFound("m".into()), 404, Some("model")),
            (NodeError::Incapable { model: "m".into(), needs: Capability::Text }, 400, Some("model")),
            (NodeError::Template("bad".into()), 400, Some("messages")),
            (NodeError::QueueFull { running: 4, queued: 64 }, 429, None),
            (NodeError::DeviceBusy { wanted: Capability::Asr, holding: Capability::Text }, 429, None),
            (NodeError::Unloading, 503, None),
            (NodeError::NoMemory { model: "m".into(), budget_mib: 1, held_mib: 2 }, 503, None),
            (NodeError::NoDeviceMemory { model: "m".into(), needed_mib: 1, free_mib: 0 }, 503, None),
            (NodeError::LoadFailed { model: "m".into(), error: engine(EngineStatus::ModelCorrupt) }, 500, None),
            (NodeError::Engine(engine(EngineStatus::OomRam)), 507, None),
            (NodeError::Engine(engine(EngineStatus::Timeout)), 504, None),
            (NodeError::Internal("lost".into()), 500, None),
        ];
        for (error, status, param) in cases {
            let api = ApiError::from(error.clone());
            assert_eq!((api.status, api.param.as_deref()), (status, param), "{error}");
            assert!(api.message.contains(&error.to_string()), "{}", api.message);
        }
        let busy = ApiError::from(NodeError::QueueFull { running: 4, queued: 64 });
        assert_eq!(busy.retry_after, Some(1));
        assert!(busy.message.contains("4 requests running and 64 queued"), "{}", busy.message);
        let corrupt = ApiError::from(NodeError::Engine(engine(EngineStatus::ModelCorrupt)));
        assert_eq!(corrupt.code.as_deref(), Some(EngineStatus::ModelCorrupt.code()));
    }
}
