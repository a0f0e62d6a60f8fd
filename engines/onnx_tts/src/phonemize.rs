//! From espeak-ng's clauses to Piper's sentences of phonemes.
//!
//! Piper asks espeak-ng for one clause at a time, keeps the clause's punctuation as a phoneme
//! (the voices were trained with it: it shapes the intonation and the pause), and starts a new
//! sentence after `.`, `?`, `!`, a paragraph break or the end of the text. Each sentence is
//! synthesized on its own, which is what lets audio stream sentence by sentence.

use unicode_normalization::UnicodeNormalization;

/// One clause as espeak-ng hands it over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Clause {
    /// IPA, words separated by spaces.
    pub phonemes: String,
    /// The punctuation that ended it, as Piper writes it (`.`, `?`, `!`, `,`, `:`, `;`), if any.
    pub terminator: Option<char>,
    pub end_of_sentence: bool,
}

// espeak-ng's clause codes (translate.h), as `espeak_TextToPhonemesWithTerminator` reports them.
const CLAUSE_MASK: i32 = 0x000F_FFFF;
const INTONATION_FULL_STOP: i32 = 0x0000_0000;
const INTONATION_COMMA: i32 = 0x0000_1000;
const INTONATION_QUESTION: i32 = 0x0000_2000;
const INTONATION_EXCLAMATION: i32 = 0x0000_3000;
const TYPE_CLAUSE: i32 = 0x0004_0000;
const TYPE_SENTENCE: i32 = 0x0008_0000;

/// Reads a terminator code the way Piper does: only the six plain clause kinds keep their
/// punctuation; the sentence bit decides where a sentence ends.
pub fn clause_end_from_code(code: i32) -> (Option<char>, bool) {
    let punct = match code & CLAUSE_MASK {
        c if c == 40 | INTONATION_FULL_STOP | TYPE_SENTENCE => Some('.'),
        c if c == 40 | INTONATION_QUESTION | TYPE_SENTENCE => Some('?'),
        c if c == 45 | INTONATION_EXCLAMATION | TYPE_SENTENCE => Some('!'),
        c if c == 20 | INTONATION_COMMA | TYPE_CLAUSE => Some(','),
        c if c == 30 | INTONATION_FULL_STOP | TYPE_CLAUSE => Some(':'),
        c if c == 30 | INTONATION_COMMA | TYPE_CLAUSE => Some(';'),
        _ => None,
    };
    (punct, code & TYPE_SENTENCE != 0)
}

/// Characters that may follow a clause's punctuation without being part of the next clause.
fn is_closer(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | ')' | ']' | '}' | '”' | '’' | '»' | '›' | '」' | '』')
}

fn is_clause_punct(c: char) -> bool {
    matches!(c, '.' | '?' | '!' | ',' | ':' | ';' | '…' | '–' | '—' | '。' | '？' | '！' | '，' | '：' | '；' | '、')
}

/// The end of a clause worked out from the text espeak-ng consumed for it, for libraries
/// without `espeak_TextToPhonemesWithTerminator` (every espeak-ng release up to 1.52, Debian's
/// 1.51 included). `consumed` runs from where the previous call left the text pointer to where
/// this one left it; espeak-ng reads one character past the clause (the next clause's first,
/// which it keeps internally), so that character is not this clause's. `at_end` is true when
/// the text ran out with this clause.
///
/// Checked against Piper's own bridge (espeak-ng with the terminator patch) on the cases in the
/// tests below: the punctuation kept and the sentence breaks agree.
pub fn clause_end_from_text(consumed: &str, at_end: bool) -> (Option<char>, bool) {
    let mut text = consumed.trim_end_matches(is_closer);
    if !at_end {
        if let Some(last) = text.chars().last().filter(|&c| !is_clause_punct(c)) {
            text = text[..text.len() - last.len_utf8()].trim_end_matches(is_closer);
        }
    }
    let body = text.trim_end_matches(is_clause_punct);
    let run = &text[body.len()..];
    let paragraph = consumed[text.len()..].matches('\n').count() >= 2;
    let (punct, sentence) = match run.chars().next() {
        // An ellipsis pauses without ending the sentence, and Piper keeps no punctuation for it.
        Some('.') if run.starts_with("..") => (None, false),
        Some('…') => (None, false),
        Some('.' | '。') => (Some('.'), true),
        Some('?' | '？') => (Some('?'), true),
        Some('!' | '！') => (Some('!'), true),
        Some(',' | '，' | '、') => (Some(','), false),
        Some(':' | '：') => (Some(':'), false),
        // espeak-ng reads dashes as a semicolon.
        Some(';' | '；' | '–' | '—') => (Some(';'), false),
        _ => (None, false),
    };
    (punct, sentence || paragraph || at_end)
}

/// Piper's sentences: each clause's phonemes without espeak-ng's language-switch marks, its
/// punctuation appended (and a space after `,` `:` `;`, which do not end the sentence), split
/// into NFD codepoints, with the voice's vowel clusters merged back into one phoneme. Sentences
/// with nothing to say are dropped.
pub fn sentences(clauses: impl IntoIterator<Item = Clause>, vowel_clusters: &[Vec<String>]) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    let mut current = String::new();
    for clause in clauses {
        current.push_str(&strip_language_marks(&clause.phonemes));
        if let Some(p) = clause.terminator {
            current.push(p);
            if matches!(p, ',' | ':' | ';') {
                current.push(' ');
            }
        }
        if clause.end_of_sentence {
            push_sentence(&mut all, &current, vowel_clusters);
            current.clear();
        }
    }
    push_sentence(&mut all, &current, vowel_clusters);
    all
}

/// The codepoints of `text` as phonemes (voices whose phoneme_type is "text").
pub fn text_sentences(text: &str) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    push_sentence(&mut all, text, &[]);
    all
}

fn push_sentence(all: &mut Vec<Vec<String>>, phonemes: &str, vowel_clusters: &[Vec<String>]) {
    if phonemes.trim().is_empty() {
        return;
    }
    let split: Vec<String> = phonemes.nfd().map(String::from).collect();
    all.push(merge_vowel_clusters(split, vowel_clusters));
}

/// espeak-ng wraps words it reads in another language in `(fr)…(en)`; Piper drops the marks.
fn strip_language_marks(phonemes: &str) -> String {
    let mut out = String::with_capacity(phonemes.len());
    let mut rest = phonemes;
    while let Some(open) = rest.find('(') {
        match rest[open + 1..].find(')') {
            Some(len) if len > 0 => {
                out.push_str(&rest[..open]);
                rest = &rest[open + 1 + len + 1..];
            }
            Some(_) => {
                out.push_str(&rest[..=open]);
                rest = &rest[open + 1..];
            }
            None => break,
        }
    }
    out.push_str(rest);
    out
}

/// Joins runs of phonemes the voice knows as one symbol, longest match first, as Piper does.
fn merge_vowel_clusters(phonemes: Vec<String>, clusters: &[Vec<String>]) -> Vec<String> {
    let Some(longest) = clusters.iter().map(Vec::len).max() else {
        return phonemes;
    };
    let mut out = Vec::with_capacity(phonemes.len());
    let mut i = 0;
    while i < phonemes.len() {
        let max = longest.min(phonemes.len() - i);
        let hit = (2..=max).rev().find(|&n| clusters.iter().any(|c| c.as_slice() == &phonemes[i..i + n]));
        match hit {
            Some(n) => {
                out.push(phonemes[i..i + n].concat());
                i += n;
            }
            None => {
                out.push(phonemes[i].clone());
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clause(phonemes: &str, terminator: Option<char>, end: bool) -> Clause {
        Clause { phonemes: phonemes.into(), terminator, end_of_sentence: end }
    }

    /// What Debian's espeak-ng 1.51 consumed per clause (pointer to pointer), and what Piper's
    /// bridge reported for the same clause.
    #[test]
    fn clause_ends_from_consumed_text_match_pipers_bridge() {
        let cases: &[(&str, bool, Option<char>, bool)] = &[
            ("Hello world. T", false, Some('.'), true),
            ("his is a test, o", false, Some(','), false),
            ("f the clause splitting: r", false, Some(':'), false),
            ("eally? Y", false, Some('?'), true),
            ("es! D", false, Some('!'), true),
            ("mith paid $3.50 for e.g. apples; t", false, Some(';'), false),
            ("hen left... O", false, None, false),
            ("K \"quoted.\"", false, Some('.'), true),
            (" (paren) end", true, None, true),
            ("Hello.  W", false, Some('.'), true),
            ("orld\n\nN", false, None, true),
            ("ew paragraph", true, None, true),
            ("What?! W", false, Some('?'), true),
            ("mm… o", false, None, false),
            ("It's 10:30 — t", false, Some(';'), false),
            ("ime (now) [x] {y} end.", true, Some('.'), true),
            ("«Bonjour», d", false, Some(','), false),
            ("Hi.(", false, Some('.'), true),
            (" he said. '", false, Some('.'), true),
            ("Wow!!! R", false, Some('!'), true),
            ("eally??", true, Some('?'), true),
            ("", true, None, true),
        ];
        for &(consumed, at_end, punct, sentence) in cases {
            assert_eq!(clause_end_from_text(consumed, at_end), (punct, sentence), "{consumed:?}");
        }
    }

    #[test]
    fn terminator_codes_read_as_piper_reads_them() {
        assert_eq!(clause_end_from_code(40 | TYPE_SENTENCE), (Some('.'), true));
        assert_eq!(clause_end_from_code(40 | INTONATION_QUESTION | TYPE_SENTENCE), (Some('?'), true));
        assert_eq!(clause_end_from_code(20 | INTONATION_COMMA | TYPE_CLAUSE), (Some(','), false));
        // Flags above the mask do not change the kind; unknown kinds keep no punctuation.
        assert_eq!(clause_end_from_code(0x0100_0000 | 30 | INTONATION_COMMA | TYPE_CLAUSE), (Some(';'), false));
        assert_eq!(clause_end_from_code(15 | TYPE_SENTENCE), (None, true));
    }

    #[test]
    fn sentences_keep_punctuation_and_split_after_sentence_ends() {
        let s = sentences(
            [
                clause("həlˈoʊ", Some(','), false),
                clause("wˈɜːld", Some('.'), true),
                clause("(fr)bɔ̃ʒˈuʁ(en)", None, true),
                clause("", None, true),
            ],
            &[],
        );
        let joined: Vec<String> = s.iter().map(|p| p.concat()).collect();
        // The language-switch marks are gone, the punctuation kept.
        assert_eq!(joined, ["həlˈoʊ, wˈɜːld.", "bɔ̃ʒˈuʁ"]);
        assert!(s[0].iter().all(|p| p.chars().count() == 1), "one codepoint per phoneme");
    }

    #[test]
    fn phonemes_are_decomposed_like_pipers() {
        let s = sentences([clause("ç", None, true)], &[]);
        assert_eq!(s, [vec!["c".to_string(), "\u{327}".to_string()]]);
    }

    #[test]
    fn vowel_clusters_merge_longest_first() {
        let clusters = vec![vec!["a".to_string(), "ɪ".to_string()], vec!["o".into(), "ʊ".into()]];
        let s = sentences([clause("haɪ oʊ a", None, true)], &clusters);
        assert_eq!(s[0], ["h", "aɪ", " ", "oʊ", " ", "a"]);
    }
}
