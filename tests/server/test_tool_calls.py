"""Tool calls read from a reply's text: whole (parse_tool_calls) and streamed (ToolCallStream)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfd.server.tool_calls import Delta, ToolCall, ToolCallStream, ToolFormat, parse_tool_calls, tool_format

XML, JSON = ToolFormat.XML, ToolFormat.JSON
ASSETS = Path(__file__).resolve().parent.parent / "assets"
TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": {"type": "object",
                    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
    "get_time": {},
    "typed": {"type": "object", "properties": {
        "text": {"type": "string"}, "count": {"type": "integer"}, "ratio": {"type": "number"},
        "flag": {"type": "boolean"}, "nothing": {"type": "null"}, "options": {"type": "object"},
        "items": {"type": "array"}, "either": {"type": ["integer", "string"]},
        "maybe": {"type": ["integer", "null"]}, "odd": {"type": "decimal"}, "untyped": {}}},
}


def call_id(index: int) -> str:
    return f"call_{index}"


def xml_call(name: str, **parameters: str) -> str:
    """A call as the Qwen3.5 template teaches the model to write it."""
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def json_call(body: object) -> str:
    return f"<tool_call>\n{json.dumps(body)}\n</tool_call>"


def parse(text: str, fmt: ToolFormat = XML) -> tuple[str, tuple[ToolCall, ...]]:
    return parse_tool_calls(text, fmt, TOOLS, call_id)


def arguments(text: str, fmt: ToolFormat = XML) -> dict[str, Any]:
    """The arguments of the one call in ``text``."""
    _, calls = parse(text, fmt)
    assert len(calls) == 1
    return json.loads(calls[0].arguments)  # type: ignore[no-any-return]


@attrs.frozen
class Streamed:
    """What a client of the stream sees."""

    deltas: list[Delta]
    calls: tuple[ToolCall, ...]

    @property
    def content(self) -> str:
        return "".join(delta.content for delta in self.deltas if delta.content is not None)

    @property
    def items(self) -> list[dict[str, Any]]:
        return [delta.tool_call for delta in self.deltas if delta.tool_call is not None]

    def joined(self) -> list[ToolCall]:
        """The calls as a client rebuilds them from the deltas."""
        made: dict[int, dict[str, Any]] = {}
        for item in self.items:
            call = made.setdefault(item["index"], {"id": item.get("id"), "name": "", "arguments": ""})
            call["name"] += item["function"].get("name", "")
            call["arguments"] += item["function"]["arguments"]
        return [ToolCall(**made[index]) for index in sorted(made)]


def stream(pieces: Sequence[str], fmt: ToolFormat = XML) -> Streamed:
    reader = ToolCallStream(fmt, TOOLS, call_id)
    deltas = [delta for piece in pieces for delta in reader.feed(piece)] + reader.finish()
    return Streamed(deltas, reader.calls)


def test_format_follows_the_template() -> None:
    assert tool_format((ASSETS / "qwen3_5_chat_template.jinja").read_text()) is XML
    assert tool_format("{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}") is XML
    assert tool_format('<tool_call>\\n{"name": <function-name>, "arguments": <args>}\\n</tool_call>') is JSON
    assert tool_format("{{ message.content }}") is None


def test_call_as_openai_item() -> None:
    call = ToolCall("call_0", "get_time", "{}")
    function = {"name": "get_time", "arguments": "{}"}
    assert call.openai() == {"id": "call_0", "type": "function", "function": function}
    assert call.openai(2) == {"index": 2, "id": "call_0", "type": "function", "function": function}


def test_text_without_calls_is_unchanged() -> None:
    for text in ("", "Hello.\n\n", "a < b and <tool_call is not a tag", "</tool_call> alone"):
        assert parse(text) == (text, ())
        assert parse(text, JSON) == (text, ())


def test_xml_call_and_the_text_before_it() -> None:
    text = "Let me look.\n\n" + xml_call("get_weather", city="Paris", days="3") + "\n"
    called = ToolCall("call_0", "get_weather", '{"city": "Paris", "days": 3}')
    assert parse(text) == ("Let me look.", (called,))


def test_two_calls_leave_no_whitespace() -> None:
    text = xml_call("get_weather", city="Paris") + "\n\n" + xml_call("get_time") + "\n  "
    content, calls = parse(text)
    assert content == ""
    assert calls == (ToolCall("call_0", "get_weather", '{"city": "Paris"}'),
                     ToolCall("call_1", "get_time", "{}"))


def test_text_after_a_call_is_kept() -> None:
    assert parse("Hi\n" + xml_call("get_time") + "\nDone.\n")[0] == "Hi\nDone.\n"


def test_unknown_tool_stays_text() -> None:
    unknown = xml_call("launch", target="moon")
    assert parse("Sure.\n" + unknown) == ("Sure.\n" + unknown, ())
    content, calls = parse(unknown + "\n" + xml_call("get_time"))
    assert (content, [call.name for call in calls]) == (unknown, ["get_time"])


def test_ids_count_valid_calls_only() -> None:
    text = xml_call("get_time") + xml_call("launch") + xml_call("get_weather", city="Oslo")
    assert [call.id for call in parse(text)[1]] == ["call_0", "call_1"]


@pytest.mark.parametrize("block", [
    "<tool_call>\nI will call get_time\n</tool_call>",  # no function header
    "<tool_call>\n<function=get_time\n</tool_call>",  # header never closed
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n",  # call never closed
    "<tool_call>\n<function=get_time>\n</function>\n",  # call never closed
])
def test_malformed_xml_stays_text(block: str) -> None:
    assert parse("Text.\n" + block) == ("Text.\n" + block, ())


def test_parameter_never_closed_is_left_out() -> None:
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
            "<parameter=days>\n2\n</tool_call>")
    assert arguments(text) == {"city": "Rome"}


def test_call_without_function_end() -> None:
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</tool_call>"
    assert arguments(text) == {"city": "Rome"}


def test_repeated_parameter_keeps_its_first_value() -> None:
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
            "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>")
    assert arguments(text) == {"city": "Rome"}


@pytest.mark.parametrize(("key", "written", "value"), [
    ("text", "42", "42"),
    ("text", '{"a": 1}', '{"a": 1}'),
    ("count", "42", 42),
    ("count", "forty-two", "forty-two"),
    ("count", "4.5", "4.5"),
    ("count", "true", "true"),
    ("ratio", "4.5", 4.5),
    ("ratio", "4", 4),
    ("ratio", "1e400", "1e400"),
    ("ratio", "NaN", "NaN"),
    ("flag", "true", True),
    ("flag", "1", "1"),
    ("flag", "True", True),
    ("flag", "False", False),
    ("nothing", "null", None),
    ("nothing", "None", None),
    ("count", "True", "True"),
    ("text", "True", "True"),
    ("options", '{"a": [1, 2]}', {"a": [1, 2]}),
    ("options", "{a: 1}", "{a: 1}"),
    ("options", "[1]", "[1]"),
    ("items", '["x", 2]', ["x", 2]),
    ("items", "x, 2", "x, 2"),
    ("either", "7", "7"),
    ("maybe", "7", 7),
    ("maybe", "null", None),
    ("maybe", '"7"', '"7"'),
    ("odd", "7", "7"),
    ("untyped", "7", "7"),
    ("unknown", "7", "7"),
])
def test_parameter_value_follows_its_type(key: str, written: str, value: object) -> None:
    assert arguments(xml_call("typed", **{key: written})) == {key: value}


def test_json_deeper_than_100_stays_text() -> None:
    deep, deeper = "[" * 100 + "]" * 100, "[" * 101 + "]" * 101
    assert arguments(xml_call("typed", items=deep)) == {"items": json.loads(deep)}
    assert arguments(xml_call("typed", items=deeper)) == {"items": deeper}
    block = f'<tool_call>\n{{"name": "get_time", "arguments": {{"x": {deeper}}}}}\n</tool_call>'
    assert parse(block, JSON) == (block, ())


def test_string_value_keeps_newlines_and_angle_brackets() -> None:
    code = "\nif a < b:\n    print('<b>x</b>')\n\n"
    found = arguments(xml_call("typed", text=code))
    assert found == {"text": code}


def test_only_one_newline_is_stripped_at_each_end() -> None:
    written = ("<tool_call>\n<function=typed>\n<parameter=text>\n\n x \n\n</parameter>\n</function>\n"
               "</tool_call>")
    assert arguments(written) == {"text": "\n x \n"}


def test_schema_that_is_not_an_object_reads_strings() -> None:
    tools = {"odd": {"properties": ["count"]}}
    text = "<tool_call>\n<function=odd>\n<parameter=count>\n1\n</parameter>\n</function>\n</tool_call>"
    assert parse_tool_calls(text, XML, tools, call_id)[1][0].arguments == '{"count": "1"}'


def test_json_call() -> None:
    text = "Checking.\n" + json_call({"name": "get_weather", "arguments": {"city": "Zürich", "days": 3}})
    called = ToolCall("call_0", "get_weather", '{"city": "Zürich", "days": 3}')
    assert parse(text, JSON) == ("Checking.", (called,))


def test_json_arguments_given_as_a_string() -> None:
    assert arguments(json_call({"name": "get_time", "arguments": '{"zone": "UTC"}'}), JSON) == {"zone": "UTC"}


@pytest.mark.parametrize("block", [
    json_call({"name": "launch", "arguments": {}}),  # unknown tool
    json_call(["get_time", {}]),  # not an object
    json_call({"arguments": {}}),  # no name
    json_call({"name": "get_time", "arguments": 3}),  # arguments not an object
    json_call({"name": "get_time", "arguments": "{not json"}),
    json_call({"name": "get_time"}),
    '<tool_call>\n{"name": "get_time", "arguments": {}\n</tool_call>',  # JSON cut short
    '<tool_call>\n{"name": "get_time", "arguments": {"x": NaN}}\n</tool_call>',
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n',  # never closed
])
def test_invalid_json_block_stays_text(block: str) -> None:
    assert parse("Text.\n" + block, JSON) == ("Text.\n" + block, ())
    assert stream(["Text.\n" + block], JSON).content == "Text.\n" + block


def test_xml_block_in_a_json_template_stays_text() -> None:
    block = xml_call("get_time")
    assert parse(block, JSON) == (block, ())


def test_stream_releases_text_that_cannot_start_a_call() -> None:
    reader = ToolCallStream(XML, TOOLS, call_id)
    assert reader.feed("Hello wor") == [Delta(content="Hello wor")]
    assert reader.feed("ld <tool") == [Delta(content="ld")]
    assert reader.feed("box>\n") == [Delta(content=" <toolbox>")]
    assert reader.feed("a\n\n") == [Delta(content="\na")]
    assert reader.finish() == [Delta(content="\n\n")]
    assert reader.calls == ()


def test_stream_xml_deltas() -> None:
    text = "Looking.\n\n" + xml_call("get_weather", city="Paris", days="3")
    reader = ToolCallStream(XML, TOOLS, call_id)
    assert reader.feed(text[:text.index("<parameter")]) == [
        Delta(content="Looking."),
        Delta(tool_call={"index": 0, "id": "call_0", "type": "function",
                         "function": {"name": "get_weather", "arguments": ""}})]
    assert reader.feed(text[text.index("<parameter"):text.index("</function>")]) == [
        Delta(tool_call={"index": 0, "function": {"arguments": '{"city": "Paris"'}}),
        Delta(tool_call={"index": 0, "function": {"arguments": ", \"days\": 3"}})]
    assert reader.feed(text[text.index("</function>"):]) == [
        Delta(tool_call={"index": 0, "function": {"arguments": "}"}})]
    assert reader.finish() == []
    assert reader.calls == (ToolCall("call_0", "get_weather", '{"city": "Paris", "days": 3}'),)


def test_stream_xml_call_without_parameters() -> None:
    assert stream([xml_call("get_time")]).items == [
        {"index": 0, "id": "call_0", "type": "function", "function": {"name": "get_time", "arguments": ""}},
        {"index": 0, "function": {"arguments": "{}"}}]


def test_stream_releases_an_unknown_call_before_its_end() -> None:
    reader = ToolCallStream(XML, TOOLS, call_id)
    assert reader.feed("\n<tool_call>\n<function=launch") == []
    assert reader.feed(">\n<parameter=") == [Delta(content="\n<tool_call>\n<function=launch>\n<parameter=")]
    assert reader.feed("x>\n1\n</parameter>\n</function>\n</tool_") == [
        Delta(content="x>\n1\n</parameter>\n</function>\n")]
    assert reader.feed("call>\n") == [Delta(content="</tool_call>")]
    assert reader.finish() == [Delta(content="\n")]


def test_stream_releases_a_block_without_a_header_early() -> None:
    reader = ToolCallStream(XML, TOOLS, call_id)
    assert reader.feed("<tool_call>\n<func") == []
    assert reader.feed("ion") == [Delta(content="<tool_call>\n<funcion")]


def test_stream_holds_json_until_the_block_ends() -> None:
    reader = ToolCallStream(JSON, TOOLS, call_id)
    block = json_call({"name": "get_weather", "arguments": {"city": "Paris"}})
    assert reader.feed("On it.\n" + block[:-3]) == [Delta(content="On it.")]
    assert reader.feed(block[-3:]) == [
        Delta(tool_call={"index": 0, "id": "call_0", "type": "function",
                         "function": {"name": "get_weather", "arguments": ""}}),
        Delta(tool_call={"index": 0, "function": {"arguments": '{"city": "Paris"}'}})]
    assert reader.finish() == []


def test_stream_closes_a_cut_off_xml_call() -> None:
    whole = "Hm.\n" + xml_call("get_weather", city="Paris", days="3")
    cut = whole[:whole.index("3\n</parameter>") + 1]  # the reply ends in the middle of days's value
    streamed = stream([cut])
    closed = ToolCall("call_0", "get_weather", '{"city": "Paris"}')
    assert (streamed.content, streamed.calls, streamed.joined()) == ("Hm.", (closed,), [closed])
    assert parse(cut) == (cut, ())


def test_stream_releases_what_it_held_at_the_end() -> None:
    assert stream(["Text <tool_ca"]).content == "Text <tool_ca"
    assert stream(["Text\n<tool_call>\n<funct"]).content == "Text\n<tool_call>\n<funct"
    assert stream([xml_call("get_time") + "\n\n"]).content == ""
    json_cut = '<tool_call>\n{"name": "get_time", "arguments": {}}'
    assert stream([json_cut], JSON).content == json_cut


SAMPLES = {
    "text only": (XML, "Paris is the capital of France.\n\nIt has 2 million people.\n\n"),
    "calls only": (XML, xml_call("get_weather", city="Paris", days="3") + "\n"),
    "text then two calls": (XML, "I'll check both.\n\n" + xml_call("get_weather", city="Paris", days="3")
                            + "\n" + xml_call("get_weather", city="Oslo", days="1")),
    "unknown tool": (XML, "Ok.\n" + xml_call("launch", target="moon") + "\n" + xml_call("get_time") + " \n"),
    "no header": (XML, "<tool_call>\nget_time()\n</tool_call>\nThat's all.\n"),
    "unicode and code": (XML, "Écrivons.\n" + xml_call("typed", text="日本語 ✓", count="7", either="x < y",
                                                        options='{"é": [1, 2]}', items="nope") + "\nFin."),
    "multiline value": (XML, xml_call("typed", text="def f(a, b):\n    return a < b\n</p>\n", flag="true")),
    "json calls": (JSON, "Two calls.\n" + json_call({"name": "get_weather", "arguments": {"city": "Kyōto"}})
                   + "\n" + json_call({"name": "get_time", "arguments": "{}"}) + "\n"),
    "bad json": (JSON, "Hm " + '<tool_call>\n{"name": "get_time", "arguments": }\n</tool_call>\n'
                 + json_call({"name": "launch", "arguments": {}}) + "\n<tool_call>"),
    "json unclosed": (JSON, json_call({"name": "get_time", "arguments": {}})
                      + '\n<tool_call>\n{"name": "get_'),
    "unclosed header": (XML, xml_call("get_time") + "\n<tool_call>\n<function=get_wea"),
    "header never closed": (XML, "So:\n<tool_call>\n<function=get_time\n</tool_call>\n"
                            + xml_call("get_time")),
    "loose xml": (XML, "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\nhm\n"
                  "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</tool_call>\n<tool_call>"
                  "<function=get_time></function>junk</tool_call>"),
}
WHOLE_CALL = "Sure.\n" + xml_call("get_weather", city="Paris", days="3")
CUT_OFF = (XML, WHOLE_CALL[:WHOLE_CALL.index("</function>")])  # the reply ends after days's value


def split(text: str, cuts: set[int]) -> list[str]:
    bounds = [0, *sorted(cuts), len(text)]
    return [text[start:end] for start, end in itertools.pairwise(bounds)]


def assert_stream_matches_parse(fmt: ToolFormat, text: str, pieces: list[str]) -> None:
    streamed = stream(pieces, fmt)
    content, calls = parse(text, fmt)
    assert streamed.content == content
    assert streamed.calls == calls
    assert streamed.joined() == list(calls)


@pytest.mark.parametrize("name", SAMPLES)
def test_stream_matches_parse_at_every_single_cut(name: str) -> None:
    fmt, text = SAMPLES[name]
    for cut in range(len(text) + 1):
        assert_stream_matches_parse(fmt, text, [text[:cut], text[cut:]])


@pytest.mark.parametrize("name", SAMPLES)
def test_stream_matches_parse_a_character_at_a_time(name: str) -> None:
    fmt, text = SAMPLES[name]
    assert_stream_matches_parse(fmt, text, list(text))


@settings(deadline=None, max_examples=300)
@given(data=st.data())
def test_stream_matches_parse_over_any_split(data: st.DataObject) -> None:
    fmt, text = SAMPLES[data.draw(st.sampled_from(sorted(SAMPLES)))]
    assert_stream_matches_parse(fmt, text, split(text, data.draw(st.sets(st.integers(0, len(text))))))


@settings(deadline=None, max_examples=100)
@given(cuts=st.sets(st.integers(0, len(CUT_OFF[1]))))
def test_cut_off_call_over_any_split(cuts: set[int]) -> None:
    streamed = stream(split(CUT_OFF[1], cuts), CUT_OFF[0])
    expected = ToolCall("call_0", "get_weather", '{"city": "Paris", "days": 3}')
    assert (streamed.content, streamed.calls, streamed.joined()) == ("Sure.", (expected,), [expected])


def test_samples_cover_both_sides() -> None:
    found = {name: parse(text, fmt) for name, (fmt, text) in SAMPLES.items()}
    assert [name for name, (_, calls) in found.items() if not calls] == ["text only", "no header", "bad json"]
    assert found["loose xml"] == ("", (ToolCall("call_0", "get_weather", '{"city": "Rome"}'),
                                       ToolCall("call_1", "get_time", "{}")))
    assert found["unicode and code"][1][0].arguments == (
        '{"text": "日本語 ✓", "count": 7, "either": "x < y", "options": {"é": [1, 2]}, "items": "nope"}')
    assert found["unknown tool"][0] == "Ok.\n" + xml_call("launch", target="moon")
