use llmr_tool_calls::ToolCallFormat::{Mistral, MistralArgs};

use crate::support::{call, check, check_with, output, text_only, TOOLS};

const LIST: &str = r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]"#;
const TWO: &str = r#"[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, {"name": "get_time", "arguments": {"timezone": "Europe/Paris"}, "id": "abc123xyz"}]"#;
const ARGS: &str = r#"[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}"#;
const ARGS_TIME: &str = r#"[TOOL_CALLS]get_time[CALL_ID]a1B2c3D4e[ARGS]{"timezone": "Europe/Paris"}"#;

fn weather() -> llmr_tool_calls::ParsedCall {
    call("get_weather", r#"{"city":"Paris","unit":"celsius"}"#)
}

fn time() -> llmr_tool_calls::ParsedCall {
    call("get_time", r#"{"timezone":"Europe/Paris"}"#)
}

#[test]
fn single_call() {
    for format in [Mistral, MistralArgs] {
        check(format, LIST, &output("", vec![weather()]));
        check(format, ARGS, &output("", vec![weather()]));
        check(format, &format!("{ARGS_TIME}\n"), &output("", vec![time()]));
        check(
            format,
            r#"[TOOL_CALLS]{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}"#,
            &output("", vec![time()]),
        );
    }
}

#[test]
fn several_calls() {
    for format in [Mistral, MistralArgs] {
        check(format, TWO, &output("", vec![weather(), time()]));
        check(format, &format!("{ARGS}{ARGS_TIME}"), &output("", vec![weather(), time()]));
        check(format, &format!("{LIST}\n{ARGS_TIME}"), &output("", vec![weather(), time()]));
    }
}

#[test]
fn content_before_and_after_calls() {
    check(Mistral, &format!("Let me look that up. {LIST}"), &output("Let me look that up.", vec![weather()]));
    check(MistralArgs, &format!("Checking.\n\n{ARGS}\nDone."), &output("Checking.\nDone.", vec![weather()]));
}

#[test]
fn plain_answers_are_unchanged() {
    for text in [
        "See [1] and [2].",
        "A [TOOL_CALL] look-alike, and a cut marker [TOOL_CA",
        "[TOOL_CALLS]",
        "[TOOL_CALLS] nothing",
        "é[TOOL_CALLS]!",
    ] {
        check(Mistral, text, &text_only(text));
        check(MistralArgs, text, &text_only(text));
    }
}

#[test]
fn invalid_json_stays_content() {
    for text in [
        r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}]"#,
        r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
        r#"[TOOL_CALLS]get_weather[ARGS]{"city": Paris}"#,
        r#"[TOOL_CALLS]get_weather[ARGS]"Paris""#,
        r#"[TOOL_CALLS]get_weather{"city": "Paris"}"#,
        "[TOOL_CALLS]get_weather[ARG",
    ] {
        check(Mistral, text, &text_only(text));
    }
    // Content up to where it became invalid; a valid call after it still counts.
    let bad = r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}]"#;
    check(Mistral, &format!("{bad} {ARGS_TIME}"), &output(bad, vec![time()]));
}

#[test]
fn unknown_tools_stay_content() {
    let unknown = r#"[TOOL_CALLS]rm_rf[ARGS]{"path": "/"}"#;
    check(MistralArgs, unknown, &text_only(unknown));
    let mixed = r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {}}, {"name": "rm_rf", "arguments": {}}]"#;
    check(Mistral, mixed, &text_only(mixed));
    check_with(Mistral, &[], "", unknown, &output("", vec![call("rm_rf", r#"{"path":"/"}"#)]));
}

#[test]
fn prefill_for_required_and_named_calls() {
    let required = Mistral.forced_prefix(None);
    check_with(
        Mistral,
        TOOLS,
        &required,
        r#"[{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}]"#,
        &output("", vec![time()]),
    );
    check_with(
        MistralArgs,
        TOOLS,
        &required,
        r#"get_weather[ARGS]{"city": "Paris", "unit": "celsius"}"#,
        &output("", vec![weather()]),
    );
    let named = Mistral.forced_prefix(Some("get_time"));
    check_with(Mistral, TOOLS, &named, r#"{"timezone": "Europe/Paris"}}]"#, &output("", vec![time()]));
    let named = MistralArgs.forced_prefix(Some("get_weather"));
    check_with(MistralArgs, TOOLS, &named, r#"{"city": "Paris", "unit": "celsius"}"#, &output("", vec![weather()]));
    check_with(MistralArgs, TOOLS, &named, "Paris", &text_only(&format!("{named}Paris")));
}
