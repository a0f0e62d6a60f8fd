//! `ModelStore`: one directory per model under a root (`~/.llmr/models` by default); `org/model`
//! names are nested directories. A directory holds a safetensors model, or one or more GGUF
//! files (one per quantization, addressed as `model:QUANT`) plus an optional projector.
//!
//! Request names are confined to the root lexically (see [`ModelName`]); symbolic links inside
//! the root are followed, as they can only be placed there by whoever administers the store.

use crate::descriptor::{Format, ModelDescriptor};
use crate::error::StoreError;
use crate::gguf::GgufHeader;
use crate::layout::{self, DirListing, GgufFiles};
use crate::name::{ModelName, ModelRef};
use crate::safetensors;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug)]
pub struct ModelStore {
    root: PathBuf,
}

/// One GGUF model of a directory, with its header.
pub(crate) struct Variant {
    pub files: GgufFiles,
    pub header: GgufHeader,
}

impl ModelStore {
    /// Opens the store at `root`, creating the directory when missing.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(StoreError::io(&root))?;
        Ok(Self { root })
    }

    /// `~/.llmr/models`, when the home directory is known.
    pub fn default_root() -> Option<PathBuf> {
        let home = std::env::var_os("HOME").or_else(|| std::env::var_os("USERPROFILE"))?;
        Some(PathBuf::from(home).join(".llmr").join("models"))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of a model; inside the root whatever the name, as [`ModelName`] guarantees.
    pub fn model_dir(&self, name: &ModelName) -> PathBuf {
        self.root.join(name.relative_path())
    }

    /// Resolves `model`, `org/model` or `model:QUANT` to the model it names.
    pub fn resolve(&self, name: &str) -> Result<ModelDescriptor, StoreError> {
        let model_ref = ModelRef::parse(name)?;
        let dir = self.model_dir(&model_ref.name);
        if !dir.is_dir() {
            return Err(StoreError::NotFound { name: model_ref.name.to_string(), dir });
        }
        let listing = layout::read_dir(&dir).map_err(StoreError::io(&dir))?;
        resolve_in(&model_ref, &listing)
    }

    /// Every model in the store, one descriptor per name that resolves. Directories that hold
    /// no valid model are skipped with a warning, so one broken download hides only itself.
    pub fn list(&self) -> Vec<ModelDescriptor> {
        let mut out = Vec::new();
        let top = match layout::read_dir(&self.root) {
            Ok(listing) => listing,
            Err(error) => {
                tracing::warn!(root = %self.root.display(), %error, "cannot read the model store");
                return out;
            }
        };
        for first in &top.subdirs {
            let Some((name, listing)) = self.listing_of(first) else { continue };
            if listing.has_model_files() {
                list_model(&name, &listing, &mut out);
                continue;
            }
            // Not a model: an organisation directory holding models.
            for second in &listing.subdirs {
                match self.listing_of(&format!("{first}/{second}")) {
                    Some((name, inner)) if inner.has_model_files() => list_model(&name, &inner, &mut out),
                    Some((name, _)) => tracing::debug!(model = %name, "no model files; skipped"),
                    None => {}
                }
            }
        }
        out
    }

    fn listing_of(&self, name: &str) -> Option<(ModelName, DirListing)> {
        let name = match ModelName::parse(name) {
            Ok(name) => name,
            Err(error) => {
                tracing::warn!(%error, "directory in the model store is not a valid model name; skipped");
                return None;
            }
        };
        let dir = self.model_dir(&name);
        match layout::read_dir(&dir) {
            Ok(listing) => Some((name, listing)),
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "cannot read model directory; skipped");
                None
            }
        }
    }
}

fn list_model(name: &ModelName, listing: &DirListing, out: &mut Vec<ModelDescriptor>) {
    match describe_all(name, listing) {
        Ok(found) => out.extend(found),
        Err(error) => tracing::warn!(model = %name, %error, "invalid model directory; skipped"),
    }
}

/// The descriptors of every name that resolves in a model directory: the bare name when it
/// holds one model, else `name:QUANT` for each GGUF with a known, unique quantization.
fn describe_all(name: &ModelName, listing: &DirListing) -> Result<Vec<ModelDescriptor>, StoreError> {
    let ggufs = listing.gguf_models();
    if ggufs.is_empty() {
        return resolve_in(&ModelRef { name: name.clone(), quantization: None }, listing).map(|d| vec![d]);
    }
    let variants = read_variants(ggufs)?;
    let mmproj = listing.mmproj();
    if let [only] = variants.as_slice() {
        if !listing.has_safetensors() {
            return Ok(vec![ModelDescriptor::from_gguf(name.to_string(), &only.files, &only.header, mmproj)?]);
        }
    }
    let mut out = Vec::new();
    for v in &variants {
        let quant = v.header.quantization();
        let unique = quant.is_some() && variants.iter().filter(|o| o.header.quantization() == quant).count() == 1;
        match quant {
            Some(q) if unique => {
                out.push(ModelDescriptor::from_gguf(format!("{name}:{q}"), &v.files, &v.header, mmproj.clone())?)
            }
            _ => tracing::warn!(
                model = %name,
                file = %v.files.primary.display(),
                quantization = quant,
                "GGUF has no unique quantization among several, so no name selects it; skipped"
            ),
        }
    }
    Ok(out)
}

fn resolve_in(model_ref: &ModelRef, listing: &DirListing) -> Result<ModelDescriptor, StoreError> {
    let name = &model_ref.name;
    let ggufs = listing.gguf_models();
    let has_safetensors = listing.has_safetensors();
    if ggufs.is_empty() {
        if !has_safetensors && listing.has_speech_model() {
            if model_ref.quantization.is_some() {
                let format = listing.speech_model(name.to_string())?.format;
                return Err(StoreError::TagOnNonGguf { name: name.to_string(), format });
            }
            return listing.speech_model(name.to_string());
        }
        if !has_safetensors {
            return Err(StoreError::NoModelFiles { dir: listing.dir.clone() });
        }
        if model_ref.quantization.is_some() {
            return Err(StoreError::TagOnNonGguf { name: name.to_string(), format: Format::Safetensors });
        }
        let model = safetensors::inspect(listing)?;
        return ModelDescriptor::from_safetensors(name.to_string(), &listing.dir, model);
    }
    if has_safetensors && model_ref.quantization.is_none() {
        let gguf = ggufs.iter().map(|g| file_name(&g.primary)).collect();
        return Err(StoreError::MixedFormats { dir: listing.dir.clone(), gguf });
    }
    let variants = read_variants(ggufs)?;
    let found: Vec<(Option<&str>, &Path)> =
        variants.iter().map(|v| (v.header.quantization(), v.files.primary.as_path())).collect();
    let chosen = &variants[select(name, model_ref.quantization.as_deref(), &found)?];
    ModelDescriptor::from_gguf(model_ref.to_string(), &chosen.files, &chosen.header, listing.mmproj())
}

pub(crate) fn read_variants(ggufs: Vec<GgufFiles>) -> Result<Vec<Variant>, StoreError> {
    ggufs
        .into_iter()
        .map(|files| {
            let header = GgufHeader::open(&files.primary).map_err(StoreError::gguf(&files.primary))?;
            Ok(Variant { files, header })
        })
        .collect()
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// What `name:<quantization>` can choose from: the quantization names, and the files whose
/// quantization is unknown.
pub(crate) fn available(found: &[(Option<&str>, &Path)]) -> Vec<String> {
    let mut names: Vec<String> = found
        .iter()
        .map(|(q, path)| match q {
            Some(q) => q.to_string(),
            None => format!("unknown ({})", file_name(path)),
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Picks the GGUF a request names: the only one when no tag is given, else the one whose
/// quantization equals the tag exactly (spec 003: no normalisation, case-sensitive).
fn select(name: &ModelName, requested: Option<&str>, found: &[(Option<&str>, &Path)]) -> Result<usize, StoreError> {
    let Some(requested) = requested else {
        return match found {
            [_] => Ok(0),
            _ => Err(StoreError::AmbiguousQuantization { name: name.to_string(), available: available(found) }),
        };
    };
    let hits: Vec<usize> = (0..found.len()).filter(|&i| found[i].0 == Some(requested)).collect();
    match hits.as_slice() {
        [i] => Ok(*i),
        [] => Err(StoreError::QuantizationNotFound {
            name: name.to_string(),
            requested: requested.to_string(),
            available: available(found),
        }),
        several => Err(StoreError::DuplicateQuantization {
            name: name.to_string(),
            quantization: Some(requested.to_string()),
            files: several.iter().map(|&i| found[i].1.to_path_buf()).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name() -> ModelName {
        ModelName::parse("m").unwrap()
    }

    fn found<'a>(quants: &[Option<&'a str>]) -> Vec<(Option<&'a str>, &'a Path)> {
        quants.iter().map(|q| (*q, Path::new("/m/f.gguf"))).collect()
    }

    #[test]
    fn a_single_gguf_needs_no_tag() {
        assert_eq!(select(&name(), None, &found(&[Some("Q4_1")])).unwrap(), 0);
        assert_eq!(select(&name(), None, &found(&[None])).unwrap(), 0);
    }

    #[test]
    fn tags_match_exactly_and_case_sensitively() {
        let f = found(&[Some("Q4_K_M"), Some("Q8_0")]);
        assert_eq!(select(&name(), Some("Q8_0"), &f).unwrap(), 1);
        for near_miss in ["q8_0", "Q8-0", "Q8", "Q8_0 "] {
            match select(&name(), Some(near_miss), &f) {
                Err(StoreError::QuantizationNotFound { available, .. }) => assert_eq!(available, ["Q4_K_M", "Q8_0"]),
                other => panic!("{near_miss}: {other:?}"),
            }
        }
    }

    #[test]
    fn several_ggufs_without_a_tag_list_the_choices() {
        let f = found(&[Some("Q8_0"), Some("Q4_K_M"), None]);
        let err = select(&name(), None, &f).unwrap_err();
        assert_eq!(
            err.to_string(),
            "model 'm' has several GGUF files; ask for one as 'm:<quantization>', available: Q4_K_M, Q8_0, unknown (f.gguf)"
        );
    }

    #[test]
    fn two_files_with_the_requested_quantization_are_ambiguous() {
        let f = found(&[Some("Q4_0"), Some("Q4_0")]);
        assert!(matches!(select(&name(), Some("Q4_0"), &f), Err(StoreError::DuplicateQuantization { .. })));
    }
}
