"""The cases of the start test: for each demo, each row's edges and a few values between, and pairs.

How the cases are chosen, row by row of the environment table (its kinds, bounds and steps, so a row
added later is covered without a line here):

- a switch: 0 and 1; a choice: every value; a number: its least and greatest legal values, 0 where it
  means off, ``auto`` where allowed, the geometric middle (on the row's step) and one value drawn
  between the edges by a random generator seeded with the row's name (the same value every run);
  (TF_POOL_GIB's between 0.001 and 1 GiB: the host's memory is the suite's too);
- a path: a fresh one under the case's directory, a socket's at the longest length the row accepts
  (107 bytes); TF_MODEL: a tiny checkpoint of the demo's family, written by transformers;
- a host: a name and the wildcard address; a name, a key list: the shortest and the longest;
- the value equal to the row's default is left out (the demo's case of no rows is that one).

Then pairs of rows that constrain each other, at their corners: pages with state pages (each family's
pair), context with parallel, the pool's size and the model's positions, drafts with their count and
MTP lanes, learning with the prompt cache, its keep gain and the context, the step's rows with the
context, tensor parallel at a size the demos split into, with learning, and with experts placed.

Left out, and where they are covered: TF_SHAPE (a released model's shape is up to 8 GiB of random
weights on the CPU: test_shape_serving starts one on a GPU), TF_DEMO (each case names its demo),
TF_WARM_UP=full (a minute of the CPU's interpreter: test_warm_up starts it, with TF_QUEUE_LIMIT=0),
and TF_PORT's default 8000 and values under 1024 (another program may hold the one, the others need
root): it starts at 0, a port free at the time, and 65535 (with one demo: the two files run at once).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from starts import CHECKPOINT, FREE_PORT, WORKDIR, Case

from tfd.env import Table
from tfd.env_kinds import UNIX_PATH_MAX, Choice, FilePath, Host, Integer, Name, Real, Secret, Switch
from tfd.env_rows import Row

DEMOS = ("qwen3_5", "flashnext")
SKIPPED = {"TF_SHAPE", "TF_DEMO"}
SKIPPED_VALUES = {("TF_WARM_UP", "full"), ("TF_PORT", "8000")}
# The values between a row's edges stay under this for rows the CPU allocates at once: the host's memory
# is shared with the suite's other processes (the greatest value is started, and refused by name).
BETWEEN_CEILING = {"TF_POOL_GIB": 1.0}
PAIRS: tuple[dict[str, str], ...] = (
    {"TF_KV_PAGES": "0", "TF_STATE_PAGES": "0"},
    {"TF_KV_PAGES": "0", "TF_STATE_PAGES": "1"},
    {"TF_KV_PAGES": "16", "TF_STATE_PAGES": "0"},
    {"TF_KV_PAGES": "32", "TF_STATE_PAGES": "0"},
    {"TF_KV_PAGES": "8192", "TF_STATE_PAGES": "0"},
    {"TF_FLASHNEXT_KV_PAGES": "0", "TF_FLASHNEXT_STATE_PAGES": "1"},
    {"TF_FLASHNEXT_KV_PAGES": "32", "TF_FLASHNEXT_STATE_PAGES": "0"},
    {"TF_FLASHNEXT_KV_PAGES": "8192", "TF_FLASHNEXT_STATE_PAGES": "1"},
    {"TF_KV_PAGES": "0", "TF_FLASHNEXT_KV_PAGES": "16"},
    {"TF_CONTEXT": "16", "TF_PARALLEL": "4096", "TF_POOL_GIB": "0.001"},
    {"TF_CONTEXT": "16", "TF_PARALLEL": "4096"},
    {"TF_CONTEXT": "4194304", "TF_PARALLEL": "1", "TF_POOL_GIB": "16384"},
    {"TF_CONTEXT": "4194304", "TF_POOL_GIB": "0.001"},
    {"TF_CONTEXT": "16", "TF_POOL_GIB": "0.001", "TF_KV_PAGES": "16"},
    {"TF_PARALLEL": "1", "TF_POOL_GIB": "0.001"},
    {"TF_CONTEXT": "32768", "TF_POOL_GIB": "0.5"},  # the demos' positions (max_position_embeddings)
    {"TF_CONTEXT": "32769", "TF_POOL_GIB": "0.5"},
    {"TF_DRAFTS": "1", "TF_MTP_DRAFTS": "8", "TF_MTP_MAX_LANES": "0"},
    {"TF_DRAFTS": "1", "TF_MTP_DRAFTS": "8", "TF_MTP_MAX_LANES": "4096"},
    {"TF_DRAFTS": "0", "TF_MTP_DRAFTS": "8", "TF_MTP_MAX_LANES": "4096"},
    {"TF_DRAFTS": "1", "TF_MTP_DRAFTS": "8", "TF_CONTEXT": "16"},
    {"TF_LEARN_CONVERSATIONS": "1", "TF_PROMPT_CACHE_GIB": "0"},
    {"TF_LEARN_CONVERSATIONS": "1", "TF_PROMPT_CACHE_GIB": "16384"},
    {"TF_LEARN_CONVERSATIONS": "1", "TF_LEARN_GIB": "0.001", "TF_LEARN_MIN_FREE_GIB": "1048576"},
    {"TF_LEARN_CONVERSATIONS": "1", "TF_IMPRINT_VERIFY": "1", "TF_CONTEXT": "16"},
    {"TF_LEARN_CONVERSATIONS": "1", "TF_CONTEXT": "129"},  # the identity probe's 129 tokens and one
    {"TF_LEARN_CONVERSATIONS": "1", "TF_CONTEXT": "130"},
    {"TF_LEARN_CONVERSATIONS": "1", "TF_PROMPT_CACHE_GIB": "0.000001"},  # under one kept state
    {"TF_PROMPT_CACHE_GIB": "0", "TF_PROMPT_KEEP_GAIN": "0"},
    {"TF_PROMPT_CACHE_GIB": "0", "TF_PROMPT_KEEP_GAIN": "1048576"},
    {"TF_TENSOR_PARALLEL": "2"},  # the demos' heads split into 2 (and refuse 4: the edges' cases)
    {"TF_TENSOR_PARALLEL": "2", "TF_LEARN_CONVERSATIONS": "1"},
    {"TF_TENSOR_PARALLEL": "2", "TF_EXPERT_PARALLEL": "1"},  # Flash Next's experts placed; Qwen3.5's: none
    {"TF_STEP_TOKENS": "64", "TF_CONTEXT": "4194304", "TF_POOL_GIB": "16384"},
    {"TF_STEP_TOKENS": "65536", "TF_CONTEXT": "16"},
)


def cases(table: Table, demo: str) -> list[Case]:
    """Every case of ``demo``: no rows, each row's values alone, then the pairs."""
    found = [Case(demo, {})]
    for row in table.rows:
        if row.name in SKIPPED:
            continue
        for value in values(row, demo):
            if value != row.default and (row.name, value) not in SKIPPED_VALUES:
                found.append(Case(demo, {row.name: value}))
    found += [Case(demo, pair) for pair in PAIRS]
    return found


def values(row: Row, demo: str) -> list[str]:
    """The values a row is started with, in order, without repeats."""
    return list(dict.fromkeys(_values(row, demo)))


def _values(row: Row, demo: str) -> Iterator[str]:
    kind = row.kind
    rng = random.Random(row.name)
    if isinstance(kind, Switch):
        yield from ("0", "1")
    elif isinstance(kind, Choice):
        yield from kind.values
    elif row.name == "TF_PORT":  # below 1024 needs root; one demo takes 65535, so two files never race
        yield from ("0", FREE_PORT) + (("65535",) if demo == DEMOS[0] else ())
    elif isinstance(kind, Integer):
        yield from ["auto"] * kind.auto + ["0"] * kind.zero_off
        low, high, step = kind.low, kind.high, kind.step
        middle = _on_step(math.sqrt(max(low, 1) * high), low, high, step)
        drawn = _on_step(math.exp(rng.uniform(math.log(max(low, 1)), math.log(high))), low, high, step)
        yield from (str(low), str(high), str(middle), str(drawn))
    elif isinstance(kind, Real):
        yield from ["auto"] * kind.auto
        low, high = kind.low, kind.high
        yield from (_number(low), _number(high))
        floor = low if low > 0 else min(high, 0.01)  # a zero least value: the middle from a hundredth
        high = min(high, BETWEEN_CEILING.get(row.name, high))
        drawn = math.exp(rng.uniform(math.log(floor), math.log(high)))
        yield from (_number(math.sqrt(floor * high)), _number(drawn))
    elif isinstance(kind, FilePath):
        if row.name == "TF_MODEL":
            yield CHECKPOINT
        elif kind.socket:
            yield f"{WORKDIR}/{row.name.lower()}.sock"
            yield f"{WORKDIR}/" + "s" * UNIX_PATH_MAX  # the harness cuts it to the longest accepted
        else:
            yield f"{WORKDIR}/{row.name.lower()}"
    elif isinstance(kind, Host):
        yield from ("localhost", "0.0.0.0")
    elif isinstance(kind, Name):
        yield from ("m", "~" * 256)
    elif isinstance(kind, Secret):
        yield from ("k", "k-1,k-2," + "K" * 200)
    else:
        raise TypeError(f"{row.name}: no start values for a {type(kind).__name__} row; add them here")


def _on_step(value: float, low: int, high: int, step: int) -> int:
    return min(high, max(low, round(value / step) * step))


def _number(value: float) -> str:
    """A number as a row reads it: 30, not 30.0; three significant digits between the edges."""
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.3g}" if "e" not in f"{value:.3g}" else repr(round(value, 6))
