"""The official OpenAI Python SDK's Responses API (`client.responses`) against `/v1/responses`, on
`llmr serve` and on `llmr router` with a node: answers and streams checked against OpenAI's
published schemas, stored responses with `previous_response_id`, retrieve, input items, delete,
tools and structured output."""

from __future__ import annotations

import json

import jsonschema
import openai
import pydantic
import pytest

import openapi

MODEL = "qwen"

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(params=["serve", "router"])
def api(request):
    return request.getfixturevalue("server" if request.param == "serve" else "cluster")


@pytest.fixture
def oai(api) -> openai.OpenAI:
    return api.client()


def sse_events(text: str) -> list[dict]:
    out = []
    for block in text.split("\n\n"):
        if block.strip():
            head, data = block.split("\n", 1)
            event = json.loads(data.removeprefix("data: "))
            assert head == f"event: {event['type']}", "the SSE event name is the event's type"
            out.append(event)
    return out


def test_a_response_matches_openais_schema(api, oai):
    r = oai.responses.create(
        model=MODEL, input="What is the capital of France?", instructions="Answer in one short sentence.",
        max_output_tokens=30, temperature=0,
    )
    assert r.id.startswith("resp_") and r.status == "completed" and r.store
    assert "Paris" in r.output_text
    assert r.usage.input_tokens > 10 and 0 < r.usage.output_tokens <= 30
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    raw = api.post("/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 5})
    openapi.validate("Response", raw.json())


def test_a_cut_answer_is_incomplete(oai):
    r = oai.responses.create(model=MODEL, input="Write a long story about a ship.", max_output_tokens=4)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 4


def test_previous_response_id_continues_the_conversation(oai):
    first = oai.responses.create(
        model=MODEL, input="My name is Ada Lovelace. Remember it.", max_output_tokens=20, temperature=0
    )
    second = oai.responses.create(
        model=MODEL, previous_response_id=first.id, input="What is my name? Answer with the name only.",
        max_output_tokens=10, temperature=0,
    )
    assert second.previous_response_id == first.id
    assert "Ada" in second.output_text, second.output_text
    # The stored conversation: the first input, the first answer, the new input (oldest first).
    items = oai.responses.input_items.list(second.id, order="asc").data
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant"), ("message", "user")]
    assert items[0].content[0].text.startswith("My name is Ada")
    assert items[1].content[0].text == first.output_text
    newest_first = oai.responses.input_items.list(second.id).data
    assert [i.id for i in newest_first] == [i.id for i in reversed(items)]
    assert oai.responses.retrieve(second.id).output_text == second.output_text


def test_a_streamed_response_is_typed_and_stored(api, oai):
    raw = api.post("/v1/responses", {"model": MODEL, "input": "Count to five.", "max_output_tokens": 30, "stream": True})
    events = sse_events(raw.content.decode("utf-8"))
    for e in events:
        openapi.validate("ResponseStreamEvent", e)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] in ("response.completed", "response.incomplete")
    final = events[-1]["response"]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas and deltas == final["output"][0]["content"][0]["text"]
    # Stored once its last event passed the router.
    stored = oai.responses.retrieve(final["id"])
    assert stored.output_text == deltas and stored.status == final["status"]

    # Greedy and with room: the SDK's final response needs `response.completed`, and a sampled
    # greeting once ran past 20 tokens (`response.incomplete`) in a CI rehearsal.
    with oai.responses.stream(model=MODEL, input="Say hello.", max_output_tokens=80, temperature=0.0) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        done = stream.get_final_response()
    assert "".join(texts) == done.output_text


def test_forced_function_call_and_its_output(api, oai):
    # One call (with parallel calls allowed, a hot Qwen sometimes calls for ten more cities).
    r = oai.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
        parallel_tool_calls=False, temperature=0,
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER["parameters"])
    follow = oai.responses.create(
        model=MODEL,
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "21 degrees and sunny"}],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=40,
        temperature=0,
    )
    assert follow.status in ("completed", "incomplete") and follow.output, follow
    items = oai.responses.input_items.list(follow.id, order="asc").data
    assert [i.type for i in items] == ["message", "function_call", "function_call_output"]
    openapi.validate("ResponseItemList", api.get(f"/v1/responses/{follow.id}/input_items").json())

    with oai.responses.stream(
        model=MODEL, input="Weather in Rome?", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
    ) as stream:
        final = stream.get_final_response()
    call = [o for o in final.output if o.type == "function_call"][0]
    assert json.loads(call.arguments)["city"].lower().startswith("rom"), call.arguments


class Person(pydantic.BaseModel):
    name: str
    age: int


def test_structured_output_parses(oai):
    # Greedy: sampled at the default temperature, the model once wrote an age of endless zeros
    # until the token limit cut the (schema-valid so far) JSON.
    r = oai.responses.parse(model=MODEL, input="Invent a person: a name and an age.", text_format=Person,
                            max_output_tokens=60, temperature=0)
    assert isinstance(r.output_parsed, Person)


def test_store_false_and_delete(oai):
    r = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=3, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    kept = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=3)
    oai.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError) as e:
        oai.responses.create(model=MODEL, input="Hi", previous_response_id=kept.id)
    assert e.value.body["param"] == "previous_response_id"


def test_bad_requests_name_the_field(oai):
    cases = [
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}}}}}, "text.format.schema"),
    ]
    for extra, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            oai.responses.create(model=MODEL, **extra)
        assert e.value.body["param"] == param, e.value.body


def test_a_response_is_visible_only_to_the_key_that_made_it(cluster):
    mine = cluster.client().responses.create(model=MODEL, input="Hi", max_output_tokens=3)
    other = openai.OpenAI(base_url=cluster.base_url + "/v1", api_key=cluster.admin_key, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.create(model=MODEL, input="Hi", previous_response_id=mine.id)

