use llmr_tool_calls::ToolCallFormat::Llama3;

use crate::support::{call, check, check_with, output, text_only, TOOLS};

const WEATHER: &str = r#"{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}"#;
const TIME: &str = r#"{"name": "get_time", "parameters": {"timezone": "Europe/Paris"}}"#;

fn weather() -> llmr_tool_calls::ParsedCall {
    call("get_weather", r#"{"city":"Paris","unit":"celsius"}"#)
}

fn time() -> llmr_tool_calls::ParsedCall {
    call("get_time", r#"{"timezone":"Europe/Paris"}"#)
}

#[test]
fn single_call() {
    check(Llama3, WEATHER, &output("", vec![weather()]));
    check(Llama3, &format!("\n {WEATHER}\n"), &output("", vec![weather()]));
    check(Llama3, &format!("<|python_tag|>{WEATHER}"), &output("", vec![weather()]));
    // `arguments` is read as well as `parameters`.
    check(Llama3, r#"{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}"#, &output("", vec![time()]));
}

#[test]
fn several_calls() {
    check(Llama3, &format!("{WEATHER}; {TIME}"), &output("", vec![weather(), time()]));
    check(Llama3, &format!("<|python_tag|>{WEATHER};{TIME};"), &output("", vec![weather(), time()]));
    check(Llama3, &format!("{WEATHER}\n{TIME}\n"), &output("", vec![weather(), time()]));
    check(Llama3, &format!("[{WEATHER}, {TIME}]"), &output("", vec![weather(), time()]));
}

#[test]
fn content_only_answers_are_unchanged() {
    for text in [
        "The weather in Paris is sunny.",
        "\n\nSure! {\"name\": \"get_weather\", \"parameters\": {}}",
        "<b>bold</b>",
        "<|python_tag|>brave_search.call(query=\"weather in Paris\")",
        "`code`",
        "",
        "   ",
    ] {
        check(Llama3, text, &text_only(text));
    }
}

#[test]
fn text_after_a_call_is_content() {
    check(
        Llama3,
        &format!("{WEATHER}\nI asked for the weather."),
        &output("\nI asked for the weather.", vec![weather()]),
    );
    check(Llama3, &format!("{WEATHER}; not a call"), &output("; not a call", vec![weather()]));
}

#[test]
fn invalid_json_stays_content() {
    for text in [
        r#"{"name": "get_weather", "parameters": {"city": "Paris"}"#,
        r#"{"name": get_weather, "parameters": {}}"#,
        r#"{"name": "get_weather", "parameters": {"city": "Paris",}}"#,
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Pa\nris\"}}",
    ] {
        check(Llama3, text, &text_only(text));
    }
}

#[test]
fn json_that_is_not_a_call_stays_content() {
    for text in [
        r#"{"answer": 42}"#,
        r#"{"name": "get_weather"}"#,
        r#"[1, 2, 3]"#,
        r#"{"name": "get_weather", "parameters": {}, "x": 1} extra"#,
    ] {
        let expected = if text.ends_with("extra") {
            // A valid call followed by text: the call counts, the text is content.
            output(" extra", vec![call("get_weather", "{}")])
        } else {
            text_only(text)
        };
        check(Llama3, text, &expected);
    }
}

#[test]
fn unknown_tools_stay_content() {
    let text = r#"{"name": "delete_files", "parameters": {"path": "/"}}"#;
    check(Llama3, text, &text_only(text));
    // A list is taken whole or not at all.
    let list = format!("[{WEATHER}, {text}]");
    check(Llama3, &list, &text_only(&list));
}

#[test]
fn prefill_for_required_and_named_calls() {
    let required = Llama3.forced_prefix(None);
    check_with(
        Llama3,
        TOOLS,
        &required,
        r#"get_time", "parameters": {"timezone": "Europe/Paris"}}"#,
        &output("", vec![time()]),
    );
    let named = Llama3.forced_prefix(Some("get_weather"));
    check_with(Llama3, TOOLS, &named, r#"{"city": "Paris", "unit": "celsius"}}"#, &output("", vec![weather()]));
    check_with(Llama3, TOOLS, &named, "{\"city\": \"Paris\"", &text_only(&format!("{named}{{\"city\": \"Paris\"")));
}
