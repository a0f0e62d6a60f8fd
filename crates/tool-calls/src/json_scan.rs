//! Finds where a JSON object or array ends in text that is still being generated.
//!
//! [`JsonScanner`] follows the JSON grammar byte by byte and can be resumed as the text grows, so a
//! streamed call is scanned once in total. It answers three ways: the value is complete (and where it
//! ends), it is still a valid prefix, or it can no longer be JSON (and where that became certain). It
//! checks structure, strings and literals exactly and numbers loosely (`serde_json` has the last word
//! on a complete value); its job is to bound the value and to give up early on text that is not JSON.

/// What the text seen so far is, offsets counted from the start of the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    /// A valid prefix of a JSON value: more text is needed.
    Incomplete,
    /// The value ends just before this offset (its closing bracket is the byte before).
    Complete(usize),
    /// The byte at this offset cannot continue any JSON value.
    Invalid(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    Object,
    Array,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A value (after `:`, or after `,` in an array); at the top level only `{` or `[`.
    Value,
    /// A value or `]` (just after `[`).
    ValueOrClose,
    /// A key or `}` (just after `{`).
    KeyOrClose,
    /// A key (after `,` in an object).
    Key,
    Colon,
    /// `,` or the closing bracket of the innermost container.
    CommaOrClose,
    /// Inside a string; `key` says whether a `:` follows it.
    Str {
        key: bool,
        escape: Escape,
    },
    /// Inside a number (checked loosely: digits, sign, `.`, exponent).
    Number,
    /// Inside `true`, `false` or `null`: the bytes still expected.
    Literal(&'static [u8]),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escape {
    None,
    /// Just after a backslash.
    Backslash,
    /// Inside `\uXXXX`: hex digits still expected.
    Unicode(u8),
}

/// Resumable scanner of one JSON object or array; see the module documentation.
#[derive(Debug, Clone)]
pub(crate) struct JsonScanner {
    stack: Vec<Container>,
    expect: Expect,
    /// Bytes of the value already scanned.
    scanned: usize,
    /// Set once the answer is final.
    outcome: Option<Scan>,
}

impl JsonScanner {
    pub(crate) fn new() -> Self {
        Self { stack: Vec::new(), expect: Expect::Value, scanned: 0, outcome: None }
    }

    /// Scans `text`, the value's text so far (it must start with the value's first byte and may
    /// only grow between calls); bytes already scanned are not looked at again. Text after a
    /// complete value is ignored.
    pub(crate) fn scan(&mut self, text: &str) -> Scan {
        if let Some(outcome) = self.outcome {
            return outcome;
        }
        let bytes = text.as_bytes();
        while self.scanned < bytes.len() {
            let at = self.scanned;
            self.scanned += 1;
            match self.step(bytes[at]) {
                Ok(false) => {}
                Ok(true) => return *self.outcome.insert(Scan::Complete(at + 1)),
                Err(()) => return *self.outcome.insert(Scan::Invalid(at)),
            }
        }
        Scan::Incomplete
    }

    /// Consumes one byte; `Ok(true)` when it closed the top-level value.
    fn step(&mut self, byte: u8) -> Result<bool, ()> {
        match self.expect {
            Expect::Str { key, escape } => return self.string_byte(key, escape, byte).map(|()| false),
            Expect::Literal(rest) => {
                if byte != rest[0] {
                    return Err(());
                }
                if rest.len() > 1 {
                    self.expect = Expect::Literal(&rest[1..]);
                    return Ok(false);
                }
                return Ok(self.value_done());
            }
            Expect::Number => {
                if matches!(byte, b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-') {
                    return Ok(false);
                }
                // A number only ends inside a container; the byte after it is the container's.
                self.expect = Expect::CommaOrClose;
            }
            _ => {}
        }
        if matches!(byte, b' ' | b'\t' | b'\n' | b'\r') {
            return Ok(false);
        }
        match (self.expect, byte) {
            (Expect::Value | Expect::ValueOrClose, b'{') => self.open(Container::Object),
            (Expect::Value | Expect::ValueOrClose, b'[') => self.open(Container::Array),
            // Only objects and arrays at the top level: a scalar's end could not be known.
            (Expect::Value | Expect::ValueOrClose, _) if self.stack.is_empty() => return Err(()),
            (Expect::Value | Expect::ValueOrClose, b'"') => {
                self.expect = Expect::Str { key: false, escape: Escape::None }
            }
            (Expect::Value | Expect::ValueOrClose, b'-' | b'0'..=b'9') => self.expect = Expect::Number,
            (Expect::Value | Expect::ValueOrClose, b't') => self.expect = Expect::Literal(b"rue"),
            (Expect::Value | Expect::ValueOrClose, b'f') => self.expect = Expect::Literal(b"alse"),
            (Expect::Value | Expect::ValueOrClose, b'n') => self.expect = Expect::Literal(b"ull"),
            (Expect::ValueOrClose, b']') | (Expect::KeyOrClose, b'}') => return Ok(self.close()),
            (Expect::Key | Expect::KeyOrClose, b'"') => self.expect = Expect::Str { key: true, escape: Escape::None },
            (Expect::Colon, b':') => self.expect = Expect::Value,
            (Expect::CommaOrClose, b',') => {
                self.expect = match self.stack.last() {
                    Some(Container::Object) => Expect::Key,
                    _ => Expect::Value,
                }
            }
            (Expect::CommaOrClose, b'}') if self.stack.last() == Some(&Container::Object) => return Ok(self.close()),
            (Expect::CommaOrClose, b']') if self.stack.last() == Some(&Container::Array) => return Ok(self.close()),
            _ => return Err(()),
        }
        Ok(false)
    }

    fn string_byte(&mut self, key: bool, escape: Escape, byte: u8) -> Result<(), ()> {
        let escape = match (escape, byte) {
            (Escape::None, b'"') => {
                self.expect = if key { Expect::Colon } else { Expect::CommaOrClose };
                return Ok(());
            }
            (Escape::None, b'\\') => Escape::Backslash,
            // JSON strings may not hold raw control characters.
            (Escape::None, 0..=0x1f) => return Err(()),
            (Escape::None, _) => Escape::None,
            (Escape::Backslash, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Escape::None,
            (Escape::Backslash, b'u') => Escape::Unicode(4),
            (Escape::Unicode(left), b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F') => {
                if left > 1 {
                    Escape::Unicode(left - 1)
                } else {
                    Escape::None
                }
            }
            _ => return Err(()),
        };
        self.expect = Expect::Str { key, escape };
        Ok(())
    }

    fn open(&mut self, container: Container) {
        self.stack.push(container);
        self.expect = match container {
            Container::Object => Expect::KeyOrClose,
            Container::Array => Expect::ValueOrClose,
        };
    }

    /// Closes the innermost container; true when that was the top-level value.
    fn close(&mut self) -> bool {
        self.stack.pop();
        self.value_done()
    }

    /// A value just ended; true when it was the top-level one.
    fn value_done(&mut self) -> bool {
        self.expect = Expect::CommaOrClose;
        self.stack.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_whole(text: &str) -> Scan {
        JsonScanner::new().scan(text)
    }

    /// Scans `text` one byte-prefix at a time (at character boundaries), as a stream would.
    fn scan_growing(text: &str) -> Scan {
        let mut scanner = JsonScanner::new();
        let mut last = Scan::Incomplete;
        for end in (1..=text.len()).filter(|&end| text.is_char_boundary(end)) {
            last = scanner.scan(&text[..end]);
        }
        last
    }

    #[test]
    fn complete_values_end_at_their_closing_bracket() {
        for text in [
            r#"{}"#,
            r#"[]"#,
            r#"{"a": 1}"#,
            r#"{"a": [1, -2.5e+3, true, false, null, "x\"}\\", {"b": {}}]}"#,
            "{ \"k\" :\n\t[ ] }",
            r#"{"u": "\u00e9 é 日本"}"#,
            r#"[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {"x": 0}}]"#,
        ] {
            assert_eq!(scan_whole(text), Scan::Complete(text.len()), "{text}");
            assert_eq!(scan_growing(text), Scan::Complete(text.len()), "{text}");
            let followed = format!("{text}\n</tool_call> trailing");
            assert_eq!(scan_whole(&followed), Scan::Complete(text.len()), "{followed}");
            // Every valid value is serde_json-valid too.
            assert!(serde_json::from_str::<serde_json::Value>(text).is_ok(), "{text}");
        }
    }

    #[test]
    fn prefixes_of_valid_values_are_incomplete() {
        let text = r#"{"a": [1, -2.5e+3, true, "x\"}\\\u00e9", {"b": nul"#;
        for end in 1..=text.len() {
            assert_eq!(scan_whole(&text[..end]), Scan::Incomplete, "{}", &text[..end]);
        }
    }

    #[test]
    fn invalid_text_is_reported_where_it_becomes_certain() {
        for (text, at) in [
            ("x", 0),
            ("1", 0),
            (r#""s""#, 0),
            ("{x", 1),
            ("{\"a\" 1", 5),
            ("{\"a\": 1]", 7),
            ("[1}", 2),
            ("{\"a\": tru }", 9),
            ("{\"a\": \"line\nbreak\"}", 11),
            (r#"{"a": "\q"}"#, 8),
            (r#"{"a": "\u12g4"}"#, 11),
            ("{\"a\": 1,}", 8),
            ("{\"a\": é}", 6),
            ("{\"name\": \"f\", \"arguments\": {}\n</tool_call>", 30),
        ] {
            assert_eq!(scan_whole(text), Scan::Invalid(at), "{text:?}");
            assert_eq!(scan_growing(text), Scan::Invalid(at), "{text:?}");
        }
    }

    #[test]
    fn the_answer_is_final_once_given() {
        let mut scanner = JsonScanner::new();
        assert_eq!(scanner.scan("{\"a\""), Scan::Incomplete);
        assert_eq!(scanner.scan("{\"a\": 1}"), Scan::Complete(8));
        assert_eq!(scanner.scan("{\"a\": 1} garbage"), Scan::Complete(8));
    }
}
