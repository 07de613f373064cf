"""The masks a step's grammar rows may draw: filled by llguidance, applied to the logits.

``allowed`` fills, for the rows of a step that follow grammars, the bitmask of the tokens each row
may draw (a row a token, 32 tokens an int32 word), for a verify window's rows as if the drafts
before each held: llguidance's executor fills them on its own threads without the GIL. Rows that
follow no grammar are left all ones. ``fill_ahead`` starts the same fill on the vocabulary's own
thread and returns once that thread holds it, so the host's bookkeeping overlaps the fill; the
``allowed`` call that asks for the same rows of matchers in the same places takes them when done.
The tokens the matchers are owed (``tfd.engine.grammar``'s ``TAKE_LATER``) are stepped as the
engine thread makes a fill ready, so the grammar thread makes one call that drops the GIL, not two
with the engine's Python between them (``OWED_FIRST``). ``apply`` bars at minus infinity what a
row's mask bars. Engine thread only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TypeVar

import llguidance
import torch

from tfd.engine.grammar import WORD_BITS, GrammarRefused, Key, Matcher, Vocabulary

# ``fill_ahead`` returns once its fill has begun (the GIL handed to the grammar thread): timing alone,
# the same masks; off (tfd bench --variant off=tfd.engine.grammar_masks.FILL_HANDOFF=0) for a device's A/B
FILL_HANDOFF = True
# the tokens owed to llguidance are stepped (in parallel, the GIL dropped) as the engine thread makes a fill
# ready: the grammar thread's one call then waits for the GIL once, as it ends, not also between the owed
# tokens and the masks while the engine thread's Python runs; off, the grammar thread steps them first
OWED_FIRST = True
# while a fill is in flight the GIL's switch interval is this many microseconds (0: Python's own, 5 ms), so
# the grammar thread takes the GIL within it of its call's end and the fill is done when the engine thread
# asks for it, not done only once that thread waits: timing alone, the same masks; for the A/B on a device
FILL_SWITCH_US = 0
# ``fill_ahead``'s fill made on the grammar thread while the engine thread goes on; off, made at once on the
# engine thread (llguidance's threads fill the rows in parallel either way): no handoff nor wake to pay, the
# fill's time not overlapped; timing alone, the same masks; for the A/B on a device
FILL_ON_THREAD = True


Follow = tuple[Matcher, int, Sequence[int]]  # a matcher, its mask's row, the drafts its next rows take


def _key(rows: int, follows: Sequence[Follow]) -> Key:
    """What a fill is of: its rows, and each row's matcher, the matcher's place and the drafts (a
    matcher's id names it: a fill in flight holds its matchers, so no other takes the id meanwhile)."""
    return rows, tuple(sorted((row, id(matcher), matcher.taken, tuple(drafts))
                              for matcher, row, drafts in follows))


def _covers(made: Key, asked: Key) -> bool:
    """Whether a fill of ``made`` holds every row ``asked`` asks for: the same rows, each asked row's
    matcher at the same place. Its other rows (lanes that ended since it began) hold masks no draw
    that is kept reads."""
    return made[0] == asked[0] and set(asked[1]) <= set(made[1])


def allowed(rows: int, follows: Sequence[Follow]) -> torch.Tensor:
    """The bitmask [rows, words] (int32, pinned where CUDA is) of what each row may draw: for each
    ``(matcher, row, drafts)``, its row and, a draft a row, the rows after it as if the drafts before
    held (past a draft the grammar refuses: all ones, their draws not kept); other rows all ones, or
    the masks of lanes a fill ahead covered that have ended since.
    The fill ``fill_ahead`` started for these rows when there is one (waiting for it), else made now.
    Valid until the fill after the next."""
    vocabulary = follows[0][0].vocabulary
    pending = vocabulary.pending
    if pending is not None and _covers(pending[0], _key(rows, follows)):
        vocabulary.take_pending()
        return pending[1].result()
    vocabulary.settle()
    return _fill(*_begin(rows, follows))


def fill_ahead(rows: int, follows: Sequence[Follow]) -> None:
    """Start ``allowed(rows, follows)`` on the vocabulary's thread (after any fill in flight) and
    return once llguidance holds it: the host goes on while the masks fill.

    The thread needs the GIL to make its call, and the engine thread's bookkeeping after this holds
    it until something blocks (the wait in ``allowed``, a few hundred microseconds on), so without
    the handoff the fill would begin only when its result was wanted. Returning only once the thread
    has begun costs the engine thread one wake of it; everything else the fill needs from Python is
    made ready here first, so the thread holds the GIL only to make its call. With ``FILL_ON_THREAD``
    off the fill is made here, and the draw that asks for it takes it the same way."""
    vocabulary = follows[0][0].vocabulary
    vocabulary.settle()
    key = _key(rows, follows)
    made = _now(lambda: _begin(rows, follows))
    if FILL_ON_THREAD and made.exception() is None:
        begun = threading.Event()
        vocabulary.hold((key, vocabulary.thread.submit(_fill, *made.result(), begun)), FILL_SWITCH_US / 1e6)
        if FILL_HANDOFF:
            begun.wait()  # the GIL passes to the thread, which gives it back as llguidance's call begins
        return
    # a refusal from ``_begin`` (raised where the fill is asked for, as the thread's own), or made now
    vocabulary.hold((key, _now(lambda: _fill(*made.result()))), FILL_SWITCH_US / 1e6)


_T = TypeVar("_T")


def _now(make: Callable[[], _T]) -> Future[_T]:
    """``make()`` made now, as a done future: its result, or the ``GrammarRefused`` it raised."""
    done: Future[_T] = Future()
    try:
        done.set_result(make())
    except GrammarRefused as refused:
        done.set_exception(refused)
    return done


_Made = tuple[Vocabulary, torch.Tensor, list[tuple[llguidance.LLMatcher, int]],
              list[tuple[llguidance.LLMatcher, int]], list[tuple[llguidance.LLMatcher, int, list[int]]]]


def _begin(rows: int, follows: Sequence[Follow]) -> _Made:
    """A fill of ``follows`` made ready on the engine thread: the next of the vocabulary's two
    buffers (the rows no matcher fills whole all ones), the tokens the matchers are owed taken off
    them (and stepped now, under ``OWED_FIRST``), each matcher filled whole given its row of it;
    what ``_fill`` asks llguidance for. ``GrammarRefused`` from a step of an owed token."""
    vocabulary = follows[0][0].vocabulary
    mask = vocabulary.masks(rows)
    vocabulary.fills += 1
    filled = {row for _, row, drafts in follows if not drafts}  # whole rows llguidance writes
    if len(filled) < rows:
        free = torch.ones(rows, dtype=torch.bool)
        free[list(filled)] = False
        mask[free] = -1
    owed = []
    for matcher, _, _ in follows:
        if matcher.owed is not None:
            owed.append((matcher.inner, matcher.owed))
            matcher.owed = None
    if OWED_FIRST:
        _step_owed(vocabulary, owed)
        owed = []
    words = mask.numpy()
    for matcher, row, drafts in follows:
        matcher.row = None if drafts else (words, row, vocabulary.fills)
    plain = [(matcher.inner, row) for matcher, row, drafts in follows if not drafts]
    drafted = [(matcher.inner, row, list(drafts)) for matcher, row, drafts in follows if drafts]
    return vocabulary, mask, owed, plain, drafted


def _step_owed(vocabulary: Vocabulary, owed: list[tuple[llguidance.LLMatcher, int]]) -> None:
    """llguidance steps each matcher past the token it is owed, all at once on its threads (the GIL
    dropped); ``GrammarRefused`` naming the tokens it refuses (each passed its mask's bit: a bug)."""
    if not owed:
        return
    verdicts = vocabulary.executor.consume_token_par(owed)
    refused = [token for (_, token), ok in zip(owed, verdicts, strict=True) if not ok]
    if refused:
        raise GrammarRefused(f"tokens {refused} are not allowed by their replies' grammars")


def _fill(vocabulary: Vocabulary, mask: torch.Tensor, owed: list[tuple[llguidance.LLMatcher, int]],
          plain: list[tuple[llguidance.LLMatcher, int]],
          drafted: list[tuple[llguidance.LLMatcher, int, list[int]]],
          begun: threading.Event | None = None) -> torch.Tensor:
    """llguidance's masks written into ``mask`` (``_begin``'s; drops the GIL meanwhile): the owed
    tokens ``_begin`` left stepped first, all at once, then the rows filled whole, then the drafted
    ones. ``begun`` set first, as llguidance's call is about to begin."""
    if begun is not None:  # the caller waits for it
        begun.set()
    _step_owed(vocabulary, owed)
    # straight into the tensor's memory (llguidance.torch's helpers do the same, but importing that
    # module compiles a kernel with torch.compile)
    width, rows = vocabulary.words * 4, mask.shape[0]
    if plain:
        vocabulary.executor.unsafe_compute_mask_ptr(plain, mask.data_ptr(), width, rows)
    if drafted:
        vocabulary.executor.unsafe_compute_mask_ptr_with_draft_token(drafted, mask.data_ptr(), width, rows)
    return mask


_PLACES: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def _places(vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's word and bit in a mask row (made once a vocabulary and device)."""
    found = _PLACES.get((vocab, device))
    if found is None:
        tokens = torch.arange(vocab, device=device)
        found = _PLACES[vocab, device] = (tokens // WORD_BITS, (tokens % WORD_BITS).to(torch.int32))
    return found


def apply(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``logits`` [rows, vocab] with every token its row's ``mask`` (on the same device) bars at
    minus infinity."""
    word, bit = _places(logits.shape[-1], logits.device)
    return logits.masked_fill((mask[:, word] >> bit) & 1 == 0, float("-inf"))
