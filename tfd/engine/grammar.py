"""Grammars a reply must follow, through llguidance: the tokens each draw may take.

``Vocabulary`` is the served tokenizer as llguidance reads it (built once at load: about a second
for a 248k vocabulary), ending on the model's end-of-sequence tokens. ``Vocabulary.compile`` turns
a Lark grammar (``%json`` for JSON Schemas) into a ``Grammar``, or raises ``GrammarError`` with
llguidance's words. A ``Grammar`` is shared and never advanced; each
lane follows it with a ``Matcher`` of its own (a copy: microseconds), which the lane advances by
the tokens it takes, so a lane's allowed tokens depend on its own tokens alone.

``allowed`` fills, for the rows of a step that follow grammars, the bitmask of the tokens each row
may draw (a row a token, 32 tokens an int32 word), for a verify window's rows as if the drafts
before each held: llguidance's executor fills them on its own threads without the GIL. Rows that
follow no grammar are left all ones. ``fill_ahead`` starts the same fill on the vocabulary's own
thread and returns once that thread holds it, so the host's bookkeeping overlaps the fill; the
``allowed`` call that asks for the same rows of matchers in the same places takes them when done.
At most one fill is in flight a vocabulary, and whatever reads or moves a matcher (``allowed``,
``Matcher.take``) waits for it first, so no matcher is touched by two threads at once. Engine
thread only, but for ``Vocabulary.compile`` (any).

A token drawn under the mask the last fill gave its matcher's place is taken on that mask's bit
(``Matcher.take``: the same verdict as llguidance's, which made the mask) and handed to llguidance by
the next fill, on the grammar thread with the others' (``TAKE_LATER``): the engine thread's take of a
lane costs a bit's read, not a parser step (~4 us a lane and step).
"""

from __future__ import annotations

import threading
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
# ``fill_ahead`` returns once its fill has begun (the GIL handed to the grammar thread): timing alone,
# the same masks; off (tfd bench --variant off=tfd.engine.grammar.FILL_HANDOFF=0) for the A/B on a device
FILL_HANDOFF = True
# ``Matcher.take`` of a token drawn under its fill's mask reads the mask's bit and leaves llguidance's step to
# the next fill (the grammar thread, every lane's at once): the same masks and verdicts; off for the A/B
TAKE_LATER = True


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


class Vocabulary:
    """``tokenizer_json``: the tokenizer's JSON text (a Hugging Face tokenizers file); ``vocab``: the
    model's vocabulary size (rows of its logits); ``eos``: the tokens that end a reply."""

    def __init__(self, tokenizer_json: str, vocab: int, eos: Sequence[int]) -> None:
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=list(eos),
                                                slices=list(SLICES))
        self.words = mask_words(vocab)
        self.executor = llguidance.LLExecutor()
        self._masks: torch.Tensor | None = None  # the host buffer masks are filled into (``allowed``)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="tfd-grammar")  # calls the executor
        self._pending: tuple[_Key, Future[torch.Tensor]] | None = None  # the fill in flight and its rows
        self.fills = 0  # fills begun: a mask row a matcher holds is current while this has not moved

    def settle(self) -> None:
        """Wait for the fill in flight (``fill_ahead``), if any; its error, if it failed, raised here."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[1].result()

    def masks(self, rows: int) -> torch.Tensor:
        """A host buffer of ``rows`` masks, pinned where CUDA is: the same memory step after step (a
        fresh pinned block a step cost the H200's host ~4 ms to touch), grown when a step has more
        rows. Engine thread only; its last contents were copied to the device before the step that
        filled them drew (that step waited for its tokens)."""
        if self._masks is None or self._masks.shape[0] < rows:
            self._masks = torch.empty((max(rows, 64), self.words), dtype=torch.int32,
                                      pin_memory=torch.cuda.is_available())
        return self._masks[:rows]

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

    def take(self, token: int) -> None:
        """The lane took ``token`` (once a fill in flight is done). ``GrammarRefused`` for a token
        its grammar does not allow. Under ``TAKE_LATER``, a token drawn at the place the last fill
        gave a mask row for is judged by that row's bit and owed to llguidance until the next fill."""
        vocabulary = self.vocabulary
        vocabulary.settle()
        row, self.row = self.row, None
        if TAKE_LATER and row is not None and row[2] == vocabulary.fills:
            words, at, _ = row
            self.taken += 1
            if not (int(words[at, token // WORD_BITS]) >> (token % WORD_BITS)) & 1:
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


Follow = tuple[Matcher, int, Sequence[int]]  # a matcher, its mask's row, the drafts its next rows take
_Key = tuple[int, tuple[tuple[int, int, int, tuple[int, ...]], ...]]  # rows; each row, matcher, place, drafts


def _key(rows: int, follows: Sequence[Follow]) -> _Key:
    """What a fill is of: its rows, and each row's matcher, the matcher's place and the drafts (a
    matcher's id names it: a fill in flight holds its matchers, so no other takes the id meanwhile)."""
    return rows, tuple(sorted((row, id(matcher), matcher.taken, tuple(drafts))
                              for matcher, row, drafts in follows))


def allowed(rows: int, follows: Sequence[Follow]) -> torch.Tensor:
    """The bitmask [rows, words] (int32, pinned where CUDA is) of what each row may draw: for each
    ``(matcher, row, drafts)``, its row and, a draft a row, the rows after it as if the drafts before
    held (past a draft the grammar refuses: all ones, their draws not kept); other rows all ones.
    The fill ``fill_ahead`` started for the same when there is one (waiting for it), else made now.
    Valid until the next fill."""
    vocabulary = follows[0][0].vocabulary
    pending = vocabulary._pending
    if pending is not None and pending[0] == _key(rows, follows):
        vocabulary._pending = None
        return pending[1].result()
    vocabulary.settle()
    return _fill(_ones_elsewhere(rows, follows), follows)


def fill_ahead(rows: int, follows: Sequence[Follow]) -> None:
    """Start ``allowed(rows, follows)`` on the vocabulary's thread (after any fill in flight) and
    return once llguidance holds it: the host goes on while the masks fill.

    The thread needs the GIL to make its call, and the engine thread's bookkeeping after this holds
    it until something blocks (the wait in ``allowed``, a few hundred microseconds on), so without
    the handoff the fill would begin only when its result was wanted. Returning only once the thread
    has begun costs the engine thread one wake of it."""
    vocabulary = follows[0][0].vocabulary
    vocabulary.settle()
    mask = _ones_elsewhere(rows, follows)
    begun = threading.Event()
    vocabulary._pending = (_key(rows, follows), vocabulary._thread.submit(_fill, mask, follows, begun))
    if FILL_HANDOFF:
        begun.wait()  # the GIL passes to the thread, which gives it back as llguidance's call begins


def _ones_elsewhere(rows: int, follows: Sequence[Follow]) -> torch.Tensor:
    """The vocabulary's mask buffer for ``rows`` rows, the rows no matcher fills whole all ones."""
    mask = follows[0][0].vocabulary.masks(rows)
    filled = {row for _, row, drafts in follows if not drafts}  # whole rows llguidance writes
    if len(filled) < rows:
        free = torch.ones(rows, dtype=torch.bool)
        free[list(filled)] = False
        mask[free] = -1
    return mask


def _fill(mask: torch.Tensor, follows: Sequence[Follow], begun: threading.Event | None = None
          ) -> torch.Tensor:
    """llguidance's masks for ``follows`` written into ``mask`` (its rows; drops the GIL meanwhile);
    ``begun`` set just before llguidance's first call (or as this fails before it). The tokens the
    matchers are owed are stepped first, all at once; each matcher filled whole keeps its row."""
    try:
        vocabulary = follows[0][0].vocabulary
        vocabulary.fills += 1
        rows = mask.shape[0]
        owing = [matcher for matcher, _, _ in follows if matcher.owed is not None]
        owed = [(matcher.inner, matcher.owed) for matcher in owing]
        for matcher in owing:
            matcher.owed = None
        plain = [(matcher.inner, row) for matcher, row, drafts in follows if not drafts]
        drafted = [(matcher.inner, row, list(drafts)) for matcher, row, drafts in follows if drafts]
        # straight into the tensor's memory (llguidance.torch's helpers do the same, but importing that
        # module compiles a kernel with torch.compile)
        width = vocabulary.words * 4
        words = mask.numpy()
        for matcher, row, drafts in follows:
            matcher.row = None if drafts else (words, row, vocabulary.fills)
    finally:
        if begun is not None:  # the caller waits for it, whatever happens here
            begun.set()
    if owed:
        verdicts = vocabulary.executor.consume_token_par(owed)
        refused = [token for (_, token), ok in zip(owed, verdicts, strict=True) if not ok]
        if refused:  # each passed its mask's bit: llguidance against its own mask
            raise GrammarRefused(f"tokens {refused} are not allowed by their replies' grammars")
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
