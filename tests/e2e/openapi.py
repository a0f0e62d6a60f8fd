"""Validation of raw llmr responses against OpenAI's published schemas.

openapi-subset.json holds, verbatim, the OpenAPI 3.1 component schemas our responses must match
(see make_openapi_subset.py). OpenAPI 3.1 schemas are JSON Schema 2020-12 with a few leftovers
that a JSON Schema validator would silently misread, so they are converted once at load time:

* `nullable: true` is an OpenAPI 3.0 keyword that 3.1 dropped, yet OpenAI's document still uses it
  (CreateChatCompletionStreamResponse: `choices[].finish_reason`, `choices[].logprobs`, `usage`).
  JSON Schema ignores unknown keywords, so left alone `"finish_reason": null` would FAIL
  (`type: string`). Each such schema S becomes `anyOf: [S, {type: null}]` (which also admits null
  past an `enum`). The keyword is only rewritten where a schema can stand (not inside
  `properties` maps, `enum`, `default` or `example` values).
* `discriminator`, `x-*`, `example`, `deprecated` are annotations: JSON Schema ignores them, and
  the `oneOf` they decorate still does the checking.
* `format` (`unixtime`, `float`, `uri`, `date`) is not asserted (no format checker), as in
  OpenAPI tooling; the `type` beside it is.

The OpenAPI document has no schema for a streamed legacy completion chunk: OpenAI streams
`CreateCompletionResponse` objects whose `finish_reason` is null until the last chunk, which the
published schema (a non-nullable string enum) does not admit. `CompletionStreamChunk` is that one
derivation: CreateCompletionResponse with a nullable `choices[].finish_reason`.

Usage: `openapi.validate("CreateChatCompletionResponse", obj)` raises SchemaError listing every
violation with its JSON path.
"""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path

from jsonschema import Draft202012Validator

SUBSET_FILE = Path(__file__).resolve().parent / "openapi-subset.json"

# Keywords whose value is one schema / a list of schemas / a map from names to schemas.
_SCHEMA_KEYS = {"items", "additionalProperties", "not", "contains", "if", "then", "else",
                "propertyNames", "unevaluatedItems", "unevaluatedProperties"}
_SCHEMA_LIST_KEYS = {"anyOf", "oneOf", "allOf", "prefixItems"}
_SCHEMA_MAP_KEYS = {"properties", "patternProperties", "$defs", "dependentSchemas"}


class SchemaError(AssertionError):
    pass


def to_json_schema(schema):
    """One OpenAPI 3.1 schema object -> JSON Schema 2020-12 (see the module docstring)."""
    if not isinstance(schema, dict):
        return schema  # `true` / `false` schemas
    out = {}
    for key, value in schema.items():
        if key == "nullable":
            continue
        if key in _SCHEMA_KEYS:
            out[key] = to_json_schema(value)
        elif key in _SCHEMA_LIST_KEYS:
            out[key] = [to_json_schema(v) for v in value]
        elif key in _SCHEMA_MAP_KEYS:
            out[key] = {name: to_json_schema(v) for name, v in value.items()}
        else:
            out[key] = value  # enum, default, example, description, x-*: data, never rewritten
    if schema.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


@lru_cache(maxsize=1)
def raw_subset() -> dict:
    """The committed subset, as extracted (OpenAPI flavour)."""
    return json.loads(SUBSET_FILE.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def components() -> dict:
    """components.schemas converted to JSON Schema, plus the derived CompletionStreamChunk."""
    schemas = {name: to_json_schema(s) for name, s in raw_subset()["components"]["schemas"].items()}
    chunk = copy.deepcopy(schemas["CreateCompletionResponse"])
    finish = chunk["properties"]["choices"]["items"]["properties"]["finish_reason"]
    chunk["properties"]["choices"]["items"]["properties"]["finish_reason"] = {"anyOf": [finish, {"type": "null"}]}
    chunk["description"] = "llmr tests: a streamed legacy completion chunk (finish_reason null until the end)"
    schemas["CompletionStreamChunk"] = chunk
    return {"schemas": schemas}


def schema_for(name: str, *, convert: bool = True) -> dict:
    """A self-contained root schema for one component (refs resolve inside it).

    convert=False gives the schema exactly as published (for the test that shows why the
    conversion is needed)."""
    comps = components() if convert else raw_subset()["components"]
    if name not in comps["schemas"]:
        raise KeyError(f"no schema {name!r} in {SUBSET_FILE.name}")
    root = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": f"#/components/schemas/{name}",
        "components": comps,
    }
    Draft202012Validator.check_schema(root)
    return root


@lru_cache(maxsize=None)
def validator(name: str, convert: bool = True) -> Draft202012Validator:
    return Draft202012Validator(schema_for(name, convert=convert))


def errors(name: str, obj, *, convert: bool = True) -> list[str]:
    """Every violation, as 'path: message' strings (empty when obj is valid)."""
    out = []
    for err in sorted(validator(name, convert).iter_errors(obj), key=lambda e: list(e.absolute_path)):
        path = "$" + "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in err.absolute_path)
        out.append(f"{path}: {err.message}")
        # anyOf/oneOf failures hide the reason in their sub-errors; surface the deepest ones.
        for sub in sorted(err.context or [], key=lambda e: len(list(e.absolute_path)), reverse=True)[:3]:
            sub_path = "$" + "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in sub.absolute_path)
            out.append(f"    ({sub_path}: {sub.message})")
    return out


def validate(name: str, obj) -> None:
    """Raises SchemaError (an AssertionError) unless obj matches the named schema."""
    problems = errors(name, obj)
    if problems:
        shown = json.dumps(obj)
        if len(shown) > 2000:
            shown = shown[:2000] + "..."
        raise SchemaError(f"response does not match OpenAPI schema {name}:\n  " + "\n  ".join(problems) + f"\nobject: {shown}")
