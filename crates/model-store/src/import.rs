//! Adding a GGUF file to the store, atomically: the file appears in the model directory complete
//! or not at all, so a concurrent `list`/`resolve` (or a crash) never sees half a model.

use crate::descriptor::{Format, ModelDescriptor};
use crate::error::StoreError;
use crate::gguf::GgufHeader;
use crate::layout::{self, GgufFiles};
use crate::name::ModelRef;
use crate::store::{available, read_variants, ModelStore};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

impl ModelStore {
    /// Links or copies the GGUF file `source` into the directory of `name` (`model`,
    /// `org/model`, or `model:QUANT`, where the tag must equal the file's quantization),
    /// keeping its file name. Refused when it would make the directory ambiguous: a file of the
    /// same name or quantization, or safetensors weights, already there. Projectors and split
    /// GGUF parts are not imported this way.
    pub fn import_file(&self, name: &str, source: &Path) -> Result<ModelDescriptor, StoreError> {
        let model_ref = ModelRef::parse(name)?;
        let file_name = source
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| layout::is_gguf(n) && !n.starts_with('.') && layout::split_part(n).is_none())
            .ok_or_else(|| StoreError::NotGgufFileName { path: source.to_path_buf() })?;
        if layout::is_mmproj(file_name) {
            return Err(StoreError::Projector { path: source.to_path_buf() });
        }
        let header = GgufHeader::open(source).map_err(StoreError::gguf(source))?;
        if header.architecture().is_none() {
            return Err(StoreError::MissingArchitecture { path: source.to_path_buf() });
        }
        let quantization = header.quantization();
        if let Some(requested) = &model_ref.quantization {
            if quantization != Some(requested.as_str()) {
                return Err(StoreError::QuantizationMismatch {
                    path: source.to_path_buf(),
                    requested: requested.clone(),
                    actual: quantization.map(str::to_string),
                });
            }
        }

        let dir = self.model_dir(&model_ref.name);
        self.check_namespace(&model_ref, &dir)?;
        let dest = dir.join(file_name);
        if dest.exists() {
            return Err(StoreError::AlreadyExists { path: dest });
        }
        let mut existing = 0;
        if dir.is_dir() {
            let listing = layout::read_dir(&dir).map_err(StoreError::io(&dir))?;
            if listing.has_safetensors() {
                return Err(StoreError::MixedFormats { dir, gguf: vec![file_name.to_string()] });
            }
            let variants = read_variants(listing.gguf_models())?;
            existing = variants.len();
            if let Some(same) = variants.iter().find(|v| v.header.quantization() == quantization) {
                return Err(StoreError::DuplicateQuantization {
                    name: model_ref.name.to_string(),
                    quantization: quantization.map(str::to_string),
                    files: vec![same.files.primary.clone(), source.to_path_buf()],
                });
            }
            if quantization.is_none() && existing > 0 {
                // It could never be selected by a tag.
                let mut found: Vec<(Option<&str>, &Path)> =
                    variants.iter().map(|v| (v.header.quantization(), v.files.primary.as_path())).collect();
                found.push((None, source));
                let name = model_ref.name.to_string();
                return Err(StoreError::AmbiguousQuantization { name, available: available(&found) });
            }
        }
        fs::create_dir_all(&dir).map_err(StoreError::io(&dir))?;
        place(source, &dest)?;

        let listing = layout::read_dir(&dir).map_err(StoreError::io(&dir))?;
        let shown = match quantization {
            Some(q) if existing > 0 => format!("{}:{q}", model_ref.name),
            _ => model_ref.name.to_string(),
        };
        let files = GgufFiles { primary: dest, other_parts: vec![], missing_parts: vec![] };
        ModelDescriptor::from_gguf(shown, &files, &header, listing.mmproj())
    }
}

impl ModelStore {
    /// Places a speech model in the directory of `name`: a whisper.cpp file, or a Piper voice
    /// (`voice.onnx`) whose config (`voice.onnx.json`) is given in `companions`. Companions are
    /// placed first, the model file last, so a scan never sees a voice without its config. The
    /// directory must hold no model yet: a speech model is alone in its directory.
    pub fn import_speech_files(
        &self,
        name: &str,
        source: &Path,
        companions: &[PathBuf],
    ) -> Result<ModelDescriptor, StoreError> {
        let model_ref = ModelRef::parse(name)?;
        if model_ref.quantization.is_some() {
            return Err(StoreError::TagOnNonGguf { name: model_ref.name.to_string(), format: Format::Ggml });
        }
        let file_name = source
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| !n.starts_with('.'))
            .ok_or_else(|| StoreError::NotSpeechModel { path: source.to_path_buf() })?;
        let dir = self.model_dir(&model_ref.name);
        self.check_namespace(&model_ref, &dir)?;
        if layout::read_dir(&dir).is_ok_and(|l| l.has_model_files()) {
            return Err(StoreError::AlreadyExists { path: dir });
        }
        fs::create_dir_all(&dir).map_err(StoreError::io(&dir))?;
        for companion in companions {
            let companion_name =
                companion.file_name().ok_or_else(|| StoreError::NotSpeechModel { path: companion.clone() })?;
            place(companion, &dir.join(companion_name))?;
        }
        let dest = dir.join(file_name);
        // Described before it is published: a file that is no speech model never appears.
        ModelDescriptor::from_speech_file(model_ref.name.to_string(), source)?;
        place(source, &dest)?;
        ModelDescriptor::from_speech_file(model_ref.name.to_string(), &dest)
    }

    /// `org` and `org/model` cannot both be models: `list` reads a directory with model files as
    /// a model and would hide the models under it.
    fn check_namespace(&self, model_ref: &ModelRef, dir: &Path) -> Result<(), StoreError> {
        let clash = match model_ref.name.as_str().split_once('/') {
            Some((org, _)) => {
                let org_dir = self.root().join(org);
                layout::read_dir(&org_dir).ok().filter(|l| l.has_model_files()).map(|_| org_dir)
            }
            None => layout::read_dir(dir).ok().filter(|l| !l.subdirs.is_empty()).map(|_| dir.to_path_buf()),
        };
        match clash {
            Some(other) => Err(StoreError::NamespaceClash { name: model_ref.name.to_string(), other }),
            None => Ok(()),
        }
    }
}

/// Removes the temporary file unless the import completed.
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = fs::remove_file(path);
        }
    }
}

/// A hidden name beside `dest` (directory scans skip names starting with '.'), unique within
/// this process and, with the pid, across processes.
fn temp_path(dest: &Path) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let file = dest.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    dest.with_file_name(format!(".{file}.{}.{n}.partial", std::process::id()))
}

/// Publishes `source` at `dest`: a hard link when both are on one filesystem (instant and no
/// extra space; GGUF files are replaced, never modified in place), else a synced copy. Either
/// way it is made under a temporary name in the destination directory and renamed, which is
/// atomic within one directory.
fn place(source: &Path, dest: &Path) -> Result<(), StoreError> {
    let tmp_path = temp_path(dest);
    let mut tmp = TempFile(Some(tmp_path.clone()));
    if let Err(error) = fs::hard_link(source, &tmp_path) {
        tracing::debug!(source = %source.display(), %error, "cannot hard-link into the store; copying");
        copy_synced(source, &tmp_path)?;
    }
    fs::rename(&tmp_path, dest).map_err(StoreError::io(dest))?;
    tmp.0 = None;
    // Persist the rename itself; best effort, as not every platform can sync a directory.
    if let Some(dir) = dest.parent() {
        let _ = File::open(dir).and_then(|d| d.sync_all());
    }
    Ok(())
}

fn copy_synced(source: &Path, tmp: &Path) -> Result<(), StoreError> {
    let mut input = File::open(source).map_err(StoreError::io(source))?;
    let mut output = File::create_new(tmp).map_err(StoreError::io(tmp))?;
    std::io::copy(&mut input, &mut output).map_err(StoreError::io(tmp))?;
    output.sync_all().map_err(StoreError::io(tmp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_complete_and_temporaries_are_cleaned_up() {
        let tmp = tempfile::tempdir().unwrap();
        let source = tmp.path().join("src.gguf");
        fs::write(&source, b"GGUF and more").unwrap();
        let partial = temp_path(&tmp.path().join("dest.gguf"));
        assert!(partial.file_name().unwrap().to_str().unwrap().starts_with(".dest.gguf."));
        {
            let _guard = TempFile(Some(partial.clone()));
            copy_synced(&source, &partial).unwrap();
            assert_eq!(fs::read(&partial).unwrap(), b"GGUF and more");
            // A second writer never reuses an existing temporary file.
            assert!(copy_synced(&source, &partial).is_err());
        }
        assert!(!partial.exists(), "the guard removes an abandoned temporary file");
    }
}
