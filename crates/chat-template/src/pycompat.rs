//! Where minijinja and jinja2 disagree on Python semantics, the jinja2 behaviour that chat
//! templates rely on.

use crate::pyrepr::py_str;
use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind, Output, State};

/// `{{ value }}` prints Python's `str(value)`: `None`, `True`, `{'a': 1}`.
pub(crate) fn format_output(out: &mut Output, _state: &State, value: &Value) -> Result<(), Error> {
    let mut text = String::new();
    py_str(value, &mut text);
    out.write_str(&text).map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
}

/// The `string` filter: Python's `str()`.
pub(crate) fn string_filter(value: &Value) -> String {
    let mut text = String::new();
    py_str(value, &mut text);
    text
}

/// The `length` (and `count`) filter: jinja2's `Undefined` has length 0.
pub(crate) fn length_filter(value: &Value) -> Result<usize, Error> {
    if value.is_undefined() {
        return Ok(0);
    }
    value
        .len()
        .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, format!("object of type {} has no len()", value.kind())))
}

/// jinja2's `sequence` test: anything with a length and indexing, so strings and dicts too.
pub(crate) fn is_sequence(value: &Value) -> bool {
    matches!(value.kind(), ValueKind::Undefined | ValueKind::String | ValueKind::Seq | ValueKind::Map)
}
