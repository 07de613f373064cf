"""Structured outputs and forced tool calls: the fields read into one grammar, and what it admits.

Each grammar is compiled by llguidance against the demo's tokenizer (tags spelled as text) and
against the same with Qwen3.5's tags as single tokens (as its tokenizer has them), and fed whole
replies token by token: the ones it must admit end it, the ones it must not are refused.
"""

from __future__ import annotations

from typing import Any

import pytest
import tokenizers

from tfd.demo import ASSETS, ENDOFTEXT, IM_END
from tfd.engine.grammar import GrammarError, Vocabulary
from tfd.server.bad_request import BadRequest
from tfd.server.chat_prompt import Reading
from tfd.server.message_text import message
from tfd.server.structured import Constraint, closed, grammar, read_constraint
from tfd.server.tool_calls import ToolFormat
from tfd.server.tool_fields import read_tools
from tfd.server.tool_grammar import tool_constraint

TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city", "days"],
}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
XML = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\nnorth\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
JSON_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'


def vocabulary(tags: bool) -> Vocabulary:
    tokenizer = tokenizers.Tokenizer.from_file(str(ASSETS / "demo_tokenizer.json"))
    if tags:
        tokenizer.add_tokens([tokenizers.AddedToken(tag, special=False, normalized=False) for tag in TAGS])
    return Vocabulary(tokenizer.to_str(), tokenizer.get_vocab_size(), (IM_END, ENDOFTEXT))


VOCABULARIES = {"text tags": vocabulary(False), "token tags": vocabulary(True)}


def admits(vocabulary: Vocabulary, constraint: Constraint, text: str, inside: bool = False) -> bool:
    """Whether the grammar takes ``text`` and then the end token, and is complete."""
    matcher = vocabulary.compile(grammar(constraint, inside, vocabulary.special)).matcher()
    ids = [*vocabulary.tokenizer.tokenize_str(text), IM_END]
    return bool(matcher.inner.consume_tokens(ids)) and matcher.finished


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": WEATHER}}},
            "response_format.json_schema.schema",
        ),
        ({"guided_json": WEATHER}, "guided_json"),
        ({"guided_json": '{"type": "object"}'}, "guided_json"),
        ({"guided_regex": "[a-z]+"}, "guided_regex"),
        ({"guided_choice": ["yes", "no"]}, "guided_choice"),
        ({"structured_outputs": {"json": WEATHER}}, "structured_outputs.json"),
        ({"structured_outputs": {"json_object": True}}, "structured_outputs.json_object"),
        ({"structured_outputs": {"regex": "a+"}}, "structured_outputs.regex"),
        ({"structured_outputs": {"choice": ["a"]}}, "structured_outputs.choice"),
    ],
)
def test_each_field_is_read_into_a_constraint_named_for_it(fields: dict[str, Any], field: str) -> None:
    found = read_constraint(fields)
    assert found is not None and found.field == field


def test_text_and_nothing_ask_for_no_grammar() -> None:
    assert read_constraint({}) is None and read_constraint({"response_format": {"type": "text"}}) is None
    assert read_constraint({"response_format": None, "guided_json": None}) is None


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "only one of"),
        ({"response_format": {"type": "json_object"}, "guided_json": {}}, "guided_json", "only one of"),
        ({"response_format": {"type": "yaml"}}, "response_format.type", "must be"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "with a name"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": {}, "strict": 1},
                }
            },
            "response_format.json_schema.strict",
            "boolean",
        ),
        ({"guided_json": "{not json"}, "guided_json", "not JSON"),
        ({"guided_json": [1]}, "guided_json", "JSON Schema"),
        ({"guided_regex": ""}, "guided_regex", "non-empty"),
        ({"guided_choice": []}, "guided_choice", "non-empty"),
        ({"guided_choice": ["a", ""]}, "guided_choice", "non-empty"),
        ({"structured_outputs": {"grammar": "x"}}, "structured_outputs.grammar", "not supported"),
        ({"structured_outputs": {"json": {}, "regex": "a"}}, "structured_outputs", "one of"),
    ],
)
def test_a_malformed_or_second_structured_field_is_refused_by_name(
    fields: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(BadRequest) as refused:
        read_constraint(fields)
    assert refused.value.param == param and words in str(refused.value)


def test_strict_closes_every_object_that_says_nothing_and_keeps_what_one_says() -> None:
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "open": {"type": "object", "additionalProperties": True},
            "list": {"type": "array", "items": {"properties": {"y": {}}}},
        },
        "$defs": {"d": {"type": "object"}},
        "enum": [{"type": "object"}],
    }
    found = closed(schema)
    assert found["additionalProperties"] is False
    assert found["properties"]["properties"]["additionalProperties"] is False  # a property named so
    assert (
        "additionalProperties" not in found["properties"]["properties"]["properties"]
    )  # names, not a schema
    assert found["properties"]["open"]["additionalProperties"] is True
    assert found["properties"]["list"]["items"]["additionalProperties"] is False
    assert found["$defs"]["d"]["additionalProperties"] is False and found["enum"] == [{"type": "object"}]
    assert "additionalProperties" not in schema  # a copy


@pytest.mark.parametrize("name", sorted(VOCABULARIES))
def test_a_strict_schema_admits_its_json_laid_out_as_json_dumps_and_nothing_else(name: str) -> None:
    vocabulary = VOCABULARIES[name]
    spec = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "w", "schema": WEATHER, "strict": True},
        }
    }
    strict = read_constraint(spec)
    loose = read_constraint({"guided_json": WEATHER})
    assert strict is not None and loose is not None
    assert admits(vocabulary, strict, '{"city": "Paris", "days": 3}')
    assert admits(vocabulary, strict, '{"city": "Paris", "days": 3, "unit": "c"}')
    assert not admits(vocabulary, strict, '{"city": "Paris", "days": 30}')  # past its maximum
    assert not admits(vocabulary, strict, '{"city":"Paris","days":3}')  # not as json.dumps lays it out
    assert not admits(vocabulary, strict, '{"city": "Paris", "days": 3, "x": 1}')  # strict: closed
    assert admits(vocabulary, loose, '{"city": "Paris", "days": 3, "x": 1}')  # JSON Schema: open


@pytest.mark.parametrize("name", sorted(VOCABULARIES))
def test_a_regex_with_a_slash_and_a_choice_of_literals(name: str) -> None:
    vocabulary = VOCABULARIES[name]
    regex, choice = (
        read_constraint({"guided_regex": r"[a-z]{2}/\d"}),
        read_constraint({"guided_choice": ['say "hi"', "naïve\n"]}),
    )
    assert regex is not None and choice is not None
    assert admits(vocabulary, regex, "ab/1") and not admits(vocabulary, regex, "ab1")
    assert admits(vocabulary, choice, 'say "hi"') and admits(vocabulary, choice, "naïve\n")
    assert not admits(vocabulary, choice, "say hi")


@pytest.mark.parametrize("name", sorted(VOCABULARIES))
def test_a_thinking_reply_thinks_freely_then_follows_the_grammar(name: str) -> None:
    vocabulary = VOCABULARIES[name]
    choice = read_constraint({"guided_choice": ["yes", "no"]})
    assert choice is not None
    assert admits(vocabulary, choice, "Let me think.\nYes.\n</think>\n\nyes", inside=True)
    assert admits(vocabulary, choice, "</think>\n\nno", inside=True)
    assert not admits(vocabulary, choice, "Let me think.\n</think>\n\nmaybe", inside=True)
    assert not admits(vocabulary, choice, "yes", inside=True)  # the thought must close first


def test_a_schema_llguidance_lacks_does_not_compile() -> None:
    found = read_constraint({"guided_json": {"type": "array", "uniqueItems": True}})
    assert found is not None
    with pytest.raises(GrammarError):
        VOCABULARIES["text tags"].compile(grammar(found, False, VOCABULARIES["text tags"].special))


def tools(choice: Any, parallel: bool = True) -> Any:
    return read_tools(
        {
            "tools": [TOOL, {"type": "function", "function": {"name": "now"}}],
            "tool_choice": choice,
            "parallel_tool_calls": parallel,
        }
    )


@pytest.mark.parametrize("name", sorted(VOCABULARIES))
@pytest.mark.parametrize(("fmt", "call"), [(ToolFormat.XML, XML), (ToolFormat.JSON, JSON_CALL)])
def test_forced_calls_in_the_templates_format(name: str, fmt: ToolFormat, call: str) -> None:
    vocabulary = VOCABULARIES[name]
    required = tool_constraint(tools("required"), fmt, vocabulary.special)
    single = tool_constraint(tools("required", parallel=False), fmt, vocabulary.special)
    named = tool_constraint(tools({"type": "function", "function": {"name": "now"}}), fmt, vocabulary.special)
    assert required is not None and single is not None and named is not None
    assert admits(vocabulary, required, call) and admits(vocabulary, required, f"{call}\n{call}")
    assert admits(vocabulary, single, call) and not admits(vocabulary, single, f"{call}\n{call}")
    assert not admits(vocabulary, named, call)  # get_weather is not the named function
    assert not admits(vocabulary, required, call.replace("3", "30"))  # days past its maximum
    assert not admits(vocabulary, required, "I would rather talk.")
    assert admits(vocabulary, required, f"Hmm.\n</think>\n\n{call}", inside=True)


@pytest.mark.parametrize("name", sorted(VOCABULARIES))
def test_auto_with_one_call_at_most_is_free_text_then_a_call_or_none(name: str) -> None:
    vocabulary = VOCABULARIES[name]
    one = tool_constraint(tools("auto", parallel=False), ToolFormat.XML, vocabulary.special)
    assert one is not None and tool_constraint(tools("auto"), ToolFormat.XML, vocabulary.special) is None
    assert admits(vocabulary, one, "Just an answer, <b>bold</b>.")
    assert admits(vocabulary, one, f"Let me look.\n\n{XML}") and admits(vocabulary, one, XML)
    assert not admits(vocabulary, one, f"{XML}\n{XML}")
    assert not admits(vocabulary, one, f"{XML} and more text")


def test_a_thought_then_a_call_reads_into_the_message() -> None:
    functions = read_tools({"tools": [TOOL]})
    reading = Reading(True, functions, ToolFormat.XML)
    found, called = message(f"Weather needs a call.\n</think>\n\n{XML}", reading, lambda i: f"call-{i}")
    assert called and found["reasoning_content"] == "Weather needs a call." and found["content"] is None
    assert found["tool_calls"] == [
        {
            "id": "call-0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris\\nnorth", "days": 3}'},
        }
    ]
    unknown, called = message(
        XML.replace("get_weather", "get_rain"),
        Reading(False, functions, ToolFormat.XML),
        lambda i: f"call-{i}",
    )
    assert not called and unknown["content"] == XML.replace("get_weather", "get_rain")


def test_a_string_that_may_be_null_is_written_raw_and_read_back_as_text() -> None:
    for city in ({"type": ["string", "null"]}, {"anyOf": [{"type": "string"}, {"type": "null"}]}):
        schema = {"type": "object", "properties": {"city": city}, "required": ["city"]}
        functions = read_tools(
            {
                "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": schema}}],
                "tool_choice": "required",
            }
        )
        text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                "</function>\n</tool_call>")
        for vocabulary in VOCABULARIES.values():
            forced = tool_constraint(functions, ToolFormat.XML, vocabulary.special)
            assert forced is not None and admits(vocabulary, forced, text)
            assert not admits(vocabulary, forced, text.replace("Paris", '"Paris"') + "x")
        found, _ = message(text, Reading(None, functions, ToolFormat.XML), lambda i: f"c{i}")
        assert found["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


def test_parameters_with_local_references_are_inlined_and_a_loop_is_refused_by_name() -> None:
    parameters = {
        "type": "object",
        "properties": {"unit": {"$ref": "#/$defs/Unit"}, "days": {"type": "integer"}},
        "required": ["unit", "days"],
        "$defs": {"Unit": {"enum": ["c", "f"]}},
    }
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": parameters}}
    functions = read_tools({"tools": [tool], "tool_choice": "required"})
    assert functions.functions["get_weather"]["properties"]["unit"] == {"enum": ["c", "f"]}
    vocabulary = VOCABULARIES["token tags"]
    for fmt, call in (
        (ToolFormat.JSON, '{"name": "get_weather", "arguments": {"unit": "c", "days": 2}}'),
        (
            ToolFormat.XML,
            "<function=get_weather>\n<parameter=unit>\nc\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n</function>",
        ),
    ):
        forced = tool_constraint(functions, fmt, vocabulary.special)
        assert forced is not None and admits(vocabulary, forced, f"<tool_call>\n{call}\n</tool_call>")
    looping = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}},
        "$defs": {"A": {"$ref": "#/$defs/A"}},
    }
    for bad, words in (
        (looping, "loops"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/B"}}}, "names nothing"),
        ({"type": "object", "properties": ["a"]}, "properties an object"),
    ):
        with pytest.raises(BadRequest) as refused:
            read_tools({"tools": [{"type": "function", "function": {"name": "f", "parameters": bad}}]})
        assert refused.value.param == "tools[0].function.parameters" and words in str(refused.value)


def test_x_guidance_that_is_not_an_object_is_refused_by_name() -> None:
    with pytest.raises(BadRequest) as refused:
        read_constraint({"guided_json": {"type": "object", "x-guidance": 3}})
    assert refused.value.param == "guided_json"


@pytest.mark.parametrize("name", sorted(VOCABULARIES))
def test_a_strict_function_under_auto_is_free_text_or_a_valid_closed_call(name: str) -> None:
    vocabulary = VOCABULARIES[name]
    strict = read_tools({"tools": [{**TOOL, "function": {**TOOL["function"], "strict": True}}]})
    loose = read_tools({"tools": [TOOL]})
    assert tool_constraint(loose, ToolFormat.JSON, vocabulary.special) is None  # the model is free
    ruled = tool_constraint(strict, ToolFormat.JSON, vocabulary.special)
    assert ruled is not None and ruled.field == "tools"
    assert admits(vocabulary, ruled, "No call needed.") and admits(
        vocabulary, ruled, f"Looking.\n\n{JSON_CALL}"
    )
    assert admits(vocabulary, ruled, f"{JSON_CALL}\n{JSON_CALL}")  # parallel: several
    assert not admits(vocabulary, ruled, JSON_CALL.replace("3}}", '3, "x": 1}}'))  # closed: no other key
    assert not admits(vocabulary, ruled, JSON_CALL.replace("3", "30"))


@pytest.mark.parametrize("name", sorted(VOCABULARIES))
def test_a_structured_output_beside_tools_the_model_may_call_is_the_answer_or_calls(name: str) -> None:
    vocabulary = VOCABULARIES[name]
    answer = read_constraint({"guided_choice": ["sunny", "rainy"]})
    assert answer is not None
    either = tool_constraint(read_tools({"tools": [TOOL]}), ToolFormat.XML, vocabulary.special, answer)
    assert either is not None and either.field == "guided_choice"
    assert admits(vocabulary, either, "sunny") and admits(vocabulary, either, XML)
    assert not admits(vocabulary, either, "cloudy") and not admits(vocabulary, either, f"sunny{XML}")
