"""Grammars a reply must follow, through llguidance: the tokens each draw may take.

``Vocabulary`` is the served tokenizer as llguidance reads it (built once at load: about a second
for a 248k vocabulary), ending on the model's end-of-sequence tokens, with what fills its masks
(llguidance's executor, the grammar thread, two host buffers; ``tfd.engine.grammar_masks`` fills
them). ``Vocabulary.compile`` turns a Lark grammar (``%json`` for JSON Schemas) into a ``Grammar``,
or raises ``GrammarError`` with llguidance's words. A ``Grammar`` is shared and never advanced; each
lane follows it with a ``Matcher`` of its own (a copy: microseconds), which the lane advances by
the tokens it takes, so a lane's allowed tokens depend on its own tokens alone. At most one fill is
in flight a vocabulary, and whatever reads or moves a matcher waits for it first
(``Vocabulary.settle``), so no matcher is touched by two threads at once. Engine thread only, but
for ``Vocabulary.compile`` (any).

A token drawn under the mask the last fill gave its matcher's place is taken on that mask's bit
(``Matcher.take``: the same verdict as llguidance's, which made the mask) and handed to llguidance by
the next fill, all lanes' at once on llguidance's threads (``TAKE_LATER``): the engine thread's take of a
lane costs a bit's read, not a parser step (~4 us a lane and step). ``Matcher.judge`` makes that take
as soon as a step's tokens are on the host, so the next fill begins before the lanes' own takes
(detokenizing, finish rules), which then overlap it; the fills write two host buffers in turn, so the
bits a judge reads are never the ones a fill in flight writes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import numpy as np
import torch

WORD_BITS = 32
_TEXT = '[^"\\\\\\x00-\\x1F\\x7F]'  # a character a JSON string holds unescaped
# llguidance's slicer takes the tokens of a slice whole wherever the grammar allows all its strings;
# its own slices stop at 10 characters, so a JSON string with fewer left before its maxLength walked
# the whole vocabulary (a third of a 32-lane fill); one slice a length below 10 covers those states
SLICES = (*llguidance.LLTokenizer.general_slices(), *(f"{_TEXT}{{1,{n}}}" for n in range(1, 10)))
# ``Matcher.take`` of a token drawn under its fill's mask reads the mask's bit and leaves llguidance's step to
# the next fill (the grammar thread, every lane's at once): the same masks and verdicts; off for the A/B
TAKE_LATER = True
# ``Matcher.judge`` takes a step's tokens as soon as they are on the host and the next fill begins then,
# before the lanes' takes; off (judge declines), the fill begins after the takes: timing alone
JUDGE_AHEAD = True


def mask_words(vocab: int) -> int:
    """The int32 words of a mask row over ``vocab`` tokens (a bit a token)."""
    return (vocab + WORD_BITS - 1) // WORD_BITS


class GrammarError(Exception):
    """A grammar llguidance cannot compile; the message is llguidance's."""


class GrammarRefused(RuntimeError):
    """A lane drew a token its grammar does not allow: a bug (every such draw is masked), which
    fails that lane alone."""


def _refused(token: int) -> GrammarRefused:
    return GrammarRefused(f"token {token} is not allowed by the reply's grammar")


def _bit(row: tuple[np.ndarray, int, int], token: int) -> bool:
    """Whether a matcher's mask row (its words, its row, its fill) allows ``token``."""
    words, at, _ = row
    return bool((int(words[at, token // WORD_BITS]) >> (token % WORD_BITS)) & 1)


# what a fill is of: its rows; each row, its matcher, the matcher's place and the drafts (``grammar_masks``)
Key = tuple[int, tuple[tuple[int, int, int, tuple[int, ...]], ...]]


class _Switch:
    """The GIL's switch interval, shortened while any vocabulary's fill is in flight (``hold``'s
    ``switch_s``) and Python's own again once none is. Engine threads only."""

    def __init__(self) -> None:
        self.holders = 0
        self.before = 0.0

    def shorten(self, seconds: float) -> None:
        if not self.holders:
            self.before = sys.getswitchinterval()
            sys.setswitchinterval(seconds)
        self.holders += 1

    def restore(self) -> None:
        self.holders -= 1
        if not self.holders:
            sys.setswitchinterval(self.before)


_SWITCH = _Switch()


class Vocabulary:
    """``tokenizer_json``: the tokenizer's JSON text (a Hugging Face tokenizers file); ``vocab``: the
    model's vocabulary size (rows of its logits); ``eos``: the tokens that end a reply."""

    def __init__(self, tokenizer_json: str, vocab: int, eos: Sequence[int]) -> None:
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=list(eos),
                                                slices=list(SLICES))
        self.words = mask_words(vocab)
        self.executor = llguidance.LLExecutor()
        self._masks: list[torch.Tensor | None] = [None, None]  # the host buffers fills write in turn
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="tfd-grammar")  # calls the executor
        self._pending: tuple[Key, Future[torch.Tensor]] | None = None  # the fill in flight and its rows
        self.fills = 0  # fills begun: a mask row a matcher holds is current while this has not moved
        self._shortened = False  # its fill in flight shortened the switch interval (``_Switch``)

    def settle(self) -> None:
        """Wait for the fill in flight (``fill_ahead``), if any; its error, if it failed, raised here."""
        pending = self.take_pending()
        if pending is not None:
            pending[1].result()

    def hold(self, pending: tuple[Key, Future[torch.Tensor]], switch_s: float = 0.0) -> None:
        """Note ``pending`` as the fill in flight; with ``switch_s``, the GIL's switch interval that
        short until it is taken (``take_pending``) or waited for."""
        self._pending = pending
        if switch_s and not self._shortened:
            self._shortened = True
            _SWITCH.shorten(switch_s)

    @property
    def pending(self) -> tuple[Key, Future[torch.Tensor]] | None:
        """The fill in flight and what it is of, if any."""
        return self._pending

    def take_pending(self) -> tuple[Key, Future[torch.Tensor]] | None:
        """The fill in flight, if any, no longer noted; the switch interval as it was."""
        pending, self._pending = self._pending, None
        if self._shortened:
            self._shortened = False
            _SWITCH.restore()
        return pending

    def masks(self, rows: int) -> torch.Tensor:
        """The host buffer of ``rows`` masks the next fill writes, pinned where CUDA is: two buffers in
        turn, the same memory step after step (a fresh pinned block a step cost the H200's host ~4 ms
        to touch), grown when a step has more rows. Engine thread only; a buffer's last contents were
        copied to the device before the step that filled them drew (that step waited for its tokens),
        and the other holds the rows the last fill's matchers judge their tokens by."""
        turn = (self.fills + 1) % 2
        held = self._masks[turn]
        if held is None or held.shape[0] < rows:
            held = self._masks[turn] = torch.empty((max(rows, 64), self.words), dtype=torch.int32,
                                                   pin_memory=torch.cuda.is_available())
        return held[:rows]

    def special(self, text: str) -> int | None:
        """``text``'s id when it is one special token of the vocabulary (a grammar must name it as a
        token: llguidance does not spell special tokens from text), else None."""
        ids = self.tokenizer.tokenize_str(text)
        return ids[0] if len(ids) == 1 and self.tokenizer.is_special_token(ids[0]) else None

    def compile(self, lark: str, lanes: int = 1) -> Grammar:
        """A Lark grammar (llguidance's dialect) compiled, with matchers ready for ``lanes`` lanes
        (``Grammar.prepared``); ``GrammarError`` when it does not compile. Milliseconds for a JSON
        Schema of a few fields, and again a lane (it drops the GIL meanwhile): off the engine thread."""
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        problem = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if problem:
            raise GrammarError(problem.strip())
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        return Grammar(self, matcher, grammar).prepared(lanes)


class Grammar:
    """A compiled grammar (``text``: llguidance's form of it); ``matcher()`` gives a lane its own
    follower: one compiled for it ahead (``prepared``) while there is one, else a copy of the start."""

    @classmethod
    def of_text(cls, vocabulary: Vocabulary, text: str, lanes: int) -> Grammar:
        """A grammar ``Grammar.text`` gave (another rank's), compiled against ``vocabulary`` anew."""
        start = llguidance.LLMatcher(vocabulary.tokenizer, text, log_level=0)
        return cls(vocabulary, start, text).prepared(lanes)

    @property
    def text(self) -> str:
        return self._text

    @property
    def lanes(self) -> int:
        """Lanes it has a matcher compiled ahead for."""
        return max(1, len(self._ready))

    def __init__(self, vocabulary: Vocabulary, start: llguidance.LLMatcher, text: str,
                 ready: Sequence[llguidance.LLMatcher] = ()) -> None:
        self.vocabulary = vocabulary
        self._start = start
        self._text = text
        self._ready = list(ready)

    def prepared(self, lanes: int) -> Grammar:
        """The same grammar with a matcher compiled anew for each of ``lanes`` lanes (milliseconds
        each; any thread but the engine's). Copies of one matcher share llguidance's lexer, so the
        masks of lanes following copies fill one lane at a time however many threads fill them
        (a 32-lane fill on the H200's host: 3.8 ms on average against 2.0 for matchers of their own)."""
        tokenizer = self.vocabulary.tokenizer
        made = [llguidance.LLMatcher(tokenizer, self._text, log_level=0) for _ in range(lanes)]
        return Grammar(self.vocabulary, self._start, self._text, made)

    def matcher(self) -> Matcher:
        """A follower at the grammar's start for one lane (engine thread)."""
        own = self._ready.pop() if self._ready else self._start.deep_copy()
        return Matcher(self.vocabulary, own)


class Matcher:
    """One lane's place in its grammar."""

    def __init__(self, vocabulary: Vocabulary, matcher: llguidance.LLMatcher) -> None:
        self.vocabulary = vocabulary
        self.inner = matcher
        self.taken = 0  # tokens taken: its place, for telling a fill made ahead is still its own
        # its mask's words, its row and the fill (``Vocabulary.fills``) that gave them at its place; a
        # fill that sets this has stepped past any token owed, so with it set nothing is owed
        self.row: tuple[np.ndarray, int, int] | None = None
        self.owed: int | None = None  # a token taken on its mask's bit, not yet stepped by llguidance
        self.judged: int | None = None  # a token ``judge`` took before the lane's own take of it

    def judge(self, token: int) -> bool:
        """Take ``token`` now, ahead of the lane's own take (which then only confirms it), when it
        was drawn at the place the last fill gave a mask row for and that row's bit allows it: owed
        to llguidance, which the next fill may begin stepping at once. False (nothing taken) where
        the take must judge it itself: no current row, a barred token, ``TAKE_LATER`` or
        ``JUDGE_AHEAD`` off."""
        row = self.row
        if not (TAKE_LATER and JUDGE_AHEAD) or row is None or row[2] != self.vocabulary.fills:
            return False
        if not _bit(row, token):
            return False
        self.row, self.owed, self.judged = None, token, token
        self.taken += 1
        return True

    def take(self, token: int) -> None:
        """The lane took ``token`` (once a fill in flight is done, unless ``judge`` took it).
        ``GrammarRefused`` for a token its grammar does not allow. Under ``TAKE_LATER``, a token drawn
        at the place the last fill gave a mask row for is judged by that row's bit and owed to
        llguidance until the next fill."""
        if self.judged is not None:  # taken already: the fill in flight may be stepping it
            judged, self.judged = self.judged, None
            assert judged == token, f"the lane took {token}, its grammar was handed {judged}"
            return
        vocabulary = self.vocabulary
        vocabulary.settle()
        row, self.row = self.row, None
        if TAKE_LATER and row is not None and row[2] == vocabulary.fills:
            self.taken += 1
            if not _bit(row, token):
                raise _refused(token)
            self.owed = token
            return
        self.pay()
        self.taken += 1
        if not self.inner.consume_token(token):
            raise _refused(token)

    def pay(self) -> None:
        """llguidance steps past the token it is owed, if any (``GrammarRefused`` if it refuses it,
        against the mask it made: a bug)."""
        owed, self.owed = self.owed, None
        if owed is not None and not self.inner.consume_token(owed):
            raise _refused(owed)

    @property
    def finished(self) -> bool:
        """Whether the grammar is complete (it allows the end and nothing else, or has ended)."""
        self.vocabulary.settle()
        self.pay()
        return self.inner.is_stopped()
