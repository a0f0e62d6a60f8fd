//! Where minijinja and jinja2 disagree on Python semantics, the jinja2 behaviour that chat
//! templates rely on.
//!
//! Mostly this is Python's `str()`: jinja2 prints a value, and string filters read their input,
//! through `str()`, so a message content that is a list of parts prints as
//! `[{'type': 'text', ...}]` where minijinja would write JSON-like text.

use crate::pyrepr::py_str;
use minijinja::value::{Kwargs, StringInput, Value, ValueKind};
use minijinja::{filters, Error, ErrorKind, Output, State};
use std::borrow::Cow;

/// `{{ value }}` prints Python's `str(value)`: `None`, `True`, `{'a': 1}`.
pub(crate) fn format_output(out: &mut Output, _state: &State, value: &Value) -> Result<(), Error> {
    out.write_str(&py_string(value)).map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
}

fn py_string(value: &Value) -> String {
    let mut text = String::new();
    py_str(value, &mut text);
    text
}

/// The input of a string filter: strings as they are (safe ones stay safe), anything else
/// through Python's `str()`.
fn str_input(value: &Value) -> Cow<'_, Value> {
    match value.kind() {
        ValueKind::String => Cow::Borrowed(value),
        _ => Cow::Owned(Value::from(py_string(value))),
    }
}

/// The `string` filter: Python's `str()`.
pub(crate) fn string(value: &Value) -> String {
    py_string(value)
}

pub(crate) fn trim(state: &State, value: &Value, chars: Option<Cow<'_, str>>) -> Result<Value, Error> {
    Ok(filters::trim(StringInput::new(state, &str_input(value))?, chars))
}

pub(crate) fn upper(state: &State, value: &Value) -> Result<Value, Error> {
    Ok(filters::upper(StringInput::new(state, &str_input(value))?))
}

pub(crate) fn lower(state: &State, value: &Value) -> Result<Value, Error> {
    Ok(filters::lower(StringInput::new(state, &str_input(value))?))
}

pub(crate) fn capitalize(state: &State, value: &Value) -> Result<Value, Error> {
    Ok(filters::capitalize(StringInput::new(state, &str_input(value))?))
}

pub(crate) fn title(value: &Value) -> String {
    filters::title(Cow::Owned(py_string(value)))
}

pub(crate) fn replace(state: &State, value: &Value, from: StringInput, to: StringInput) -> Result<Value, Error> {
    filters::replace(state, StringInput::new(state, &str_input(value))?, from, to)
}

/// jinja2's `join(value, d='', attribute=None)`: `d.join(map(str, value))`.
pub(crate) fn join(value: &Value, separator: Option<Cow<'_, str>>, kwargs: Kwargs) -> Result<String, Error> {
    let attribute: Option<Value> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    for (i, item) in value.try_iter()?.enumerate() {
        if i > 0 {
            out.push_str(separator.as_deref().unwrap_or(""));
        }
        let item = match &attribute {
            Some(attr) => match attr.as_str() {
                Some(path) => lookup_path(item, path)?,
                None => item.get_item(attr)?,
            },
            None => item,
        };
        py_str(&item, &mut out);
    }
    Ok(out)
}

/// jinja2's attribute getter: `a.b.0` walks attributes, and integer parts index.
fn lookup_path(mut item: Value, path: &str) -> Result<Value, Error> {
    for part in path.split('.') {
        item = match part.parse::<usize>() {
            Ok(index) => item.get_item(&Value::from(index))?,
            Err(_) => item.get_attr(part)?,
        };
    }
    Ok(item)
}

/// The `length` (and `count`) filter: jinja2's `Undefined` has length 0.
pub(crate) fn length(value: &Value) -> Result<usize, Error> {
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
