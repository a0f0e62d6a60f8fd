//! Rendering behaviour that the real templates in the conformance suite may not all exercise.

use llmr_chat_template::{ChatTemplate, Message, RenderInput, SpecialTokens, TemplateError, Tool, ToolCall};
use serde_json::json;

fn template(source: &str) -> ChatTemplate {
    ChatTemplate::new(source, SpecialTokens { bos_token: Some("<s>".into()), eos_token: Some("</s>".into()) }).unwrap()
}

fn render(source: &str, input: &RenderInput<'_>) -> Result<String, TemplateError> {
    template(source).render(input)
}

const TURNS: &str = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}\
{% if add_generation_prompt %}[assistant]{% endif %}";

#[test]
fn add_generation_prompt_on_and_off() {
    let messages = [Message::user("hi")];
    assert_eq!(render(TURNS, &RenderInput::new(&messages, true)).unwrap(), "<s>[user]hi[assistant]");
    assert_eq!(render(TURNS, &RenderInput::new(&messages, false)).unwrap(), "<s>[user]hi");
}

#[test]
fn raise_exception_carries_the_message() {
    let source = "{% if messages[0].role != 'user' %}{{ raise_exception('First message must be from the user, not ' ~ messages[0].role) }}{% endif %}";
    let messages = [Message::assistant("hello")];
    let err = render(source, &RenderInput::new(&messages, true)).unwrap_err();
    assert_eq!(err, TemplateError::Raised { message: "First message must be from the user, not assistant".into() });
    assert_eq!(
        err.to_string(),
        "chat template rejected the conversation: First message must be from the user, not assistant"
    );
}

#[test]
fn raise_exception_inside_a_macro_is_still_raised() {
    let source = "{% macro check(m) %}{{ raise_exception('bad ' + m.role) }}{% endmacro %}{{ check(messages[0]) }}";
    let messages = [Message::system("x")];
    let err = render(source, &RenderInput::new(&messages, true)).unwrap_err();
    assert_eq!(err, TemplateError::Raised { message: "bad system".into() });
}

#[test]
fn other_failures_are_render_errors_with_a_line() {
    let err =
        render("ok\n{{ messages[0].content.nope() }}", &RenderInput::new(&[Message::user("x")], true)).unwrap_err();
    assert!(matches!(err, TemplateError::Render { line: Some(2), .. }), "{err:?}");
    let err = ChatTemplate::new("{% for %}", SpecialTokens::default()).unwrap_err();
    assert!(matches!(err, TemplateError::Syntax { line: Some(1), .. }), "{err:?}");
}

#[test]
fn trims_blocks_like_transformers() {
    // trim_blocks drops the newline after a block tag, lstrip_blocks the indent before one,
    // and the source's final newline is dropped.
    let source = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}\n";
    let messages = [Message::user("a"), Message::user("b")];
    assert_eq!(render(source, &RenderInput::new(&messages, false)).unwrap(), "a\nb\n");
}

#[test]
fn kwargs_reach_the_template() {
    let source = "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{{ eos_token }}";
    let messages = [Message::user("x")];
    let input = RenderInput::new(&messages, true).with_kwarg("enable_thinking", false);
    assert_eq!(render(source, &input).unwrap(), "<think></think></s>");
    let input = RenderInput::new(&messages, true).with_kwarg("eos_token", "<|end|>");
    assert_eq!(render(source, &input).unwrap(), "<|end|>", "kwargs override special tokens");
}

#[test]
fn absent_tools_are_none_as_in_python() {
    let messages = [Message::user("x")];
    let source = "{{ tools is none }} {{ tools is defined }} {{ tools is iterable }} {{ tools }} {{ tools | tojson }}";
    assert_eq!(render(source, &RenderInput::new(&messages, true)).unwrap(), "True True False None null");
    // Python cannot iterate None; neither do we.
    let err = render("{% for t in tools %}{% endfor %}", &RenderInput::new(&messages, true)).unwrap_err();
    assert!(matches!(err, TemplateError::Render { .. }));
    // But jinja2's filters start with `if value:`, so they yield nothing.
    assert_eq!(render("{{ tools | selectattr('type') | list }}", &RenderInput::new(&messages, true)).unwrap(), "[]");
}

#[test]
fn tools_and_tool_calls_print_like_transformers() {
    let tools = [Tool::function(
        "get_weather",
        Some("Weather <now>".into()),
        Some(json!({"type": "object", "properties": {"city": {"type": "string"}}})),
    )];
    let call = ToolCall::from_json_arguments(Some("c1".into()), "get_weather", r#"{"city": "Zürich", "days": 2}"#);
    let messages = [Message::user("x"), Message::assistant_tool_calls(None, vec![call])];
    let source = "{{ tools[0] | tojson }}\n{{ messages[1].tool_calls[0].function.arguments }}\n\
{{ messages[1].tool_calls[0].function.arguments | tojson(indent=2) }}\n{{ messages[1].content is defined }}";
    let out = render(source, &RenderInput::new(&messages, true).with_tools(&tools)).unwrap();
    assert_eq!(
        out,
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather <now>\", \
\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}\n\
{'city': 'Zürich', 'days': 2}\n{\n  \"city\": \"Zürich\",\n  \"days\": 2\n}\nFalse"
    );
}

#[test]
fn python_string_and_dict_methods() {
    let messages = [Message::user("  <think>a</think>b  ")];
    let source =
        "{% set c = messages[0].content.strip() %}{{ c.split('</think>')[-1] }}|{{ c.startswith('<think>') }}|\
{% for k, v in {'a': 1}.items() %}{{ k }}={{ v }}{% endfor %}|{{ messages[0].get('name', 'anon') }}|{{ 'x'.upper() }}";
    assert_eq!(render(source, &RenderInput::new(&messages, true)).unwrap(), "b|True|a=1|anon|X");
}

#[test]
fn loop_controls() {
    let messages = [Message::user("a"), Message::assistant("b"), Message::user("c")];
    let source = "{% for m in messages %}{% if m.role == 'assistant' %}{% continue %}{% endif %}{{ m.content }}\
{% if loop.index == 3 %}{% break %}{% endif %}{% endfor %}";
    assert_eq!(render(source, &RenderInput::new(&messages, true)).unwrap(), "ac");
}

#[test]
fn strftime_now_uses_the_pinned_clock_or_local_time() {
    let messages = [Message::user("x")];
    let now = chrono::NaiveDate::from_ymd_opt(2024, 7, 26).unwrap().and_hms_opt(9, 5, 0).unwrap();
    let source = "{{ strftime_now('%d %B %Y %H:%M') }}";
    assert_eq!(render(source, &RenderInput::new(&messages, true).at(now)).unwrap(), "26 July 2024 09:05");
    let year = render("{{ strftime_now('%Y') }}", &RenderInput::new(&messages, true)).unwrap();
    assert_eq!(year, chrono::Local::now().format("%Y").to_string());
}

#[test]
fn generation_blocks_render_their_body_in_their_own_scope() {
    let source = "{% set x = 'outer' %}{% for m in messages %}{%- generation -%}{% set x = 'inner' %}{{ m.content }}\
{%- endgeneration -%}{% endfor %}|{{ x }}";
    let messages = [Message::assistant("hi")];
    assert_eq!(render(source, &RenderInput::new(&messages, true)).unwrap(), "hi|outer");
}

#[test]
fn reasoning_is_visible_under_both_names() {
    let messages = [Message::assistant("4").with_reasoning("2+2")];
    let source = "{{ messages[0].reasoning_content }}/{{ messages[0].thinking }}";
    assert_eq!(render(source, &RenderInput::new(&messages, false)).unwrap(), "2+2/2+2");
}

#[test]
fn compiled_templates_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ChatTemplate>();
    assert_send_sync::<llmr_chat_template::ChatTemplates>();
}

#[test]
fn string_filters_read_python_str_of_their_input() {
    use llmr_chat_template::{ContentPart, Role};
    let messages = [Message::with_parts(Role::User, vec![ContentPart::Text { text: "hi".into() }])];
    let source = "{{ messages[0].content | trim }}|{{ messages[0].content | map(attribute='text') | join }}|{{ [1, none] | join(',') }}";
    assert_eq!(
        render(source, &RenderInput::new(&messages, true)).unwrap(),
        "[{'type': 'text', 'text': 'hi'}]|hi|1,None"
    );
}
