//! Model names as requests give them (`smollm2`, `org/model`, `smollm2:Q4_1`), parsed into a form
//! that can only denote a directory inside the store root: whatever a request sends, the path
//! built from a [`ModelName`] stays under the root.

use std::fmt;
use std::path::PathBuf;

pub const MAX_NAME_LEN: usize = 256;
/// `model` or `organisation/model`, as on Hugging Face.
const MAX_SEGMENTS: usize = 2;

/// A validated model name: one or two `/`-separated segments of ASCII letters, digits, `-`, `_`,
/// `.` and `+`, none starting with `.` (hidden names are the store's temporary files).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelName(String);

/// A model name with an optional quantization tag (`name:TAG`). The tag is kept exactly as given:
/// spec 003 matches it case- and punctuation-sensitively.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ModelRef {
    pub name: ModelName,
    pub quantization: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid model name {name:?}: {problem}")]
pub struct NameError {
    pub name: String,
    pub problem: NameProblem,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NameProblem {
    Empty,
    TooLong { len: usize },
    Nul,
    Backslash,
    Absolute,
    ParentDir,
    EmptySegment,
    HiddenSegment { segment: String },
    TooManySegments { count: usize },
    InvalidChar { ch: char },
    EmptyQuantization,
    InvalidQuantizationChar { ch: char },
}

impl fmt::Display for NameProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("it is empty"),
            Self::TooLong { len } => write!(f, "it is {len} bytes long (at most {MAX_NAME_LEN})"),
            Self::Nul => f.write_str("it contains a NUL byte"),
            Self::Backslash => f.write_str("it contains a backslash (use '/' between organisation and model)"),
            Self::Absolute => f.write_str("it is an absolute path"),
            Self::ParentDir => f.write_str("it contains '..'"),
            Self::EmptySegment => f.write_str("it has an empty segment (leading, trailing or double '/')"),
            Self::HiddenSegment { segment } => write!(f, "segment {segment:?} starts with '.'"),
            Self::TooManySegments { count } => {
                write!(f, "it has {count} '/'-separated segments (at most {MAX_SEGMENTS}: organisation/model)")
            }
            Self::InvalidChar { ch } => {
                write!(f, "it contains {ch:?} (allowed: ASCII letters, digits, '-', '_', '.', '+', and '/')")
            }
            Self::EmptyQuantization => f.write_str("the quantization tag after ':' is empty"),
            Self::InvalidQuantizationChar { ch } => {
                write!(f, "the quantization tag contains {ch:?} (allowed: ASCII letters, digits, '-', '_', '.')")
            }
        }
    }
}

impl ModelName {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        let err = |problem| NameError { name: s.to_string(), problem };
        refuse_escapes(s).map_err(err)?;
        if s.is_empty() {
            return Err(err(NameProblem::Empty));
        }
        if let Some(ch) = s.chars().find(|&c| !(c.is_ascii_alphanumeric() || "-_.+/".contains(c))) {
            return Err(err(NameProblem::InvalidChar { ch }));
        }
        let segments: Vec<&str> = s.split('/').collect();
        if segments.iter().any(|seg| seg.is_empty()) {
            return Err(err(NameProblem::EmptySegment));
        }
        if let Some(seg) = segments.iter().find(|seg| seg.starts_with('.')) {
            return Err(err(NameProblem::HiddenSegment { segment: seg.to_string() }));
        }
        if segments.len() > MAX_SEGMENTS {
            return Err(err(NameProblem::TooManySegments { count: segments.len() }));
        }
        Ok(Self(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The model's directory relative to the store root.
    pub fn relative_path(&self) -> PathBuf {
        self.0.split('/').collect()
    }
}

/// The shapes that could leave the store root, checked on the whole request string first so
/// that their refusal says exactly what was wrong.
fn refuse_escapes(s: &str) -> Result<(), NameProblem> {
    if s.len() > MAX_NAME_LEN {
        return Err(NameProblem::TooLong { len: s.len() });
    }
    if s.contains('\0') {
        return Err(NameProblem::Nul);
    }
    if s.contains('\\') {
        return Err(NameProblem::Backslash);
    }
    if s.starts_with('/') {
        return Err(NameProblem::Absolute);
    }
    if s.contains("..") {
        return Err(NameProblem::ParentDir);
    }
    Ok(())
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl ModelRef {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        refuse_escapes(s).map_err(|problem| NameError { name: s.to_string(), problem })?;
        let (name, tag) = match s.split_once(':') {
            Some((name, tag)) => (name, Some(tag)),
            None => (s, None),
        };
        let name = ModelName::parse(name).map_err(|e| NameError { name: s.to_string(), problem: e.problem })?;
        let quantization = match tag {
            None => None,
            Some("") => return Err(NameError { name: s.to_string(), problem: NameProblem::EmptyQuantization }),
            Some(tag) => {
                if let Some(ch) = tag.chars().find(|&c| !(c.is_ascii_alphanumeric() || "-_.".contains(c))) {
                    let problem = NameProblem::InvalidQuantizationChar { ch };
                    return Err(NameError { name: s.to_string(), problem });
                }
                Some(tag.to_string())
            }
        };
        Ok(Self { name, quantization })
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.quantization {
            Some(q) => write!(f, "{}:{q}", self.name),
            None => write!(f, "{}", self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(s: &str) -> NameProblem {
        ModelRef::parse(s).unwrap_err().problem
    }

    #[test]
    fn plain_and_organisation_names_map_to_relative_dirs() {
        let r = ModelRef::parse("HuggingFaceTB/SmolLM2-135M-Instruct").unwrap();
        assert_eq!(r.name.relative_path(), PathBuf::from("HuggingFaceTB").join("SmolLM2-135M-Instruct"));
        assert_eq!(r.quantization, None);
        assert_eq!(ModelRef::parse("qwen2.5").unwrap().name.relative_path(), PathBuf::from("qwen2.5"));
    }

    #[test]
    fn quantization_tag_is_kept_verbatim() {
        let r = ModelRef::parse("smollm2:Q4_1").unwrap();
        assert_eq!((r.name.as_str(), r.quantization.as_deref()), ("smollm2", Some("Q4_1")));
        assert_eq!(ModelRef::parse("m:q4-k-m").unwrap().quantization.as_deref(), Some("q4-k-m"));
        assert_eq!(r.to_string(), "smollm2:Q4_1");
    }

    #[test]
    fn escapes_are_refused_with_their_reason() {
        assert_eq!(problem("../etc"), NameProblem::ParentDir);
        assert_eq!(problem("a/../../b"), NameProblem::ParentDir);
        assert_eq!(problem("/etc/passwd"), NameProblem::Absolute);
        assert_eq!(problem("a\0b"), NameProblem::Nul);
        assert_eq!(problem("a\\b"), NameProblem::Backslash);
        assert_eq!(problem("C:\\models\\x"), NameProblem::Backslash);
        assert_eq!(problem("..:Q4_0"), NameProblem::ParentDir);
    }

    #[test]
    fn malformed_names_are_refused() {
        assert_eq!(problem(""), NameProblem::Empty);
        assert_eq!(problem(":Q4_0"), NameProblem::Empty);
        assert_eq!(problem("a//b"), NameProblem::EmptySegment);
        assert_eq!(problem("a/"), NameProblem::EmptySegment);
        assert_eq!(problem(".hidden"), NameProblem::HiddenSegment { segment: ".hidden".into() });
        assert_eq!(problem("a/b/c"), NameProblem::TooManySegments { count: 3 });
        assert_eq!(problem("a b"), NameProblem::InvalidChar { ch: ' ' });
        assert_eq!(problem("modèle"), NameProblem::InvalidChar { ch: 'è' });
        assert_eq!(problem(&"x".repeat(MAX_NAME_LEN + 1)), NameProblem::TooLong { len: MAX_NAME_LEN + 1 });
        assert_eq!(problem("m:"), NameProblem::EmptyQuantization);
        assert_eq!(problem("m:Q4/0"), NameProblem::InvalidQuantizationChar { ch: '/' });
        assert_eq!(problem("m:Q4:0"), NameProblem::InvalidQuantizationChar { ch: ':' });
    }

    #[test]
    fn error_message_names_the_input_and_the_reason() {
        let msg = ModelRef::parse("../x").unwrap_err().to_string();
        assert_eq!(msg, "invalid model name \"../x\": it contains '..'");
    }
}
