//! Engine status codes and their HTTP mapping: the one place where an engine failure becomes an
//! HTTP status (spec 001, with UNSUPPORTED as 501 per the spec's clarification).

use llmr_engine_abi as abi;

/// A non-OK status returned by a plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum EngineStatus {
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

impl EngineStatus {
    /// `None` for `LLMR_OK`; unknown codes read as `Internal`, as the header says.
    pub fn from_raw(code: abi::llmr_status) -> Option<Self> {
        Some(match code {
            abi::LLMR_OK => return None,
            abi::LLMR_ERR_OOM_VRAM => Self::OomVram,
            abi::LLMR_ERR_OOM_RAM => Self::OomRam,
            abi::LLMR_ERR_MODEL_CORRUPT => Self::ModelCorrupt,
            abi::LLMR_ERR_TIMEOUT => Self::Timeout,
            abi::LLMR_ERR_CANCELLED => Self::Cancelled,
            abi::LLMR_ERR_UNSUPPORTED => Self::Unsupported,
            abi::LLMR_ERR_ABI_MISMATCH => Self::AbiMismatch,
            abi::LLMR_ERR_LOAD_FAILED => Self::LoadFailed,
            _ => Self::Internal,
        })
    }

    pub fn raw(self) -> abi::llmr_status {
        match self {
            Self::OomVram => abi::LLMR_ERR_OOM_VRAM,
            Self::OomRam => abi::LLMR_ERR_OOM_RAM,
            Self::ModelCorrupt => abi::LLMR_ERR_MODEL_CORRUPT,
            Self::Timeout => abi::LLMR_ERR_TIMEOUT,
            Self::Cancelled => abi::LLMR_ERR_CANCELLED,
            Self::Unsupported => abi::LLMR_ERR_UNSUPPORTED,
            Self::Internal => abi::LLMR_ERR_INTERNAL,
            Self::AbiMismatch => abi::LLMR_ERR_ABI_MISMATCH,
            Self::LoadFailed => abi::LLMR_ERR_LOAD_FAILED,
        }
    }

    /// HTTP status for a failure that reached a client. An invalid client parameter never gets
    /// here: it is a 400 decided before any engine is called.
    pub fn http_status(self) -> u16 {
        match self {
            Self::OomVram | Self::OomRam => 507,
            Self::ModelCorrupt => 500,
            Self::Timeout => 504,
            Self::Cancelled => 499,
            Self::Unsupported => 501,
            Self::Internal | Self::AbiMismatch | Self::LoadFailed => 500,
        }
    }

    /// Stable snake_case code for JSON bodies and metric labels.
    pub fn code(self) -> &'static str {
        match self {
            Self::OomVram => "oom_vram",
            Self::OomRam => "oom_ram",
            Self::ModelCorrupt => "model_corrupt",
            Self::Timeout => "timeout",
            Self::Cancelled => "cancelled",
            Self::Unsupported => "unsupported",
            Self::Internal => "internal",
            Self::AbiMismatch => "abi_mismatch",
            Self::LoadFailed => "load_failed",
        }
    }
}

/// A failed plugin call: the status and the plugin's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("{} ({}): {message}", .status.code(), .status.raw())]
pub struct CallError {
    pub status: EngineStatus,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_maps_to_the_spec_status() {
        let expected = [(1, 507), (2, 507), (3, 500), (4, 504), (5, 499), (6, 501), (7, 500), (8, 500), (9, 500)];
        for (raw, http) in expected {
            let s = EngineStatus::from_raw(raw).unwrap();
            assert_eq!(s.raw(), raw);
            assert_eq!(s.http_status(), http, "{s:?}");
        }
        assert_eq!(EngineStatus::from_raw(0), None);
        assert_eq!(EngineStatus::from_raw(42), Some(EngineStatus::Internal));
        assert_eq!(EngineStatus::from_raw(-1), Some(EngineStatus::Internal));
    }
}
