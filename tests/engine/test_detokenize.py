"""Incremental text: split characters wait, stop strings are cut and never shown in part."""

from __future__ import annotations

import tokenizers

from tfd.demo import TOKENIZER
from tfd.engine.detokenize import Detokenizer

TOKENS = tokenizers.Tokenizer.from_file(str(TOKENIZER))


def feed(text: str, stop: tuple[str, ...] = ()) -> tuple[list[str], Detokenizer]:
    detokenizer = Detokenizer(TOKENS, stop)
    pieces = []
    for token in TOKENS.encode(text).ids:
        pieces.append(detokenizer.add([token]))
        if detokenizer.stopped_at is not None:
            break
    pieces.append(detokenizer.finish())
    return pieces, detokenizer


def test_the_pieces_add_up_to_the_text_and_split_characters_wait() -> None:
    text = "naïve café 日本語 — done"
    pieces, _ = feed(text)
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_a_stop_string_ends_the_text_before_it() -> None:
    pieces, detokenizer = feed("def f(x):\n    return x\n\ndef g(y):", stop=("\n\ndef",))
    assert "".join(pieces) == "def f(x):\n    return x"
    assert detokenizer.stopped_at == len("def f(x):\n    return x")


def test_a_possible_stop_is_held_back_until_it_is_not_one() -> None:
    pieces, _ = feed("one END two ENDING", stop=("ENDS",))
    assert "".join(pieces) == "one END two ENDING"
    assert not any(piece.endswith("EN") for piece in pieces[:-1] if "END" not in piece)
