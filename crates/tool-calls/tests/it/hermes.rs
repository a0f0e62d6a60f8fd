use llmr_tool_calls::ToolCallFormat::Hermes;

use crate::support::{call, check, check_with, output, text_only, TOOLS};

const WEATHER: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";
const TIME: &str =
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"timezone\": \"Europe/Paris\"}}\n</tool_call>";

fn weather() -> llmr_tool_calls::ParsedCall {
    call("get_weather", r#"{"city":"Paris","unit":"celsius"}"#)
}

fn time() -> llmr_tool_calls::ParsedCall {
    call("get_time", r#"{"timezone":"Europe/Paris"}"#)
}

#[test]
fn single_call() {
    check(Hermes, WEATHER, &output("", vec![weather()]));
    check(Hermes, &format!("\n{WEATHER}\n"), &output("", vec![weather()]));
}

#[test]
fn several_calls() {
    check(Hermes, &format!("{WEATHER}\n{TIME}"), &output("", vec![weather(), time()]));
    check(Hermes, &format!("{WEATHER}{TIME}\n"), &output("", vec![weather(), time()]));
}

#[test]
fn content_before_and_after_calls() {
    let text = format!("Let me check the weather and the time.\n\n{WEATHER}\n{TIME}");
    check(Hermes, &text, &output("Let me check the weather and the time.", vec![weather(), time()]));
    let text = format!("Checking.\n{WEATHER}\nDone, see above.\n");
    check(Hermes, &text, &output("Checking.\nDone, see above.\n", vec![weather()]));
}

#[test]
fn plain_answers_are_unchanged() {
    for text in [
        "The capital of France is Paris.",
        "  Leading spaces, trailing newline\n\n",
        "Use the <tool> element, or <tool_cal, not </tool_call>.",
        "ends with a partial marker <tool_ca",
        "Unicode: été, 日本語, 🎉 <",
        "",
    ] {
        check(Hermes, text, &text_only(text));
    }
}

#[test]
fn invalid_json_stays_content() {
    let missing_brace = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}\n</tool_call>";
    check(Hermes, missing_brace, &text_only(missing_brace));
    let not_json = "<tool_call>\nget_weather(city=\"Paris\")\n</tool_call>";
    check(Hermes, not_json, &text_only(not_json));
    let bad_number = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"n\": 1.2.3}}\n</tool_call>";
    check(Hermes, bad_number, &text_only(bad_number));
    // An invalid block does not hide a valid one after it.
    check(Hermes, &format!("{missing_brace}\n{TIME}"), &output(missing_brace, vec![time()]));
}

#[test]
fn unterminated_calls_stay_content() {
    let cut = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"argu";
    check(Hermes, cut, &text_only(cut));
    check(Hermes, "<tool_call>", &text_only("<tool_call>"));
}

#[test]
fn a_complete_call_without_its_closing_marker_counts() {
    let text = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"timezone\": \"Europe/Paris\"}}";
    check(Hermes, text, &output("", vec![time()]));
    check(Hermes, &format!("{text}\n</tool_"), &output("", vec![time()]));
    // Another block right after: both count.
    check(Hermes, &format!("{text}\n{WEATHER}"), &output("", vec![time(), weather()]));
}

#[test]
fn unknown_tools_stay_content() {
    let text = "<tool_call>\n{\"name\": \"delete_files\", \"arguments\": {}}\n</tool_call>";
    check(Hermes, text, &text_only(text));
    check(Hermes, &format!("{text}\n{WEATHER}"), &output(text, vec![weather()]));
    // With no tools listed, any name is accepted.
    check_with(Hermes, &[], "", text, &output("", vec![call("delete_files", "{}")]));
}

#[test]
fn argument_shapes() {
    let string_args =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}\n</tool_call>";
    check(Hermes, string_args, &output("", vec![call("get_weather", r#"{"city": "Paris"}"#)]));
    let no_args = "<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>";
    check(Hermes, no_args, &output("", vec![call("get_time", "{}")]));
    let nested = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"z\": [1, {\"b\": true, \"a\": null}], \"a\": \"</tool_call>\"}}\n</tool_call>";
    check(
        Hermes,
        nested,
        &output("", vec![call("get_weather", r#"{"z":[1,{"b":true,"a":null}],"a":"</tool_call>"}"#)]),
    );
}

#[test]
fn prefill_for_required_and_named_calls() {
    let required = Hermes.forced_prefix(None);
    let text = "get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";
    check_with(Hermes, TOOLS, &required, text, &output("", vec![weather()]));

    let named = Hermes.forced_prefix(Some("get_time"));
    let text = "{\"timezone\": \"Europe/Paris\"}}\n</tool_call>";
    check_with(Hermes, TOOLS, &named, text, &output("", vec![time()]));
    // Several calls after a forced first one.
    check_with(Hermes, TOOLS, &named, &format!("{text}\n{WEATHER}"), &output("", vec![time(), weather()]));

    // If the model does not complete the call, the prefill is part of the content given back.
    check_with(Hermes, TOOLS, &named, "oops", &text_only(&format!("{named}oops")));
}

/// Qwen2.5 models often answer a tools prompt with the bare JSON call and no `<tool_call>` block.
#[test]
fn a_bare_json_answer_is_a_call() {
    let bare = r#"{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}"#;
    check(Hermes, bare, &output("", vec![weather()]));
    check(Hermes, &format!("\n{bare}\n"), &output("", vec![weather()]));
    // JSON that is not a call stays content; text is still searched for blocks.
    let not_a_call = r#"{"city": "Paris"}"#;
    check(Hermes, not_a_call, &text_only(not_a_call));
    check(Hermes, &format!("Sure. {TIME}"), &output("Sure.", vec![time()]));
}
