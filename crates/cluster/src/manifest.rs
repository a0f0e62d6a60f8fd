//! Model manifests: the files a node must have to serve a model, fixed once at registration
//! (spec 003: `/v0/models` returns exactly what registration decided; no `metadata.json`).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelFormat {
    Gguf,
    Safetensors,
    /// whisper.cpp's model files (`ggml-*.bin`).
    Ggml,
    /// ONNX models (Piper voices: `voice.onnx` with its `voice.onnx.json`).
    Onnx,
}

impl ModelFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelFormat::Gguf => "gguf",
            ModelFormat::Safetensors => "safetensors",
            ModelFormat::Ggml => "ggml",
            ModelFormat::Onnx => "onnx",
        }
    }

    /// What a model of this format serves, where the format alone says it: speech formats. Text
    /// formats hold chat, embedding and vision models alike (the node reads which).
    pub fn speech_capability(self) -> Option<&'static str> {
        match self {
            ModelFormat::Ggml => Some("asr"),
            ModelFormat::Onnx => Some("tts"),
            ModelFormat::Gguf | ModelFormat::Safetensors => None,
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "gguf" => Some(ModelFormat::Gguf),
            "safetensors" => Some(ModelFormat::Safetensors),
            "ggml" => Some(ModelFormat::Ggml),
            "onnx" => Some(ModelFormat::Onnx),
            _ => None,
        }
    }
}

/// Where a node fetches a manifest's files from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelSource {
    /// A Hugging Face compatible hub: files are `{endpoint}/{repo}/resolve/{revision}/{path}`.
    Hub { endpoint: String, repo: String, revision: String },
    /// A directory every node can read (a shared mount): files are used in place, not copied.
    Path { dir: String },
    /// A single file at a URL (its manifest has exactly one file).
    Url { url: String },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// Relative to the model's directory; checked by [`crate::check_relative_path`].
    pub path: String,
    pub size: u64,
    /// Lower-case hex. Nodes refuse a download whose digest differs.
    pub sha256: String,
}

/// A registered model, exactly as registration fixed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelManifest {
    /// The name clients send as `model` (default: the repository id).
    pub name: String,
    pub format: ModelFormat,
    pub source: ModelSource,
    /// Every file a node needs; the primary one among them.
    pub files: Vec<ManifestFile>,
    /// For GGUF the model file; for safetensors the `*.safetensors.index.json` or the single
    /// `*.safetensors` file (spec 003).
    pub primary: String,
    /// GGUF quantization (`Q4_K_M`, ...) or the safetensors `torch_dtype`, when known.
    pub quantization: Option<String>,
    /// `general.architecture` (GGUF) or `config.json`'s `model_type`.
    pub architecture: Option<String>,
    pub has_chat_template: bool,
    /// Unix seconds.
    pub registered_at: u64,
}

impl ModelManifest {
    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// `POST /v0/models`: exactly one of `repo`, `path`, `url`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterModel {
    /// A Hugging Face repository id (`owner/name`).
    #[serde(default)]
    pub repo: Option<String>,
    /// A directory (or a GGUF file) that every node can read at the same path.
    #[serde(default)]
    pub path: Option<String>,
    /// An http(s) URL of one GGUF file.
    #[serde(default)]
    pub url: Option<String>,
    /// The served name; default the repository id (or the file's stem).
    #[serde(default)]
    pub name: Option<String>,
    /// Required when the repository has both GGUF and safetensors weights.
    #[serde(default)]
    pub format: Option<ModelFormat>,
    /// GGUF only: the file in the repository.
    #[serde(default)]
    pub file: Option<String>,
    /// GGUF only: the quantization tag to pick (`Q4_K_M`), exact and case-sensitive.
    #[serde(default)]
    pub quantization: Option<String>,
    /// Hub revision; default `main`.
    #[serde(default)]
    pub revision: Option<String>,
}
