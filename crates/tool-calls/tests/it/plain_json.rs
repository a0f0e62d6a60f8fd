use llmr_tool_calls::ToolCallFormat::PlainJson;

use crate::support::{call, check, check_with, output, text_only, TOOLS};

const WEATHER: &str = r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}"#;
const TIME: &str = r#"{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}"#;

fn weather() -> llmr_tool_calls::ParsedCall {
    call("get_weather", r#"{"city":"Paris","unit":"celsius"}"#)
}

fn time() -> llmr_tool_calls::ParsedCall {
    call("get_time", r#"{"timezone":"Europe/Paris"}"#)
}

#[test]
fn single_call() {
    check(PlainJson, WEATHER, &output("", vec![weather()]));
    check(PlainJson, &format!("  \n{WEATHER}\n\n"), &output("", vec![weather()]));
    check(PlainJson, &format!("```json\n{WEATHER}\n```"), &output("", vec![weather()]));
    check(PlainJson, &format!("```JSON\n{WEATHER}\n```\n"), &output("", vec![weather()]));
    check(PlainJson, &format!("```\n{WEATHER}\n```"), &output("", vec![weather()]));
    // A fence the generation did not close.
    check(PlainJson, &format!("```json\n{WEATHER}\n``"), &output("", vec![weather()]));
    check(
        PlainJson,
        r#"{"type": "function", "function": {"name": "get_time", "arguments": "{\"timezone\":\"Europe/Paris\"}"}}"#,
        &output("", vec![time()]),
    );
}

#[test]
fn several_calls() {
    check(PlainJson, &format!("[{WEATHER}, {TIME}]"), &output("", vec![weather(), time()]));
    check(PlainJson, &format!("{{\"tool_calls\": [{WEATHER}, {TIME}]}}"), &output("", vec![weather(), time()]));
    check(PlainJson, &format!("```json\n[{WEATHER},\n {TIME}]\n```"), &output("", vec![weather(), time()]));
    check(PlainJson, &format!("{WEATHER}\n{TIME}"), &output("", vec![weather(), time()]));
}

#[test]
fn other_formats_opening_the_answer_are_read() {
    check(PlainJson, &format!("<tool_call>\n{WEATHER}\n</tool_call>"), &output("", vec![weather()]));
    check(PlainJson, &format!("<|python_tag|>{TIME}"), &output("", vec![time()]));
}

#[test]
fn content_only_answers_are_unchanged() {
    for text in [
        "Hello! How can I help?",
        "Here it is: {\"name\": \"get_weather\", \"arguments\": {}}",
        "```python\nprint(1)\n```",
        "```javascript\nx\n```",
        "``not a fence",
        "<p>html</p>",
        "[1, 2, 3]",
        "{\"answer\": 42}",
        "",
    ] {
        check(PlainJson, text, &text_only(text));
    }
}

#[test]
fn json_answers_that_are_not_calls_stay_content() {
    // Bare JSON must carry arguments to count: `{"name": ...}` alone may be an ordinary answer.
    let person = r#"{"name": "Alice", "age": 30}"#;
    check_with(PlainJson, &[], "", person, &text_only(person));
    check(PlainJson, r#"{"name": "get_weather"}"#, &text_only(r#"{"name": "get_weather"}"#));
}

#[test]
fn invalid_json_stays_content() {
    for text in [
        r#"{"name": "get_weather", "arguments": {"city": "Paris"}"#,
        r#"{"name": "get_weather", "arguments": {'city': 'Paris'}}"#,
        "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\",}}\n```",
        "{\"name\": \"get_weather\", \"arguments\": {\"n\": 01x}}",
    ] {
        check(PlainJson, text, &text_only(text));
    }
}

#[test]
fn unknown_tools_stay_content() {
    let text = r#"{"name": "send_email", "arguments": {"to": "x@y.z"}}"#;
    check(PlainJson, text, &text_only(text));
    check_with(PlainJson, &[], "", text, &output("", vec![call("send_email", r#"{"to":"x@y.z"}"#)]));
}

#[test]
fn prefill_for_required_and_named_calls() {
    let required = PlainJson.forced_prefix(None);
    check_with(
        PlainJson,
        TOOLS,
        &required,
        r#"get_time", "arguments": {"timezone": "Europe/Paris"}}"#,
        &output("", vec![time()]),
    );
    let named = PlainJson.forced_prefix(Some("get_weather"));
    check_with(PlainJson, TOOLS, &named, r#"{"city": "Paris", "unit": "celsius"}}"#, &output("", vec![weather()]));
    check_with(PlainJson, TOOLS, &required, "nope\"}", &text_only(&format!("{required}nope\"}}")));
}
