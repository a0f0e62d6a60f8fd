//! A safetensors checkpoint, single-file or sharded (`model.safetensors.index.json`), memory
//! mapped: tensors are views into the mapped files, typed and shape-checked when an
//! architecture asks for them, so a missing tensor, a wrong shape or a truncated file is an error
//! naming the tensor, never a panic in the forward pass.

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::tensor::Dtype;
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Element types this engine reads from disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    BF16,
    F16,
    F32,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    /// The file is not a valid safetensors file (truncated, bad header, overlapping data).
    #[error("{path} is corrupt: {message}")]
    Corrupt { path: PathBuf, message: String },
    #[error("{0}")]
    Index(String),
    #[error("tensor '{0}' is missing from the checkpoint")]
    Missing(String),
    #[error("tensor '{name}' has shape {found:?}; the model's config.json needs {expected:?}")]
    Shape { name: String, found: Vec<usize>, expected: Vec<usize> },
    #[error("tensor '{name}' is stored as {dtype}; this engine reads it as {wanted}")]
    DType { name: String, dtype: String, wanted: &'static str },
}

/// One tensor: where its bytes lie in which mapped file.
#[derive(Clone)]
pub struct TensorView {
    file: Arc<Mmap>,
    start: usize,
    end: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorView {
    pub fn bytes(&self) -> &[u8] {
        &self.file[self.start..self.end]
    }
    /// The values as f32 (a copy; for small tensors: norms, biases).
    pub fn to_f32(&self) -> Vec<f32> {
        let b = self.bytes();
        match self.dtype {
            DType::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            DType::BF16 => b.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            DType::F16 => b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        }
    }

    /// The mapped file this tensor lives in, and the byte range.
    pub fn file(&self) -> (&Arc<Mmap>, usize, usize) {
        (&self.file, self.start, self.end)
    }
}

/// A tensor of bytes (`U8`): gpt-oss's MXFP4 expert blocks and their exponents.
#[derive(Clone)]
pub struct ByteTensor {
    file: Arc<Mmap>,
    start: usize,
    end: usize,
    pub shape: Vec<usize>,
}

impl ByteTensor {
    pub fn bytes(&self) -> &[u8] {
        &self.file[self.start..self.end]
    }
}

struct Entry {
    file: usize,
    /// The engine's type, or how safetensors names one it does not compute in.
    dtype: Result<DType, Dtype>,
    shape: Vec<usize>,
    start: usize,
    end: usize,
}

pub struct Checkpoint {
    files: Vec<Arc<Mmap>>,
    tensors: HashMap<String, Entry>,
}

/// A shard named by the index must be a plain file name inside the model's folder.
fn shard_path(dir: &Path, name: &str) -> Result<PathBuf, CheckpointError> {
    let p = Path::new(name);
    let plain = p.components().all(|c| matches!(c, Component::Normal(_)));
    if name.is_empty() || !plain {
        return Err(CheckpointError::Index(format!(
            "the index names shard '{name}', which is outside the model's folder"
        )));
    }
    Ok(dir.join(p))
}

fn map(path: &Path) -> Result<Mmap, CheckpointError> {
    let io = |e: std::io::Error| CheckpointError::Io { path: path.to_path_buf(), message: e.to_string() };
    let file = std::fs::File::open(path).map_err(io)?;
    // SAFETY: the model store never rewrites a model file in place (it writes new files and
    // renames them), so the mapping's contents do not change under us.
    unsafe { Mmap::map(&file) }.map_err(io)
}

impl Checkpoint {
    /// Opens `primary`: a `.safetensors` file, or a `model.safetensors.index.json` whose shards
    /// lie beside it.
    pub fn open(primary: &Path) -> Result<Self, CheckpointError> {
        let dir = primary.parent().unwrap_or(Path::new("."));
        let shards: Vec<PathBuf> = if primary.to_string_lossy().ends_with(".index.json") {
            let text = std::fs::read_to_string(primary)
                .map_err(|e| CheckpointError::Io { path: primary.to_path_buf(), message: e.to_string() })?;
            let index: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| CheckpointError::Corrupt { path: primary.to_path_buf(), message: e.to_string() })?;
            let map = index
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| CheckpointError::Index(format!("{} has no weight_map object", primary.display())))?;
            let mut names: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            names.into_iter().map(|n| shard_path(dir, n)).collect::<Result<_, _>>()?
        } else {
            vec![primary.to_path_buf()]
        };
        let mut files = Vec::with_capacity(shards.len());
        let mut tensors = HashMap::new();
        for (i, path) in shards.iter().enumerate() {
            let mmap = map(path)?;
            let (header, meta) = SafeTensors::read_metadata(&mmap)
                .map_err(|e| CheckpointError::Corrupt { path: path.clone(), message: e.to_string() })?;
            let data_start = 8 + header;
            for (name, info) in meta.tensors() {
                let dtype = match info.dtype {
                    Dtype::BF16 => Ok(DType::BF16),
                    Dtype::F16 => Ok(DType::F16),
                    Dtype::F32 => Ok(DType::F32),
                    other => Err(other),
                };
                let (start, end) = (data_start + info.data_offsets.0, data_start + info.data_offsets.1);
                if end > mmap.len() {
                    return Err(CheckpointError::Corrupt {
                        path: path.clone(),
                        message: format!("tensor '{name}' ends past the end of the file"),
                    });
                }
                if tensors.contains_key(&name) {
                    return Err(CheckpointError::Index(format!("tensor '{name}' is in more than one shard")));
                }
                tensors.insert(name, Entry { file: i, dtype, shape: info.shape.clone(), start, end });
            }
            files.push(Arc::new(mmap));
        }
        Ok(Checkpoint { files, tensors })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The entry `name`, which must have exactly `shape` and `size` bytes per element.
    fn entry(
        &self,
        name: &str,
        shape: &[usize],
        size: impl Fn(&Entry) -> Result<usize, CheckpointError>,
    ) -> Result<&Entry, CheckpointError> {
        let e = self.tensors.get(name).ok_or_else(|| CheckpointError::Missing(name.to_string()))?;
        if e.shape != shape {
            return Err(CheckpointError::Shape { name: name.into(), found: e.shape.clone(), expected: shape.to_vec() });
        }
        if e.end - e.start != shape.iter().product::<usize>() * size(e)? {
            return Err(CheckpointError::Corrupt {
                path: PathBuf::from(name),
                message: "its byte length does not match its shape and type".into(),
            });
        }
        Ok(e)
    }

    /// The tensor `name`, which must have exactly `shape` and be bf16, f16 or f32.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<TensorView, CheckpointError> {
        let dtype = |e: &Entry| {
            e.dtype.map_err(|d| CheckpointError::DType {
                name: name.into(),
                dtype: format!("{d:?}"),
                wanted: "bf16, f16 or f32",
            })
        };
        let e = self.entry(name, shape, |e| Ok(dtype(e)?.size()))?;
        let dtype = dtype(e)?;
        Ok(TensorView { file: self.files[e.file].clone(), start: e.start, end: e.end, dtype, shape: e.shape.clone() })
    }

    /// The `U8` tensor `name`, which must have exactly `shape`.
    pub fn get_bytes(&self, name: &str, shape: &[usize]) -> Result<ByteTensor, CheckpointError> {
        let e = self.entry(name, shape, |e| match e.dtype {
            Err(Dtype::U8) => Ok(1),
            found => {
                let dtype = found.map_or_else(|d| format!("{d:?}"), |d| format!("{d:?}"));
                Err(CheckpointError::DType { name: name.into(), dtype, wanted: "U8 (MXFP4 blocks and scales)" })
            }
        })?;
        Ok(ByteTensor { file: self.files[e.file].clone(), start: e.start, end: e.end, shape: e.shape.clone() })
    }

    /// Bytes of all mapped files (what the weights occupy once paged in).
    pub fn mapped_bytes(&self) -> usize {
        self.files.iter().map(|f| f.len()).sum()
    }
}
