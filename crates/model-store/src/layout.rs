//! What a model directory holds, classified by file name alone (no file is opened here).

use std::io;
use std::path::{Path, PathBuf};

/// The visible entries of one directory, sorted by name. Names starting with `.` are skipped:
/// they are temporary files (imports in progress) or tool state, never model files.
#[derive(Clone, Debug, Default)]
pub(crate) struct DirListing {
    pub dir: PathBuf,
    pub files: Vec<String>,
    pub subdirs: Vec<String>,
}

/// The files of one GGUF model: the primary file and, for a split model
/// (`name-00001-of-00003.gguf`), the other parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GgufFiles {
    pub primary: PathBuf,
    pub other_parts: Vec<PathBuf>,
    /// Parts the primary's name promises that are not in the directory.
    pub missing_parts: Vec<String>,
}

impl GgufFiles {
    pub fn all(&self) -> impl Iterator<Item = &PathBuf> {
        std::iter::once(&self.primary).chain(&self.other_parts)
    }
}

pub(crate) fn read_dir(dir: &Path) -> io::Result<DirListing> {
    let mut listing = DirListing { dir: dir.to_path_buf(), ..Default::default() };
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            tracing::debug!(dir = %dir.display(), name = ?entry.file_name(), "skipping a non-UTF-8 file name");
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        // Follows symbolic links: an imported model may be a link to a shared copy.
        let path = entry.path();
        if path.is_dir() {
            listing.subdirs.push(name);
        } else if path.is_file() {
            listing.files.push(name);
        }
    }
    listing.files.sort();
    listing.subdirs.sort();
    Ok(listing)
}

pub(crate) fn has_extension(name: &str, ext: &str) -> bool {
    name.len() > ext.len() && name.is_char_boundary(name.len() - ext.len()) && {
        let (_, tail) = name.split_at(name.len() - ext.len());
        tail.eq_ignore_ascii_case(ext)
    }
}

/// A folder holding a model's files (GGUF, safetensors or a speech model) directly.
pub fn is_model_dir(path: &Path) -> bool {
    path.is_dir() && read_dir(path).is_ok_and(|listing| listing.has_model_files())
}

pub fn is_gguf(file_name: &str) -> bool {
    has_extension(file_name, ".gguf")
}

/// A vision projector: `mmproj-*.gguf`, `*-mmproj.gguf`, or any `.gguf` whose name contains
/// `mmproj` in any case. A projector is never a model's primary file.
pub fn is_mmproj(file_name: &str) -> bool {
    is_gguf(file_name) && file_name.to_ascii_lowercase().contains("mmproj")
}

/// `(prefix, part, count)` of a split GGUF name such as `model-00001-of-00003.gguf`
/// (llama.cpp's `gguf-split` naming).
pub fn split_part(file_name: &str) -> Option<(&str, u32, u32)> {
    let stem = file_name.get(..file_name.len().checked_sub(5)?).filter(|_| is_gguf(file_name))?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, part) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(part) || !digits(count) {
        return None;
    }
    let (part, count) = (part.parse().ok()?, count.parse().ok()?);
    (1..=count).contains(&part).then_some((prefix, part, count))
}

/// The name of part `part` of `count` of a split GGUF (the inverse of [`split_part`]).
pub fn split_part_name(prefix: &str, part: u32, count: u32) -> String {
    format!("{prefix}-{part:05}-of-{count:05}.gguf")
}

/// The parts beside a primary GGUF file: (present, missing).
pub(crate) fn parts_beside(dir: &Path, primary_name: &str, exists: impl Fn(&str) -> bool) -> GgufFiles {
    let mut files = GgufFiles { primary: dir.join(primary_name), other_parts: vec![], missing_parts: vec![] };
    if let Some((prefix, 1, count)) = split_part(primary_name) {
        for part in 2..=count {
            let name = split_part_name(prefix, part, count);
            if exists(&name) {
                files.other_parts.push(dir.join(name));
            } else {
                files.missing_parts.push(name);
            }
        }
    }
    files
}

impl DirListing {
    /// The GGUF models: every `.gguf` that is neither a projector nor a later part of a split.
    pub fn gguf_models(&self) -> Vec<GgufFiles> {
        self.files
            .iter()
            .filter(|f| is_gguf(f) && !is_mmproj(f))
            .filter(|f| split_part(f).is_none_or(|(_, part, _)| part == 1))
            .map(|f| parts_beside(&self.dir, f, |name| self.files.iter().any(|x| x == name)))
            .collect()
    }

    /// The vision projector, if any (the first by name when there are several).
    pub fn mmproj(&self) -> Option<PathBuf> {
        let mut found = self.files.iter().filter(|f| is_mmproj(f));
        let first = found.next()?;
        let others: Vec<&String> = found.collect();
        if !others.is_empty() {
            tracing::warn!(dir = %self.dir.display(), chosen = %first, ?others, "several mmproj files; using the first");
        }
        Some(self.dir.join(first))
    }

    pub fn has_safetensors(&self) -> bool {
        self.files.iter().any(|f| has_extension(f, ".safetensors") || has_extension(f, ".safetensors.index.json"))
    }

    pub fn has_model_files(&self) -> bool {
        !self.gguf_models().is_empty() || self.has_safetensors() || self.has_speech_model()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(files: &[&str]) -> DirListing {
        DirListing { dir: PathBuf::from("/m"), files: files.iter().map(|s| s.to_string()).collect(), subdirs: vec![] }
    }

    #[test]
    fn projectors_are_recognised_by_name_in_any_case() {
        for name in ["mmproj-model-f16.gguf", "gemma-3-4b-mmproj.gguf", "Qwen2-VL-MMPROJ-Q8_0.GGUF", "x-mmproj-y.gguf"]
        {
            assert!(is_mmproj(name), "{name}");
        }
        for name in ["model.gguf", "mmproj.bin", "mmproj-model.safetensors"] {
            assert!(!is_mmproj(name), "{name}");
        }
    }

    #[test]
    fn projector_is_never_a_model() {
        let l = listing(&["mmproj-f16.gguf", "model-Q4_K_M.gguf"]);
        let models: Vec<PathBuf> = l.gguf_models().into_iter().map(|g| g.primary).collect();
        assert_eq!(models, vec![PathBuf::from("/m/model-Q4_K_M.gguf")]);
        assert_eq!(l.mmproj(), Some(PathBuf::from("/m/mmproj-f16.gguf")));
    }

    #[test]
    fn split_parts_are_one_model() {
        assert_eq!(split_part("big-00002-of-00003.gguf"), Some(("big", 2, 3)));
        assert_eq!(split_part("big-00004-of-00003.gguf"), None);
        assert_eq!(split_part("big-2-of-3.gguf"), None);
        assert_eq!(split_part("big.gguf"), None);

        let l = listing(&["big-00001-of-00003.gguf", "big-00003-of-00003.gguf"]);
        let models = l.gguf_models();
        assert_eq!(models.len(), 1);
        assert_eq!(models[0].primary, PathBuf::from("/m/big-00001-of-00003.gguf"));
        assert_eq!(models[0].other_parts, vec![PathBuf::from("/m/big-00003-of-00003.gguf")]);
        assert_eq!(models[0].missing_parts, vec!["big-00002-of-00003.gguf".to_string()]);
    }

    #[test]
    fn extensions_match_in_any_case() {
        assert!(is_gguf("a.GGUF"));
        assert!(!is_gguf(".gguf"));
        assert!(!is_gguf("a.gguf.part"));
        assert!(listing(&["model.safetensors"]).has_safetensors());
        assert!(listing(&["model.safetensors.index.json"]).has_safetensors());
        assert!(!listing(&["config.json"]).has_model_files());
    }
}
