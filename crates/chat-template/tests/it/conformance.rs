//! Renders every real template in `tests/conformance/templates` over every conversation in
//! `conversations.json` and compares with the goldens that Python transformers produced
//! (`make_goldens.py`). Differences must be listed, with their reason, in `DIFFERENCES.md`.

use llmr_chat_template::{ChatTemplate, Message, RenderInput, SpecialTokens, TemplateError, Tool};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const MIN_IDENTICAL: f64 = 0.95;

#[derive(Deserialize)]
struct Inputs {
    tools: Vec<Tool>,
    // serde_json's preserve_order keeps the file's order, which is the table's column order.
    conversations: serde_json::Map<String, serde_json::Value>,
}

#[derive(Deserialize)]
struct Conversation {
    #[serde(default)]
    with_tools: bool,
    messages: Vec<Message>,
}

#[derive(Deserialize)]
struct Source {
    bos_token: String,
    eos_token: String,
    fixed_now: String,
}

/// What transformers did with one (template, conversation) pair.
enum Golden {
    Text(String),
    /// `raise_exception(message)`.
    Raised(String),
    /// Any other failure; we only require that we fail too.
    Error(String),
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

fn read_golden(stem: &str, conversation: &str) -> Golden {
    let base = dir().join("goldens").join(stem);
    let read = |ext: &str| fs::read_to_string(base.join(format!("{conversation}.{ext}"))).ok();
    if let Some(text) = read("txt") {
        Golden::Text(text)
    } else if let Some(text) = read("raised") {
        Golden::Raised(text.strip_prefix("TemplateError: ").unwrap_or(&text).to_owned())
    } else if let Some(text) = read("error") {
        Golden::Error(text)
    } else {
        panic!("no golden for {stem}/{conversation}: run make_goldens.py")
    }
}

/// `None` when we match the golden, else what differs.
fn compare(golden: &Golden, ours: &Result<String, TemplateError>) -> Option<String> {
    match (golden, ours) {
        (Golden::Text(want), Ok(got)) if want == got => None,
        (Golden::Text(want), Ok(got)) => Some(first_difference(want, got)),
        (Golden::Text(_), Err(e)) => Some(format!("we fail: {e}")),
        (Golden::Raised(want), Err(TemplateError::Raised { message })) if want == message => None,
        (Golden::Raised(want), other) => Some(format!("transformers raised {want:?}, we gave {other:?}")),
        (Golden::Error(_), Err(_)) => None,
        (Golden::Error(want), Ok(_)) => Some(format!("transformers failed ({want}), we rendered")),
    }
}

fn first_difference(want: &str, got: &str) -> String {
    let at = want.chars().zip(got.chars()).take_while(|(a, b)| a == b).count();
    let around = |s: &str| s.chars().skip(at.saturating_sub(30)).take(60).collect::<String>();
    format!("char {at}: want {:?}, got {:?}", around(want), around(got))
}

/// The (template, conversation) pairs that `DIFFERENCES.md` lists in its table.
fn listed_differences() -> BTreeSet<(String, String)> {
    let text = fs::read_to_string(dir().join("DIFFERENCES.md")).expect("DIFFERENCES.md exists");
    text.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.strip_prefix('|')?.split('|').map(str::trim).collect();
            let (template, conversation) = (cells.first()?, cells.get(1)?);
            let is_row = !template.is_empty() && *template != "template" && !template.starts_with('-');
            is_row.then(|| (template.trim_matches('`').to_owned(), conversation.trim_matches('`').to_owned()))
        })
        .collect()
}

#[test]
fn matches_transformers_goldens() {
    let inputs: Inputs = serde_json::from_str(&fs::read_to_string(dir().join("conversations.json")).unwrap()).unwrap();
    let source: Source = serde_json::from_str(&fs::read_to_string(dir().join("SOURCE.json")).unwrap()).unwrap();
    let now = chrono::NaiveDateTime::parse_from_str(&source.fixed_now, "%Y-%m-%dT%H:%M:%S").unwrap();
    let tokens = SpecialTokens { bos_token: Some(source.bos_token), eos_token: Some(source.eos_token) };
    let conversations: Vec<(String, Conversation)> =
        inputs.conversations.iter().map(|(name, v)| (name.clone(), Conversation::deserialize(v).unwrap())).collect();
    // Set to a folder to get our renders there, for diffing against the goldens.
    let dump = std::env::var_os("LLMR_CONFORMANCE_OUT").map(PathBuf::from);

    let mut templates: Vec<PathBuf> =
        fs::read_dir(dir().join("templates")).unwrap().map(|e| e.unwrap().path()).collect();
    templates.sort();
    let mut differences: BTreeMap<(String, String), String> = BTreeMap::new();
    let mut rows = Vec::new();
    let mut total = 0;
    for path in &templates {
        let stem = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let compiled = ChatTemplate::new(&fs::read_to_string(path).unwrap(), tokens.clone());
        let mut row = format!("{stem:<52}");
        for (name, conversation) in &conversations {
            let mut input = RenderInput::new(&conversation.messages, true).at(now);
            if conversation.with_tools {
                input = input.with_tools(&inputs.tools);
            }
            let ours = compiled.as_ref().map_err(Clone::clone).and_then(|t| t.render(&input));
            if let (Some(out), Ok(text)) = (&dump, &ours) {
                fs::create_dir_all(out.join(&stem)).unwrap();
                fs::write(out.join(&stem).join(format!("{name}.txt")), text).unwrap();
            }
            total += 1;
            let golden = read_golden(&stem, name);
            let mark = match compare(&golden, &ours) {
                None if matches!(golden, Golden::Text(_)) => "ok",
                None => "ok(err)",
                Some(why) => {
                    differences.insert((stem.clone(), name.clone()), why);
                    "DIFF"
                }
            };
            row.push_str(&format!(" {mark:<12}"));
        }
        rows.push(row);
    }

    let header: String = conversations.iter().map(|(name, _)| format!(" {name:<12}")).collect();
    println!("{:<52}{header}", "template");
    for row in &rows {
        println!("{row}");
    }
    let identical = total - differences.len();
    let share = identical as f64 / total as f64;
    println!("\n{identical}/{total} identical to transformers ({:.1}%)", share * 100.0);
    for ((stem, name), why) in &differences {
        println!("DIFF {stem} / {name}: {why}");
    }

    let listed = listed_differences();
    let unlisted: Vec<_> = differences.keys().filter(|k| !listed.contains(*k)).collect();
    let stale: Vec<_> = listed.iter().filter(|k| !differences.contains_key(*k)).collect();
    assert!(unlisted.is_empty(), "differences missing from DIFFERENCES.md: {unlisted:?}");
    assert!(stale.is_empty(), "DIFFERENCES.md lists pairs that now match: {stale:?}");
    assert!(share >= MIN_IDENTICAL, "only {:.1}% identical", share * 100.0);
}
