//! The functions transformers adds to every chat template: `raise_exception` and `strftime_now`.

use crate::pyrepr::py_str;
use chrono::format::{Item, StrftimeItems};
use chrono::NaiveDateTime;
use minijinja::value::Value;
use minijinja::{Error, ErrorKind, State};

/// The context variable through which a render pins the clock that `strftime_now` reads.
pub(crate) const NOW_VAR: &str = "__llmr_strftime_now";
pub(crate) const NOW_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.f";

/// Attached as the source of the error `raise_exception` returns, so that the caller can tell a
/// template's deliberate rejection from a failure and recover its message.
#[derive(Debug)]
pub(crate) struct Raised(pub String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

pub(crate) fn raise_exception(message: &Value) -> Result<Value, Error> {
    let mut text = String::new();
    py_str(message, &mut text);
    Err(Error::new(ErrorKind::InvalidOperation, text.clone()).with_source(Raised(text)))
}

/// `datetime.now().strftime(format)`, local time unless the render pinned the clock.
pub(crate) fn strftime_now(state: &State, format: &str) -> Result<String, Error> {
    let now = match state.lookup(NOW_VAR).as_ref().and_then(Value::as_str) {
        Some(pinned) => NaiveDateTime::parse_from_str(pinned, NOW_FORMAT)
            .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("bad pinned time: {e}")))?,
        None => chrono::Local::now().naive_local(),
    };
    strftime(now, format)
}

pub(crate) fn strftime(now: NaiveDateTime, format: &str) -> Result<String, Error> {
    // chrono's formatter panics on a bad specifier when displayed, so check first.
    if StrftimeItems::new(format).any(|item| matches!(item, Item::Error)) {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("invalid strftime format {format:?}")));
    }
    Ok(now.format(format).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_python_directives() {
        let t = NaiveDateTime::parse_from_str("2026-01-05T14:30:00", NOW_FORMAT).unwrap();
        assert_eq!(strftime(t, "%d %b %Y").unwrap(), "05 Jan 2026");
        assert_eq!(strftime(t, "%Y-%m-%d %H:%M, %A %B").unwrap(), "2026-01-05 14:30, Monday January");
        assert!(strftime(t, "%Q").is_err());
    }
}
