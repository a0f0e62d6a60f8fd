//! Weight formats, named as in plugin manifests' `formats`, and their ABI values.

use llmr_engine_abi as abi;
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Gguf,
    Safetensors,
    Onnx,
    /// whisper.cpp's own format.
    Ggml,
}

impl Format {
    pub const ALL: [Format; 4] = [Format::Gguf, Format::Safetensors, Format::Onnx, Format::Ggml];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gguf => "gguf",
            Self::Safetensors => "safetensors",
            Self::Onnx => "onnx",
            Self::Ggml => "ggml",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.as_str() == name)
    }

    /// `LLMR_FORMAT_*`.
    pub fn to_abi(self) -> u32 {
        match self {
            Self::Gguf => abi::LLMR_FORMAT_GGUF,
            Self::Safetensors => abi::LLMR_FORMAT_SAFETENSORS,
            Self::Onnx => abi::LLMR_FORMAT_ONNX,
            Self::Ggml => abi::LLMR_FORMAT_GGML,
        }
    }

    /// `None` for `LLMR_FORMAT_UNKNOWN` and values a newer host may add.
    pub fn from_abi(raw: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.to_abi() == raw)
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_abi_values_round_trip() {
        for f in Format::ALL {
            assert_eq!(Format::parse(f.as_str()), Some(f));
            assert_eq!(Format::from_abi(f.to_abi()), Some(f));
        }
        assert_eq!(Format::from_abi(abi::LLMR_FORMAT_UNKNOWN), None);
        assert_eq!(Format::parse("GGUF"), None, "manifest names are lower-case");
    }
}
