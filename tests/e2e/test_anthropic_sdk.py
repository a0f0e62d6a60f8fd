"""The official Anthropic Python SDK against `/v1/messages`, unchanged, on `llmr serve` and on
`llmr router` with a node: answers, streams, tools and tool results, structured output, token
counts, prefill, and errors in Anthropic's shape."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest

MODEL = "qwen"  # follows tool instructions better than SmolLM2-135M

WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    },
}


@pytest.fixture(params=["serve", "router"])
def api(request):
    """The same tests on `llmr serve` and through `llmr router` to a node."""
    return request.getfixturevalue("server" if request.param == "serve" else "cluster")


@pytest.fixture
def claude(api) -> anthropic.Anthropic:
    return api.anthropic()


def test_message(claude):
    m = claude.messages.create(
        model=MODEL,
        max_tokens=32,
        system="Answer in one short sentence.",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        extra_body={"temperature": 0.0},  # the SDK dropped the parameter; the API still reads it
    )
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.model == MODEL
    assert [b.type for b in m.content] == ["text"]
    assert "Paris" in m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens > 10 and 0 < m.usage.output_tokens <= 32


def test_max_tokens_is_the_stop_reason_when_cut(claude):
    m = claude.messages.create(
        model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "Write a long story about a ship."}]
    )
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3


def test_a_stop_sequence_ends_the_message_and_is_named(claude):
    # A space: the greedy English sentence meets it. (Sampled, a 135M model sometimes answers in
    # Chinese, which has no spaces: seen once in CI.)
    kw = dict(model=MODEL, max_tokens=32, stop_sequences=["\n\n\n", " "],
              messages=[{"role": "user", "content": "Write a sentence about cats."}],
              extra_body={"temperature": 0.0})  # the SDK dropped the parameter; the API still reads it
    m = claude.messages.create(**kw)
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", " "), m
    assert all(" " not in b.text for b in m.content), m.content
    with claude.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", " "), final


def test_stream(claude):
    # Greedy: sampled at temperature 1, a 135M model once answered "Six" and stopped (one piece;
    # seen in CI).
    with claude.messages.stream(
        model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "Count from one to five in words."}],
        extra_body={"temperature": 0.0},  # the SDK dropped the parameter; the API still reads it
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "content_block_stop" in kinds and "message_delta" in kinds
    texts = [e.delta.text for e in events if e.type == "content_block_delta"]
    assert len(texts) > 1, "text arrives in pieces"
    assert "".join(texts) == final.content[0].text
    start = events[0].message
    assert start.usage.input_tokens == final.usage.input_tokens > 0
    assert final.usage.output_tokens > 0 and final.stop_reason in ("end_turn", "max_tokens")


def test_count_tokens_matches_the_prompt_a_message_reads(claude):
    messages = [{"role": "user", "content": "Name three colours."}]
    counted = claude.messages.count_tokens(model=MODEL, system="Be brief.", messages=messages, tools=[WEATHER])
    m = claude.messages.create(model=MODEL, max_tokens=1, system="Be brief.", messages=messages, tools=[WEATHER])
    assert counted.input_tokens == m.usage.input_tokens > 0
    without_tools = claude.messages.count_tokens(model=MODEL, system="Be brief.", messages=messages)
    assert without_tools.input_tokens < counted.input_tokens, "tool definitions are part of the prompt"


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_forced_tool_use_and_its_result(claude, choice):
    question = {"role": "user", "content": "What is the weather in Paris?"}
    # Greedy on both turns: a sampled first call sometimes led SmolLM2 to answer the tool result with
    # another call written as text (2 runs of 127 in one CI rehearsal).
    m = claude.messages.create(
        model=MODEL,
        max_tokens=80,
        tools=[WEATHER],
        tool_choice=choice,
        messages=[question],
        extra_body={"temperature": 0.0},
    )
    assert m.stop_reason == "tool_use"
    calls = [b for b in m.content if b.type == "tool_use"]
    assert len(calls) >= 1 and calls[0].name == "get_weather" and calls[0].id.startswith("toolu_")
    jsonschema.validate(calls[0].input, WEATHER["input_schema"])
    # The SDK sends the assistant's blocks back as they came, then the tool's answer.
    answer = claude.messages.create(
        model=MODEL,
        max_tokens=40,
        tools=[WEATHER],
        tool_choice={"type": "none"},
        messages=[
            question,
            {"role": "assistant", "content": m.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "21 degrees and sunny"}],
            },
        ],
        extra_body={"temperature": 0.0},  # the SDK dropped the parameter; the API still reads it
    )
    assert answer.content and answer.content[0].type == "text"
    assert not [b for b in answer.content if b.type == "tool_use"], "tool_choice none makes no call"
    text = answer.content[0].text.lower()
    assert any(w in text for w in ("21", "twenty-one", "twenty one", "sunny")), text  # the result reached the model


def test_streamed_tool_use_accumulates_its_input(claude):
    with claude.messages.stream(
        model=MODEL,
        max_tokens=80,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Rome, in celsius?"}],
        # Greedy, as the other tool tests: sampled, SmolLM2 once wrote the city as " Rome".
        extra_body={"temperature": 0.0},
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    call = [b for b in final.content if b.type == "tool_use"][0]
    jsonschema.validate(call.input, WEATHER["input_schema"])
    assert call.input["city"].lower().startswith("rom"), call.input  # Rome, or Roma


def test_output_config_schema(claude):
    schema = {
        "type": "object",
        # A bounded name: sampled freely, SmolLM2 once wrote a name past 80 tokens (a `max_tokens`
        # stop, not the grammar's end, in one CI run of many).
        "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    m = claude.messages.create(
        model=MODEL,
        max_tokens=200,
        messages=[{"role": "user", "content": "Invent a person."}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert m.stop_reason == "end_turn"
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_a_final_assistant_turn_is_continued(claude):
    m = claude.messages.create(
        model=MODEL,
        max_tokens=6,
        extra_body={"temperature": 0.0},  # the SDK dropped the parameter; the API still reads it
        messages=[
            {"role": "user", "content": "Count from 1 to 10, separated by commas."},
            {"role": "assistant", "content": "1, 2, 3, 4, 5, 6,"},
        ],
    )
    # The answer continues the list; a new turn would start again from 1.
    assert m.content[0].text.lstrip().startswith("7"), m.content[0].text


def test_errors_have_anthropics_shape(api, claude):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(
            model=MODEL,
            max_tokens=5,
            messages=[{"role": "user", "content": [{"type": "video", "url": "x"}]}],
        )
    assert e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert e.value.body["error"]["message"].startswith("messages[0].content[0].type")
    assert e.value.request_id, "the request id is sent as `request-id`"
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["error"]["type"] == "not_found_error"
    wrong = anthropic.Anthropic(base_url=api.base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as e:
        wrong.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["error"]["type"] == "authentication_error"
    # `max_tokens` is required by the API (the SDK's types say so; a raw request shows the 400).
    r = api.post("/v1/messages", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens")
