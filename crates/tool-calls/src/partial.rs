//! Markers cut between pieces: the parsers hold back the end of the text that could still grow
//! into a marker (`<tool_call>`, `</think>`, `<|channel|>`, ...) until the next piece decides it.

/// The length of the longest end of `text` that is a proper prefix of `marker`.
pub(crate) fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_suffixes() {
        assert_eq!(partial_suffix("hello <tool", "<tool_call>"), 5);
        assert_eq!(partial_suffix("hello <", "<tool_call>"), 1);
        assert_eq!(partial_suffix("hello", "<tool_call>"), 0);
        assert_eq!(partial_suffix("<tool_call", "<tool_call>"), 10);
        assert_eq!(partial_suffix("<tool_call>", "<tool_call>"), 0);
        assert_eq!(partial_suffix("", "<tool_call>"), 0);
        assert_eq!(partial_suffix("é[TOOL", "[TOOL_CALLS]"), 5);
        assert_eq!(partial_suffix("x</th", "</think>"), 4);
    }
}
