//! Names and relative paths from requests and manifests: nothing may escape its directory.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathProblem {
    Empty,
    Absolute,
    ParentComponent,
    BadCharacter(char),
    TooLong,
}

impl fmt::Display for PathProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathProblem::Empty => write!(f, "is empty or has an empty component"),
            PathProblem::Absolute => write!(f, "is absolute"),
            PathProblem::ParentComponent => write!(f, "has a '.' or '..' component"),
            PathProblem::BadCharacter(c) => write!(f, "contains the character {c:?}"),
            PathProblem::TooLong => write!(f, "is longer than 1024 bytes"),
        }
    }
}

/// A `/`-separated path relative to a model directory: no absolute path, drive, `.`/`..`,
/// backslash, NUL or control character, no empty component.
pub fn check_relative_path(path: &str) -> Result<(), PathProblem> {
    if path.is_empty() {
        return Err(PathProblem::Empty);
    }
    if path.len() > 1024 {
        return Err(PathProblem::TooLong);
    }
    if path.starts_with('/') || path.as_bytes().get(1) == Some(&b':') {
        return Err(PathProblem::Absolute);
    }
    if let Some(c) = path.chars().find(|c| *c == '\\' || c.is_control()) {
        return Err(PathProblem::BadCharacter(c));
    }
    for part in path.split('/') {
        match part {
            "" => return Err(PathProblem::Empty),
            "." | ".." => return Err(PathProblem::ParentComponent),
            _ => {}
        }
    }
    Ok(())
}

/// A served model name: a relative path of at most 256 bytes whose characters are
/// ASCII letters, digits and `-_.:/` (so it is also a safe directory name under a store).
pub fn check_model_name(name: &str) -> Result<(), PathProblem> {
    if name.len() > 256 {
        return Err(PathProblem::TooLong);
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || "-_.:/".contains(*c))) {
        return Err(PathProblem::BadCharacter(c));
    }
    check_relative_path(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_refused() {
        for bad in ["", "/etc/passwd", "../x", "a/../../b", "a//b", "./a", "C:/x", "a\\..\\b", "a\0b", "a/"] {
            assert!(check_relative_path(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["model.gguf", "sub/dir/model-00001-of-00002.safetensors", "a..b"] {
            assert_eq!(check_relative_path(good), Ok(()), "{good:?}");
        }
    }

    #[test]
    fn model_names_are_plain() {
        assert!(check_model_name("HuggingFaceTB/SmolLM2-135M-Instruct:Q4_1").is_ok());
        assert_eq!(check_model_name("a b"), Err(PathProblem::BadCharacter(' ')));
        assert_eq!(check_model_name("../etc"), Err(PathProblem::ParentComponent));
        assert_eq!(check_model_name("/abs"), Err(PathProblem::Absolute));
    }
}
