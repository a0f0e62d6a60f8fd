//! Streaming text helpers every generating engine needs: turning token bytes into whole UTF-8
//! characters, and holding back text that may still become a stop sequence.

/// Accumulates token bytes and releases the longest valid UTF-8 prefix. A character split
/// across tokens (common for emoji and CJK in byte-level BPE) is released once complete.
#[derive(Default, Debug)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds `bytes` and appends every complete character to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut String) {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            // An invalid sequence (not just an unfinished one) is replaced, never kept forever.
            Err(e) if e.error_len().is_some() => {
                out.push_str(&String::from_utf8_lossy(&self.pending));
                self.pending.clear();
                return;
            }
            Err(e) => e.valid_up_to(),
        };
        out.push_str(std::str::from_utf8(&self.pending[..valid]).expect("checked above"));
        self.pending.drain(..valid);
    }

    /// Releases whatever is left at the end of generation (lossily, if incomplete).
    pub fn finish(&mut self, out: &mut String) {
        if !self.pending.is_empty() {
            out.push_str(&String::from_utf8_lossy(&self.pending));
            self.pending.clear();
        }
    }
}

/// Watches generated text for stop sequences. Text that could still be the start of a stop
/// sequence is held back; text after a match is never released.
#[derive(Debug)]
pub struct StopMatcher {
    /// The stop sequences with their index in the request's list (empty ones left out).
    stops: Vec<(usize, String)>,
    text: String,
    released: usize,
    /// The index of the stop sequence that matched.
    matched: Option<usize>,
}

impl StopMatcher {
    pub fn new(stops: impl IntoIterator<Item = impl Into<String>>) -> Self {
        let stops = stops.into_iter().map(Into::into).enumerate().filter(|(_, s)| !s.is_empty()).collect();
        Self { stops, text: String::new(), released: 0, matched: None }
    }

    /// Appends `piece` and returns the text that is now safe to show. After a match, returns the
    /// text before it and `stopped()` turns true.
    pub fn push(&mut self, piece: &str) -> &str {
        if self.stopped() {
            return "";
        }
        let search_from = self.released.saturating_sub(self.max_stop_len());
        self.text.push_str(piece);
        let start = self.released;
        let end = match self.first_match(search_from) {
            Some((at, index)) => {
                self.matched = Some(index);
                at.max(start)
            }
            None => self.text.len() - self.held_back(),
        };
        self.released = end.max(start);
        &self.text[start..self.released]
    }

    /// Releases the held-back text when generation ends without a match.
    pub fn finish(&mut self) -> &str {
        let start = self.released;
        if !self.stopped() {
            self.released = self.text.len();
        }
        &self.text[start..self.released]
    }

    pub fn stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// Which stop sequence ended the text: its index in the list given to `new` (the ABI's
    /// `stop_index` less one). Of two that match, the one that starts first, then the earlier
    /// in the list.
    pub fn matched(&self) -> Option<usize> {
        self.matched
    }

    /// All text released so far.
    pub fn released(&self) -> &str {
        &self.text[..self.released]
    }

    fn max_stop_len(&self) -> usize {
        self.stops.iter().map(|(_, s)| s.len()).max().unwrap_or(0)
    }

    /// The earliest match from `from`: (its byte offset, the stop's index).
    fn first_match(&self, from: usize) -> Option<(usize, usize)> {
        let from = (0..=from).rev().find(|&i| self.text.is_char_boundary(i)).unwrap_or(0);
        self.stops.iter().filter_map(|(index, s)| self.text[from..].find(s.as_str()).map(|i| (i + from, *index))).min()
    }

    /// Length of the longest suffix of the text that is a proper prefix of a stop sequence.
    fn held_back(&self) -> usize {
        self.stops
            .iter()
            .filter_map(|(_, s)| (1..s.len()).rev().find(|&n| s.is_char_boundary(n) && self.text.ends_with(&s[..n])))
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_characters_split_across_tokens_are_released_whole() {
        let mut s = Utf8Stream::default();
        let mut out = String::new();
        let smile = "😀".as_bytes();
        s.push(&smile[..1], &mut out);
        s.push(&smile[1..3], &mut out);
        assert_eq!(out, "");
        s.push(&smile[3..], &mut out);
        assert_eq!(out, "😀");
        s.push(&[0xff, b'a'], &mut out);
        assert_eq!(out, "😀\u{fffd}a");
        s.push(&[0xe2, 0x82], &mut out);
        s.finish(&mut out);
        assert_eq!(out, "😀\u{fffd}a\u{fffd}");
    }

    #[test]
    fn a_stop_sequence_spanning_pieces_is_never_released() {
        let mut m = StopMatcher::new(["</answer>"]);
        let mut shown = String::new();
        for piece in ["The answer is 4", "</", "ans", "wer> and more"] {
            shown.push_str(m.push(piece));
        }
        assert!(m.stopped());
        assert_eq!(m.matched(), Some(0));
        assert_eq!(shown, "The answer is 4");
        assert_eq!(m.push("ignored"), "");
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn held_back_text_is_released_when_it_cannot_match_or_at_the_end() {
        let mut m = StopMatcher::new(["STOP"]);
        assert_eq!(m.push("go ST"), "go ");
        assert_eq!(m.push("AR"), "STAR");
        assert_eq!(m.push(" S"), " ");
        assert_eq!(m.finish(), "S");
        assert!(!m.stopped() && m.matched().is_none());
        assert_eq!(m.released(), "go STAR S");
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_unicode_is_respected() {
        let mut m = StopMatcher::new(["ß!", "b"]);
        assert_eq!(m.push("aaß"), "aa");
        assert_eq!(m.push("!b"), "");
        assert_eq!(m.released(), "aa");
        // Reported by its place in the request's list, empty stops counted.
        let mut m = StopMatcher::new(["", "zz", "b", "ab"]);
        assert_eq!(m.push("xab"), "x");
        assert_eq!(m.matched(), Some(3), "`ab` starts before `b`");
        let mut m = StopMatcher::new(["", "zz", "b"]);
        m.push("abc");
        assert_eq!(m.matched(), Some(2));
        let mut none = StopMatcher::new(Vec::<String>::new());
        assert_eq!(none.push("anything"), "anything");
    }
}
