//! From a validated chat request to the prompt an engine reads: the wire's messages and tools
//! become the chat template's own input (the `openai` crate does not know templates, the template
//! crate does not know the wire), the model's template renders them, and a request that offers
//! tools learns how to read calls back out of the answer.

use crate::answer::Reading;
use crate::error::NodeError;
use crate::generation::Prompt;
use crate::models::LoadedModel;
use crate::thinking_budget::ThinkingBudget;
use llmr_chat_template::{Content, ContentPart, ImageUrl, Message, RenderInput, Role, Tool, ToolCall};
use llmr_engine_host::{Capability, Constraint};
use llmr_openai::{ChatMessage, ChatRequest, FunctionTool, MessageContent, MessagePart, ToolChoice};
use llmr_tool_calls::{AnswerGrammar, ReasoningFormat, StreamParser, ToolCallFormat, ToolSchema};

/// How tool calls are read from a request's output.
#[derive(Clone, Debug)]
pub struct ToolParsing {
    pub format: ToolCallFormat,
    /// The names of the functions the request offered.
    pub allowed: Vec<String>,
    /// Text the prompt ends with to force a call (`tool_choice` required or named).
    pub prefill: String,
}

impl ToolParsing {
    /// Reads calls out of a streamed answer.
    pub fn stream_parser(&self) -> StreamParser {
        StreamParser::new(self.format, self.allowed.clone()).with_prefill(&self.prefill)
    }
}

/// The prompt for `req`, and how to read its answer: a reasoning model's thinking (when its
/// template has it), tool calls (when tools are offered). Under a constraint, a model that thinks
/// is let think first: the constraint holds the answer after its thinking.
pub fn render_chat(model: &LoadedModel, req: &ChatRequest) -> Result<(Prompt, Reading), NodeError> {
    model.require(Capability::Text)?;
    let templates =
        model.templates.as_ref().ok_or(NodeError::Incapable { model: model.name.clone(), needs: Capability::Text })?;
    let offer_tools = !req.tools.is_empty() && req.tool_choice != ToolChoice::None;
    // A conversation continued from the assistant's own text: the turn before it is rendered
    // with the generation prompt, and that text follows.
    let (history, continued) = match req.messages.split_last() {
        Some((last, rest)) if req.continue_final_message && last.role == llmr_openai::Role::Assistant => {
            (rest, Some(content_text(last)))
        }
        _ => (&req.messages[..], None),
    };
    let messages: Vec<Message> = history.iter().map(template_message).collect();
    let tools: Vec<Tool> = req.tools.iter().map(template_tool).collect();
    let mut input = RenderInput::new(&messages, req.add_generation_prompt || continued.is_some());
    if offer_tools {
        input = input.with_tools(&tools);
    }
    input.kwargs.extend(req.template_kwargs.clone());
    let mut text = templates.render(&input).map_err(|e| NodeError::Template(e.to_string()))?;
    text.push_str(continued.as_deref().unwrap_or_default());
    // Harmony is read from the control tokens the engine writes as text; an engine that cannot
    // write them gives an answer read as it is.
    let reasoning = ReasoningFormat::detect(templates.select(offer_tools).source())
        .filter(|f| !f.is_harmony() || model.engine.writes_special())
        .map(|f| (f, f.starts_inside(&text)));
    let special_text = reasoning.is_some_and(|(f, _)| f.is_harmony());
    // Under a `response_format` the answer is the document its schema describes: read as a tool
    // call, a JSON answer that happens to look like one would be lost to the client.
    if !offer_tools || req.sampling.constraint.is_some() {
        let mut prompt = Prompt::rendered(text);
        prompt.special_text = special_text;
        prompt.constraint = match (&req.sampling.constraint, reasoning) {
            // A client's own Lark grammar says itself what comes first.
            (Some(c), Some((format, inside))) if !matches!(c, Constraint::Lark(_)) => {
                after_thinking(c, format, inside).map(|c| (c, req.constraint_param))
            }
            _ => None,
        };
        let answer_constraint = prompt.constraint.is_some().then(|| req.sampling.constraint.clone()).flatten();
        prompt.thinking_budget = thinking_budget(req, reasoning, answer_constraint);
        return Ok((prompt, Reading { tools: None, reasoning }));
    }
    let template = templates.select(true);
    let architecture = model.engine.info().architecture.as_deref().unwrap_or_default();
    let format = match ToolCallFormat::detect(Some(template.source()), architecture) {
        ToolCallFormat::Harmony if !special_text => ToolCallFormat::PlainJson,
        format => format,
    };
    let forced = match &req.tool_choice {
        ToolChoice::Required => Some(None),
        ToolChoice::Function(name) => Some(Some(name.as_str())),
        ToolChoice::Auto | ToolChoice::None => None,
    };
    // A forced call is decoded under its grammar where the engine can (the call always parses
    // and its arguments match the tool's schema); else the prompt ends inside the call's opening.
    // Under `auto`, strict tools' calls are held to their schemas wherever the model opens one.
    let schemas: Vec<ToolSchema<'_>> =
        req.tools.iter().map(|t| ToolSchema { name: &t.name, parameters: t.parameters.as_ref() }).collect();
    let strict_schemas: Vec<ToolSchema<'_>> = req
        .tools
        .iter()
        .map(|t| ToolSchema { name: &t.name, parameters: t.parameters.as_ref().filter(|_| t.strict) })
        .collect();
    let strict_auto = req.tool_choice == ToolChoice::Auto && req.tools.iter().any(|t| t.strict);
    let grammar = match forced {
        // A named function is called once (as OpenAI does); `required` may call several.
        Some(function) => format.forced_call_grammar(&schemas, function, function.is_none() && req.parallel_tool_calls),
        None if strict_auto => format.auto_call_grammar(&strict_schemas, req.parallel_tool_calls),
        None => None,
    }
    .filter(|_| model.engine.constrains());
    let prefill = match (grammar.is_some(), forced) {
        (false, Some(function)) => format.forced_prefix(function),
        _ => String::new(),
    };
    text.push_str(&prefill);
    let allowed = req.tools.iter().map(|t| t.name.clone()).collect();
    let mut prompt = Prompt::rendered(text);
    prompt.special_text = special_text;
    let answer_constraint = grammar.clone().map(Constraint::Lark);
    prompt.thinking_budget = thinking_budget(req, reasoning, answer_constraint);
    prompt.constraint = grammar.map(|g| {
        let g = Constraint::Lark(g);
        let g = match reasoning {
            Some((format, inside)) => after_thinking(&g, format, inside).unwrap_or(g),
            None => g,
        };
        (g, "tools")
    });
    Ok((prompt, Reading { tools: Some(ToolParsing { format, allowed, prefill }), reasoning }))
}

/// The request's thinking budget, for a model that thinks; `answer_constraint` holds the answer
/// once the thinking is closed for it.
fn thinking_budget(
    req: &ChatRequest,
    reasoning: Option<(ReasoningFormat, bool)>,
    answer_constraint: Option<Constraint>,
) -> Option<ThinkingBudget> {
    let (format, inside) = reasoning?;
    Some(ThinkingBudget {
        tokens: req.thinking_budget?,
        open: format.open,
        close: format.close,
        // A call's grammar (the only Lark held after thinking) writes its own message header.
        resume: match &answer_constraint {
            Some(Constraint::Lark(_)) => format.resume_for_calls(),
            _ => format.resume,
        },
        inside,
        answer_constraint,
    })
}

/// `constraint` held until the model's thinking is over (`None` for a Lark grammar that does not
/// begin with its `start` rule).
fn after_thinking(constraint: &Constraint, format: ReasoningFormat, inside: bool) -> Option<Constraint> {
    let answer = match constraint {
        Constraint::JsonSchema(schema) => AnswerGrammar::JsonSchema(schema),
        Constraint::Regex(regex) => AnswerGrammar::Regex(regex),
        Constraint::Lark(grammar) => AnswerGrammar::Lark(grammar),
    };
    format.then(inside, answer).map(Constraint::Lark)
}

fn template_role(role: llmr_openai::Role) -> Role {
    match role {
        llmr_openai::Role::System => Role::System,
        llmr_openai::Role::Developer => Role::Developer,
        llmr_openai::Role::User => Role::User,
        llmr_openai::Role::Assistant => Role::Assistant,
        llmr_openai::Role::Tool => Role::Tool,
    }
}

/// The text of a message's content (its text parts, joined).
fn content_text(m: &ChatMessage) -> String {
    match &m.content {
        None => String::new(),
        Some(MessageContent::Text(t)) => t.clone(),
        Some(MessageContent::Parts(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                MessagePart::Text { text } => Some(text.as_str()),
                MessagePart::ImageUrl { .. } => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// A wire message as the templates see it. Tool-call arguments arrive as a JSON text and are
/// handed to templates as an object (transformers' convention; many templates `tojson` them).
fn template_message(m: &ChatMessage) -> Message {
    let content = m.content.as_ref().map(|c| match c {
        MessageContent::Text(t) => Content::Text(t.clone()),
        MessageContent::Parts(parts) => Content::Parts(
            parts
                .iter()
                .map(|p| match p {
                    MessagePart::Text { text } => ContentPart::Text { text: text.clone() },
                    MessagePart::ImageUrl { image_url } => {
                        ContentPart::ImageUrl { image_url: ImageUrl { url: image_url.url.clone() } }
                    }
                })
                .collect(),
        ),
    });
    let tool_calls = m
        .tool_calls
        .iter()
        .map(|c| ToolCall::from_json_arguments(Some(c.id.clone()), c.function.name.clone(), &c.function.arguments))
        .collect();
    Message {
        role: template_role(m.role),
        content,
        reasoning_content: m.reasoning_content.clone(),
        tool_calls,
        tool_call_id: m.tool_call_id.clone(),
        name: m.name.clone(),
    }
}

fn template_tool(t: &FunctionTool) -> Tool {
    Tool::function(t.name.clone(), t.description.clone(), t.parameters.clone())
}
