//! The `tojson` filter as transformers defines it: Python's
//! `json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)`.
//!
//! Not minijinja's built-in, which escapes HTML characters and prints `{"a":1}` where Python
//! prints `{"a": 1}`: templates embed this text in prompts, so every byte matters.

use crate::pyobjects::{is_generator, is_none};
use crate::pyrepr::float_repr;
use minijinja::value::{from_args, Kwargs, Rest, Value, ValueKind};
use minijinja::{Error, ErrorKind};
use std::fmt::Write;

/// The arguments of transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, positional or keyword.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DumpOptions {
    pub ensure_ascii: bool,
    /// The text of one indentation level; `None` prints everything on one line.
    pub indent: Option<String>,
    pub item_separator: String,
    pub key_separator: String,
    pub sort_keys: bool,
}

impl Default for DumpOptions {
    fn default() -> Self {
        DumpOptions {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        }
    }
}

/// The filter registered as `tojson`.
pub(crate) fn tojson_filter(value: &Value, args: Rest<Value>) -> Result<String, Error> {
    let (positional, kwargs): (&[Value], Kwargs) = from_args(&args)?;
    let named = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if positional.len() > named.len() {
        return Err(Error::new(ErrorKind::TooManyArguments, "tojson takes at most 4 arguments"));
    }
    let arg = |i: usize| -> Result<Option<Value>, Error> {
        let by_name: Option<Value> = kwargs.get(named[i])?;
        Ok(positional.get(i).cloned().or(by_name))
    };
    let mut options = DumpOptions { ensure_ascii: arg(0)?.is_some_and(|v| v.is_true()), ..Default::default() };
    if let Some(indent) = arg(1)?.filter(|v| !v.is_none()) {
        options.indent = Some(indent_text(&indent)?);
        // Python drops the space after commas when indenting, or lines would end in a space.
        options.item_separator = ",".into();
    }
    if let Some(separators) = arg(2)?.filter(|v| !v.is_none()) {
        let parts: Vec<Value> = separators.try_iter()?.collect();
        match parts.as_slice() {
            [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                options.item_separator = item.to_string();
                options.key_separator = key.to_string();
            }
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson separators must be two strings")),
        }
    }
    options.sort_keys = arg(3)?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    dumps(value, &options)
}

fn indent_text(indent: &Value) -> Result<String, Error> {
    if let Some(s) = indent.as_str() {
        return Ok(s.to_owned());
    }
    match indent.as_i64() {
        // Python: `' ' * indent`, so a negative indent is no indentation (but still newlines).
        Some(n) => Ok(" ".repeat(n.max(0) as usize)),
        None => Err(Error::new(ErrorKind::InvalidOperation, "tojson indent must be an int or a string")),
    }
}

/// `json.dumps(value, ...)`.
pub(crate) fn dumps(value: &Value, options: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    write_value(value, options, 0, &mut out)?;
    Ok(out)
}

fn write_value(value: &Value, options: &DumpOptions, depth: usize, out: &mut String) -> Result<(), Error> {
    if is_none(value) {
        out.push_str("null");
        return Ok(());
    }
    if is_generator(value) {
        return Err(not_serializable("generator"));
    }
    match value.kind() {
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(value, out),
        ValueKind::String => write_string(value.as_str().unwrap_or_default(), options.ensure_ascii, out),
        // `Iterable` is also minijinja's lazy `list + list`, which is a list in Python.
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(out, options, depth, ('[', ']'), &items, |item, out| {
                write_value(item, options, depth + 1, out)
            })?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key_text(&key)?, item));
            }
            if options.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, options, depth, ('{', '}'), &entries, |(key, item), out| {
                write_string(key, options.ensure_ascii, out);
                out.push_str(&options.key_separator);
                write_value(item, options, depth + 1, out)
            })?;
        }
        ValueKind::Undefined => return Err(not_serializable("Undefined")),
        ValueKind::Bytes => return Err(not_serializable("bytes")),
        _ => return Err(not_serializable("object")),
    }
    Ok(())
}

/// Python's own message, which template authors may have seen before.
fn not_serializable(type_name: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("Object of type {type_name} is not JSON serializable"))
}

fn write_container<T>(
    out: &mut String,
    options: &DumpOptions,
    depth: usize,
    (open, close): (char, char),
    items: &[T],
    mut write_item: impl FnMut(&T, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &options.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&options.item_separator);
        }
        newline(out, depth + 1);
        write_item(item, out)?;
    }
    newline(out, depth);
    out.push(close);
    Ok(())
}

/// Python converts scalar keys to strings (`{1: x}` dumps as `{"1": x}`).
fn key_text(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number => {
            let mut s = String::new();
            write_number(key, &mut s);
            Ok(s)
        }
        kind => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}

fn write_number(value: &Value, out: &mut String) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    // json.dumps writes the non-finite floats as JavaScript literals.
    match float_repr(f).as_str() {
        "nan" => out.push_str("NaN"),
        "inf" => out.push_str("Infinity"),
        "-inf" => out.push_str("-Infinity"),
        repr => out.push_str(repr),
    }
}

fn write_string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dump(v: serde_json::Value, options: DumpOptions) -> String {
        dumps(&Value::from_serialize(v), &options).unwrap()
    }

    #[test]
    fn default_spacing_matches_python() {
        let v = json!({"b": [1, 2.5, null, true], "a": {"x": "é<>&'"}});
        assert_eq!(dump(v, DumpOptions::default()), r#"{"b": [1, 2.5, null, true], "a": {"x": "é<>&'"}}"#);
    }

    #[test]
    fn indent_uses_bare_commas() {
        let options = DumpOptions { indent: Some("  ".into()), item_separator: ",".into(), ..Default::default() };
        assert_eq!(
            dump(json!({"a": [1, {}], "b": []}), options),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}"
        );
    }

    #[test]
    fn escapes_like_python() {
        // DEL and other non-control characters stay raw, as in Python.
        assert_eq!(dump(json!("a\"\\\n\u{1}\u{7f}"), DumpOptions::default()), "\"a\\\"\\\\\\n\\u0001\u{7f}\"");
        let ascii = DumpOptions { ensure_ascii: true, ..Default::default() };
        assert_eq!(dump(json!("é😀"), ascii), r#""\u00e9\ud83d\ude00""#);
    }

    #[test]
    fn sort_keys_and_separators() {
        let options = DumpOptions {
            sort_keys: true,
            item_separator: ",".into(),
            key_separator: ":".into(),
            ..Default::default()
        };
        assert_eq!(dump(json!({"b": 1, "a": 2}), options), r#"{"a":2,"b":1}"#);
    }

    #[test]
    fn undefined_is_not_serializable() {
        let err = dumps(&Value::UNDEFINED, &DumpOptions::default()).unwrap_err();
        assert!(err.to_string().contains("Object of type Undefined is not JSON serializable"));
    }
}
