//! `manifest.json`: parsing and the validation rules of spec 001, with the spec's messages.
//!
//! The JSON Schema published in `manifest.schema.json` describes the same document; a test checks
//! every committed manifest against it.

use serde::Deserialize;
use std::path::{Component, Path, PathBuf};

/// GPU backends a plugin folder can be built for (`engines/<id>/<backend>/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuBackend {
    Cuda,
    Metal,
    Directml,
    Cpu,
}

impl GpuBackend {
    pub const ALL: [GpuBackend; 4] = [Self::Cuda, Self::Metal, Self::Directml, Self::Cpu];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            Self::Metal => "metal",
            Self::Directml => "directml",
            Self::Cpu => "cpu",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.as_str() == s)
    }

    /// The `LLMR_GPU_*` value passed in `llmr_engine_config.gpu_backend`.
    pub fn abi(self) -> u32 {
        use llmr_engine_abi as abi;
        match self {
            Self::Cuda => abi::LLMR_GPU_CUDA,
            Self::Metal => abi::LLMR_GPU_METAL,
            Self::Directml => abi::LLMR_GPU_DIRECTML,
            Self::Cpu => abi::LLMR_GPU_CPU,
        }
    }
}

impl std::fmt::Display for GpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Model formats an engine can read.
pub const KNOWN_FORMATS: &[&str] = &["gguf", "safetensors", "onnx", "ggml"];
/// Capabilities (spec: text, embedding, vision, asr, tts, image).
pub const KNOWN_MODALITIES: &[&str] = &["text", "embedding", "vision", "asr", "tts", "image"];
/// RuntimeType names of the spec; plugins may add their own.
pub const SPEC_RUNTIMES: &[&str] =
    &["LlamaCpp", "GptOssCpp", "NemotronCpp", "WhisperCpp", "OnnxRuntime", "StableDiffusion"];

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Dependency {
    pub name: String,
    pub min_version: String,
}

/// `abi_version` is a string of digits in spec 001; a plain number is accepted too.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum AbiVersionField {
    Number(u64),
    Text(String),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    id: String,
    version: String,
    abi_version: AbiVersionField,
    #[serde(default)]
    gpu_backends: Vec<String>,
    /// Spec 001's singular form, accepted as a one-element `gpu_backends`.
    #[serde(default)]
    gpu_backend: Option<String>,
    #[serde(default)]
    runtimes: Vec<String>,
    #[serde(default)]
    formats: Vec<String>,
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    modalities: Vec<String>,
    binary: String,
    #[serde(default)]
    supports_vision: bool,
    #[serde(default)]
    license: Option<String>,
    #[serde(default)]
    dependencies: Vec<Dependency>,
    #[serde(default)]
    log_level: Option<String>,
    #[serde(default)]
    parameters: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    builtin: bool,
    #[serde(default, rename = "$schema")]
    _schema: Option<String>,
    #[serde(default)]
    description: Option<String>,
}

/// A validated manifest.
#[derive(Clone, Debug)]
pub struct Manifest {
    pub id: String,
    pub version: semver::Version,
    pub abi_version: u32,
    pub gpu_backends: Vec<GpuBackend>,
    pub runtimes: Vec<String>,
    pub formats: Vec<String>,
    pub architectures: Vec<String>,
    pub modalities: Vec<String>,
    pub binary: String,
    pub supports_vision: bool,
    pub license: Option<String>,
    pub dependencies: Vec<Dependency>,
    pub log_level: Option<String>,
    /// Custom engine parameters, handed to the engine as `params_json`.
    pub parameters: serde_json::Map<String, serde_json::Value>,
    /// Shipped with llmr (third-party plugins win ties against built-in ones).
    pub builtin: bool,
    pub description: Option<String>,
}

/// Why a manifest or its plugin was refused. Messages follow spec 001 where it has one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("Cannot read manifest {path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    #[error("Invalid manifest {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("ABI version mismatch: expected {expected}, got {got}")]
    AbiMismatch { expected: u32, got: String },
    #[error("Plugin ID conflict: {0} already loaded")]
    IdConflict(String),
    #[error("Binary not found: {}", .0.display())]
    BinaryNotFound(PathBuf),
    #[error("Binary path escapes the plugin folder: {0}")]
    BinaryEscapes(String),
    #[error("No architectures specified")]
    NoArchitectures,
    #[error("GPU backend mismatch: {0}")]
    GpuBackendMismatch(String),
    #[error("Plugin ID mismatch: {0}")]
    IdMismatch(String),
}

impl Manifest {
    /// Reads and validates `dir/manifest.json`, where `dir` is `engines/<id>/<backend>/`.
    /// Checks that do not need the binary's contents: the ABI version, the id against the folder,
    /// the backend against the folder, the binary's confinement and existence, non-empty
    /// architectures, known formats and modalities.
    pub fn load(dir: &Path, host_abi_major: u32) -> Result<Manifest, ManifestError> {
        let path = dir.join("manifest.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| ManifestError::Unreadable { path: path.clone(), reason: e.to_string() })?;
        let raw: RawManifest = serde_json::from_str(&text)
            .map_err(|e| ManifestError::Invalid { path: path.clone(), reason: e.to_string() })?;
        let invalid = |reason: String| ManifestError::Invalid { path: path.clone(), reason };

        let abi_version = match &raw.abi_version {
            AbiVersionField::Number(n) => u32::try_from(*n).ok(),
            AbiVersionField::Text(t) if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => t.parse().ok(),
            AbiVersionField::Text(_) => None,
        };
        let got = match &raw.abi_version {
            AbiVersionField::Number(n) => n.to_string(),
            AbiVersionField::Text(t) => t.clone(),
        };
        if abi_version != Some(host_abi_major) {
            return Err(ManifestError::AbiMismatch { expected: host_abi_major, got });
        }

        if raw.id.is_empty()
            || !raw.id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        {
            return Err(invalid(format!(
                "`id` must be non-empty lowercase letters, digits, '_' or '-', got {:?}",
                raw.id
            )));
        }
        let version = semver::Version::parse(&raw.version)
            .map_err(|e| invalid(format!("`version` {:?} is not semver: {e}", raw.version)))?;

        let folder_backend = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let folder_id = dir.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str()).unwrap_or_default();
        if folder_id != raw.id {
            return Err(ManifestError::IdMismatch(format!(
                "folder engines/{folder_id}/ holds manifest id {:?}",
                raw.id
            )));
        }

        let mut backend_names = raw.gpu_backends.clone();
        backend_names.extend(raw.gpu_backend.clone());
        if backend_names.is_empty() {
            return Err(invalid("`gpu_backends` is empty".into()));
        }
        let mut gpu_backends = Vec::new();
        for name in &backend_names {
            let b = GpuBackend::parse(name).ok_or_else(|| {
                invalid(format!("unknown gpu backend {name:?} (expected one of cuda, metal, directml, cpu)"))
            })?;
            if !gpu_backends.contains(&b) {
                gpu_backends.push(b);
            }
        }
        match GpuBackend::parse(folder_backend) {
            Some(b) if gpu_backends.contains(&b) => {}
            _ => {
                return Err(ManifestError::GpuBackendMismatch(format!(
                    "folder {folder_backend:?} is not among the manifest's gpu_backends {backend_names:?}"
                )))
            }
        }

        if raw.architectures.iter().all(|a| a.trim().is_empty()) {
            return Err(ManifestError::NoArchitectures);
        }
        if raw.runtimes.is_empty() {
            return Err(invalid("`runtimes` is empty".into()));
        }
        if raw.formats.is_empty() {
            return Err(invalid("`formats` is empty".into()));
        }
        if let Some(f) = raw.formats.iter().find(|f| !KNOWN_FORMATS.contains(&f.as_str())) {
            return Err(invalid(format!("unknown format {f:?} (expected one of {KNOWN_FORMATS:?})")));
        }
        // Spec 001 calls text generation "completion"; both names mean the same capability.
        let modalities: Vec<String> =
            raw.modalities.iter().map(|m| if m == "completion" { "text".to_string() } else { m.clone() }).collect();
        if let Some(m) = modalities.iter().find(|m| !KNOWN_MODALITIES.contains(&m.as_str())) {
            return Err(invalid(format!("unknown modality {m:?} (expected one of {KNOWN_MODALITIES:?})")));
        }

        let binary_path = confined_binary(dir, &raw.binary)?;
        if !binary_path.is_file() {
            return Err(ManifestError::BinaryNotFound(binary_path));
        }

        Ok(Manifest {
            id: raw.id,
            version,
            abi_version: host_abi_major,
            gpu_backends,
            runtimes: raw.runtimes,
            formats: raw.formats,
            architectures: raw.architectures,
            modalities,
            binary: raw.binary,
            supports_vision: raw.supports_vision,
            license: raw.license,
            dependencies: raw.dependencies,
            log_level: raw.log_level,
            parameters: raw.parameters.unwrap_or_default(),
            builtin: raw.builtin,
            description: raw.description,
        })
    }
}

/// `binary` must be a plain file name inside the plugin folder; a symlink must not lead outside.
fn confined_binary(dir: &Path, binary: &str) -> Result<PathBuf, ManifestError> {
    let rel = Path::new(binary);
    let mut components = rel.components();
    let plain = matches!((components.next(), components.next()), (Some(Component::Normal(_)), None));
    if !plain || binary.contains('\\') {
        return Err(ManifestError::BinaryEscapes(binary.to_string()));
    }
    let path = dir.join(rel);
    if let (Ok(real_dir), Ok(real_bin)) = (dir.canonicalize(), path.canonicalize()) {
        if !real_bin.starts_with(&real_dir) {
            return Err(ManifestError::BinaryEscapes(format!("{binary} -> {}", real_bin.display())));
        }
    }
    Ok(path)
}
