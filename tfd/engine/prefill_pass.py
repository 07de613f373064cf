"""A step nothing runs ahead of: prompt chunks as spans of one forward, decode rows beside them, the
draws sampled and read on the host.

Decode rows go as one batched step (``DecodePipeline.decode``) when the model batches them, else as
spans of the forward with the prompt chunks; the head runs only on the rows that draw a token, and
the keyed sampler draws them (its cuts, logprobs and grammar masks when a lane asks, the masks
filled on the host while the device runs the step; a decode step's own draw when every lane draws
plainly). A drafting lane's prompt rows go into the MTP head's cache, and a lane
whose prompt ended gets its first drafts. One host sync: the drawn tokens. Engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from tfd.engine.decode_pipeline import DecodePipeline
from tfd.engine.drawn import Drawn, host_draw
from tfd.engine.request import TokenLogprob
from tfd.engine.rounds import Rounds, prompt_absorbs
from tfd.engine.sampling import logprobs
from tfd.engine.scheduler import Work
from tfd.families.hybrid import HybridModel
from tfd.model.memory import PageRows, Span, ints_on
from tfd.model.stack import StackOutput


class PrefillPass:
    """Steps of ``model`` over the pool's ``rows``; ``pipeline``: batched decode steps (None: decode
    rows are spans too); ``rounds``: the verify rounds whose head absorbs drafting lanes' prompts."""

    def __init__(self, model: HybridModel, rows: PageRows, pipeline: DecodePipeline | None,
                 rounds: Rounds | None) -> None:
        self.model = model
        self.rows = rows
        self.pipeline = pipeline
        self.rounds = rounds
        self.device = rows.buffer.device

    @torch.no_grad()
    def run(self, works: Sequence[Work]) -> list[Drawn]:
        """Run ``works`` and wait for their draws."""
        batched = [work for work in works if work.decode and self.pipeline is not None]
        spanned = [work for work in works if not (work.decode and self.pipeline is not None)]
        drawing = [work for work in works if work.samples]
        parts, where, plain_tokens = [], {}, None
        if batched:
            assert self.pipeline is not None
            _, logits, plain_tokens = self.pipeline.decode(batched)
            parts.append(logits)
            where = {id(work): i for i, work in enumerate(batched)}
        output = None
        if spanned:
            output = self.model.forward(self._spans(spanned), self.rows)
            ends: list[int] = []
            at = -1
            for work in spanned:
                at += work.length
                if work.samples:
                    where[id(work)] = len(batched) + len(ends)
                    ends.append(at)  # the work's last row
            if ends:
                parts.append(self.model.logits(output.hidden[ints_on(ends, self.device)]))
        if not drawing:
            if output is not None:
                self._absorb_prompts(spanned, output, {})
            return []
        lanes = [work.lane for work in drawing]
        asked = [lane.request.sampling.logprobs for lane in lanes]
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)  # the model dtype: widened when cut
        only_decode = [id(work) for work in drawing] == [id(work) for work in batched]
        if not only_decode:
            logits = logits[ints_on([where[id(work)] for work in drawing], self.device)]
        if plain_tokens is not None and only_decode and all(lane.drawn_by_step for lane in lanes):
            tokens = plain_tokens  # the draw the step already made, the same bits as ``sample``
        else:
            tokens = host_draw(lanes, logits, self.device)
        details: list[TokenLogprob | None] = [None] * len(lanes)
        if any(n is not None for n in asked):
            top = max(n or 0 for n in asked)
            for i, entry in enumerate(logprobs(logits, tokens, top)):
                n = asked[i]
                if n is not None:
                    details[i] = attrs.evolve(entry, top=entry.top[:n])
        drawn = tokens.tolist()  # the step's one sync with the host
        drafts = {} if output is None else self._absorb_prompts(
            spanned, output, {id(work): token for work, token in zip(drawing, drawn, strict=True)})
        return [Drawn(work, (token,), None if entry is None else (entry,), drafts.get(id(work), ()))
                for work, token, entry in zip(drawing, drawn, details, strict=True)]

    def _absorb_prompts(self, spanned: Sequence[Work], output: StackOutput, drawn: dict[int, int]
                        ) -> dict[int, tuple[int, ...]]:
        """Drafting lanes' prompt rows of this step into the MTP head's cache, each row with the
        token after it (the prompt's, or for its last row the token ``drawn`` now); the first drafts
        of each lane whose prompt ended, by work."""
        if self.rounds is None:
            return {}
        absorbs, owners = prompt_absorbs(spanned, self.model.draft_input(output), drawn, self.rounds.most)
        found = self.rounds.absorb(absorbs) if absorbs else []
        return {id(work): tuple(more) for work, more in zip(owners, found, strict=True)}

    def _spans(self, works: Sequence[Work]) -> list[Span]:
        """The works' spans, their token ids in one host-to-device copy (a pinned block and a copy
        for the step, not for each lane), each span's ids a view of it starting 16 bytes aligned
        (a kernel reading them compiles once, whatever the lengths before)."""
        parts = []
        for work in works:
            lane = work.lane
            parts.append([lane.generated[-1]] if work.decode else
                         lane.request.prompt[work.start:work.start + work.length])
        starts, flat = [], []
        for part in parts:
            starts.append(len(flat))
            flat.extend(part)
            flat.extend([0] * (len(flat) % 2))  # int64: the next part starts on 16 bytes
        held = ints_on(flat, self.device)
        spans = []
        for work, part, start in zip(works, parts, starts, strict=True):
            assert work.lane.memory is not None
            ids = held[start:start + len(part)]
            spans.append(Span(work.lane.memory, work.start, ids, decode=work.decode))
        return spans
