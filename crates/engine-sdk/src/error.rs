//! Errors a plugin returns, one variant per ABI status code.

use llmr_engine_abi as abi;
use std::fmt;

/// Status codes of spec 001, without `OK`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    OomVram,
    OomRam,
    ModelCorrupt,
    Timeout,
    Cancelled,
    Unsupported,
    Internal,
    AbiMismatch,
    LoadFailed,
}

impl ErrorCode {
    pub fn status(self) -> abi::llmr_status {
        match self {
            ErrorCode::OomVram => abi::LLMR_ERR_OOM_VRAM,
            ErrorCode::OomRam => abi::LLMR_ERR_OOM_RAM,
            ErrorCode::ModelCorrupt => abi::LLMR_ERR_MODEL_CORRUPT,
            ErrorCode::Timeout => abi::LLMR_ERR_TIMEOUT,
            ErrorCode::Cancelled => abi::LLMR_ERR_CANCELLED,
            ErrorCode::Unsupported => abi::LLMR_ERR_UNSUPPORTED,
            ErrorCode::Internal => abi::LLMR_ERR_INTERNAL,
            ErrorCode::AbiMismatch => abi::LLMR_ERR_ABI_MISMATCH,
            ErrorCode::LoadFailed => abi::LLMR_ERR_LOAD_FAILED,
        }
    }
}

/// A failure with the message the host reads through `llmr_engine_last_error`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineError {
    pub code: ErrorCode,
    pub message: String,
}

impl EngineError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
    pub fn unsupported(what: impl fmt::Display) -> Self {
        Self::new(ErrorCode::Unsupported, format!("{what} is not supported by this engine"))
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
    pub fn load_failed(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::LoadFailed, message)
    }
    pub fn model_not_loaded(model_id: &str) -> Self {
        Self::new(ErrorCode::LoadFailed, format!("model '{model_id}' is not loaded"))
    }
    pub fn cancelled() -> Self {
        Self::new(ErrorCode::Cancelled, "request cancelled")
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)
    }
}

impl std::error::Error for EngineError {}
