"""A reply's thought told apart from its content, whole and as it streams, in every way text can be cut."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from tfd.server.reasoning import ReasoningStream, Split, opens_thought, split_reasoning, thinks

QWEN3_5_OPENED = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
QWEN3_5_SWITCHED_OFF = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_a_template_thinks_when_it_names_both_tags() -> None:
    assert thinks("{{ '<think>\\n' }}{{ '</think>' }}")
    assert not thinks("<|im_start|>assistant\n")
    assert not thinks("{{ '<think>' }}")


def test_the_generation_prompt_tells_whether_the_reply_starts_inside_a_thought() -> None:
    assert opens_thought(QWEN3_5_OPENED)
    assert not opens_thought(QWEN3_5_SWITCHED_OFF)
    assert not opens_thought("<|im_start|>assistant\n")
    # an earlier turn's closed thought does not open this one
    assert not opens_thought("<think>\nold\n</think>\n\nanswer<|im_end|>\n<|im_start|>assistant\n")


def test_a_reply_inside_a_thought_splits_at_the_closing_tag_without_the_edge_newlines() -> None:
    assert split_reasoning("Let me see.\nYes.\n</think>\n\nParis.", True) == \
        Split("Let me see.\nYes.", "Paris.")
    assert split_reasoning("\n\nhm\n\n</think>Paris.\n", True) == Split("hm", "Paris.\n")
    assert split_reasoning("cut off in thought\n", True) == Split("cut off in thought", "")
    assert split_reasoning("</think>\n\nat once", True) == Split("", "at once")


def test_a_reply_that_opens_its_own_thought_splits_and_one_that_does_not_is_all_content() -> None:
    assert split_reasoning("  <think>\nidea\n</think>\n\nanswer", False) == Split("idea", "answer")
    assert split_reasoning("answer <think>not a thought</think>", False) == \
        Split(None, "answer <think>not a thought</think>")
    assert split_reasoning("<thin", False) == Split(None, "<thin")
    assert split_reasoning("", False) == Split(None, "")


def _streamed(pieces: list[str], inside: bool) -> tuple[str, str]:
    stream = ReasoningStream(inside)
    reasoning, content = [], []
    for piece in pieces:
        got = stream.feed(piece)
        reasoning.append(got.reasoning)
        content.append(got.content)
    last = stream.finish()
    return "".join(reasoning) + last.reasoning, "".join(content) + last.content


REPLIES = ["Let me see.\nYes.\n</think>\n\nParis.", "\n\nhm\n\n</think>Paris.\n", "cut off\n\n</thi",
           "a </thinking> b\n</think>\n\n</think> c", "</think>\n\n", "  <think>\nidea\n</think>\n\nanswer",
           "answer <think>x</think>", "<thin", "\n\n\n", "été 🌞\n</think>\n\nnaïve"]


@given(st.sampled_from(REPLIES), st.booleans(), st.lists(st.integers(0, 60), max_size=12))
def test_streamed_pieces_add_up_to_the_whole_split_however_the_text_is_cut(
        reply: str, inside: bool, cuts: list[int]) -> None:
    points = sorted({min(cut, len(reply)) for cut in cuts})
    pieces = [reply[a:b] for a, b in zip([0, *points], [*points, len(reply)], strict=True)]
    whole = split_reasoning(reply, inside)
    assert _streamed(pieces, inside) == (whole.reasoning or "", whole.content)


def test_a_stream_releases_thought_and_content_as_soon_as_they_are_settled() -> None:
    stream = ReasoningStream(True)
    assert stream.feed("\nThinking hard").reasoning == "Thinking hard"
    held = stream.feed("\n</thi")  # a newline and part of a tag: maybe the thought's edge
    assert (held.reasoning, held.content) == ("", "")
    assert stream.feed("nk>\n\nThe ").content == "The "
    assert stream.feed("answer").content == "answer"
    stream = ReasoningStream(True)
    assert stream.feed("a\n</thx").reasoning == "a\n</thx"  # not the tag after all: released at once
