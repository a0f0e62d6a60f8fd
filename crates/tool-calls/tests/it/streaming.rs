//! When events are released: content at once, calls whole and as soon as they are complete.

use llmr_tool_calls::ToolCallFormat::{self, Hermes, Llama3, Mistral, PlainJson};
use llmr_tool_calls::{StreamEvent, StreamParser};

use crate::support::{call, TOOLS};

fn new_parser(format: ToolCallFormat) -> StreamParser {
    StreamParser::new(format, TOOLS.iter().map(|name| (*name).to_owned()).collect())
}

fn content(text: &str) -> Vec<StreamEvent> {
    vec![StreamEvent::Content(text.to_owned())]
}

#[test]
fn plain_chat_streams_token_by_token() {
    for format in [Hermes, Mistral] {
        let mut parser = new_parser(format);
        assert_eq!(parser.push("Hello"), content("Hello"), "{format:?}");
        assert_eq!(parser.push(", world"), content(", world"), "{format:?}");
        // Whitespace waits for what follows it: before a call it would be dropped.
        assert_eq!(parser.push(".\n"), content("."), "{format:?}");
        assert_eq!(parser.push("Bye"), content("\nBye"), "{format:?}");
        assert_eq!(parser.push(" "), vec![], "{format:?}");
        assert_eq!(parser.finish(), content(" "), "{format:?}");
    }
    // Where a call can only open the answer, everything after a first word is released as it comes.
    for format in [Llama3, PlainJson] {
        let mut parser = new_parser(format);
        assert_eq!(parser.push("\n"), vec![], "{format:?}");
        assert_eq!(parser.push("Hello"), content("\nHello"), "{format:?}");
        assert_eq!(parser.push(".\n"), content(".\n"), "{format:?}");
        assert_eq!(parser.push("{"), content("{"), "{format:?}");
        assert_eq!(parser.finish(), vec![], "{format:?}");
    }
}

#[test]
fn text_that_may_open_a_call_is_held_until_decided() {
    let mut parser = new_parser(Hermes);
    assert_eq!(parser.push("See <"), content("See"));
    assert_eq!(parser.push("tool"), vec![]);
    assert_eq!(parser.push("box>"), content(" <toolbox>"));

    let mut parser = new_parser(PlainJson);
    assert_eq!(parser.push(" {\"na"), vec![]);
    assert_eq!(parser.push("me\": 3"), vec![]);
    // Not a JSON value any more: released at once.
    assert_eq!(parser.push(" x"), content(" {\"name\": 3 x"));
    assert_eq!(parser.push(" more"), content(" more"));
}

#[test]
fn a_hermes_call_is_released_whole_after_its_closing_marker() {
    let mut parser = new_parser(Hermes);
    let pieces = [
        "I'll check.",
        "\n",
        "<tool_call>",
        "\n",
        "{\"",
        "name",
        "\":",
        " \"",
        "get_time",
        "\",",
        " \"",
        "arguments",
        "\":",
        " {}",
        "}",
        "\n",
        "</tool_call>",
    ];

    for (i, piece) in pieces.iter().enumerate() {
        let got = parser.push(piece);
        match i {
            0 => assert_eq!(got, content("I'll check.")),
            16 => assert_eq!(got, vec![StreamEvent::Call { index: 0, call: call("get_time", "{}") }]),
            _ => assert_eq!(got, vec![], "piece {i} {piece:?}"),
        }
    }
    assert_eq!(parser.finish(), vec![]);
}

#[test]
fn a_bare_call_is_released_at_its_closing_brace() {
    let mut parser = new_parser(Llama3);
    assert_eq!(parser.push("{\"name\": \"get_time\", \"parameters\": {}"), vec![]);
    assert_eq!(parser.push("}"), vec![StreamEvent::Call { index: 0, call: call("get_time", "{}") }]);
    assert_eq!(parser.push(";"), vec![]);
    assert_eq!(
        parser.push(" {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"),
        vec![StreamEvent::Call { index: 1, call: call("get_weather", "{\"city\":\"Oslo\"}") }]
    );
    assert_eq!(parser.finish(), vec![]);
}

#[test]
fn finish_gives_back_what_was_held() {
    let mut parser = new_parser(Hermes);
    assert_eq!(parser.push("Sure.\n<tool_call>\n{\"name\": \"get_time\""), content("Sure."));
    assert_eq!(parser.finish(), content("\n<tool_call>\n{\"name\": \"get_time\""));

    let mut parser = new_parser(Mistral);
    assert_eq!(parser.push("[TOOL_CA"), vec![]);
    assert_eq!(parser.finish(), content("[TOOL_CA"));
}

#[test]
fn prefill_events_come_with_the_first_push() {
    // A prefill that is plain text (not a call prefix) is content, returned with the first push.
    let mut parser = new_parser(Hermes).with_prefill("Answer: ");
    assert_eq!(parser.push("42"), content("Answer: 42"));
    // A forced prefix is held as the start of a call.
    let mut parser = new_parser(Hermes).with_prefill(&Hermes.forced_prefix(Some("get_time")));
    assert_eq!(parser.push("{}}\n</tool_call>"), vec![StreamEvent::Call { index: 0, call: call("get_time", "{}") }]);
}
