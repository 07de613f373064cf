"""What one lane of a hybrid model keeps: rows on the pool's pages, fixed-size state as pieces.

The families describe their layers with these records; the pool's ``Layout`` takes the row parts
and the piece list they give. Shapes and dtypes follow reference/model.md: attention caches in the
model dtype, GDN recurrent states in fp32 as ``[value heads, key dim, value dim]``, conv tails as
the last ``kernel - 1`` inputs of the causal conv.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from tfd.pool.layout import RowPart
from tfd.pool.pieces import Piece


def as_names(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(names)


@attrs.frozen
class AttentionRows:
    """The cache rows of attention layers (the MTP head's layer included, named like any other).

    Every layer keeps K and V per token; a QSA layer (``index_dim`` set) also keeps its raw index
    key per token and one pooled key per block of ``block`` tokens.
    """

    layers: tuple[str, ...] = attrs.field(converter=as_names)
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    index_dim: int | None = None
    block: int = 4

    def parts(self) -> list[RowPart]:
        parts = []
        for layer in self.layers:
            parts += [RowPart(f"{layer}.k", (self.kv_heads, self.head_dim), self.dtype),
                      RowPart(f"{layer}.v", (self.kv_heads, self.head_dim), self.dtype)]
            if self.index_dim is not None:
                parts += [RowPart(f"{layer}.index", (self.index_dim,), self.dtype),
                          RowPart(f"{layer}.pooled", (self.index_dim,), self.dtype, rows=self.block)]
        return parts


@attrs.frozen
class GdnLayers:
    """Gated DeltaNet layers: a recurrent state and a conv tail each."""

    layers: tuple[str, ...] = attrs.field(converter=as_names)
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_kernel: int
    dtype: str = "bfloat16"

    @property
    def conv_channels(self) -> int:
        """q, k and v channels go through the conv together."""
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim

    @property
    def log_width(self) -> int:
        """One verify row of a layer's replay log: k, v, the decay g and beta, in fp32."""
        return self.key_heads * self.key_dim + self.value_heads * self.value_dim + 2 * self.value_heads

    def state(self, layer: str, name: str = "state") -> Piece:
        return Piece(f"{layer}.{name}", (self.value_heads, self.key_dim, self.value_dim), "float32")

    def pieces(self) -> list[Piece]:
        pieces = []
        for layer in self.layers:
            pieces += [self.state(layer),
                       Piece(f"{layer}.conv_tail", (self.conv_kernel - 1, self.conv_channels), self.dtype)]
        return pieces


@attrs.frozen
class PleState:
    """Flash Next's per-layer embedding: the tail of its dilated conv and the n-gram history."""

    width: int  # channels of the conv input: every residual stream of the hidden state
    taps: int  # columns of history the dilated conv reads: (kernel - 1) * dilation
    history: int  # earlier token ids the n-gram hash reads: ngram_size - 1
    dtype: str = "bfloat16"

    def pieces(self) -> list[Piece]:
        return [Piece("ple.tail", (self.taps, self.width), self.dtype),
                Piece("ple.history", (self.history,), "int64")]


@attrs.frozen
class DraftBuffers:
    """What verifying ``window`` rows (the pending token and its drafts) and rolling back need.

    Per GDN layer: the spare state the verify writes, the replay log of each row's k, v, g and
    beta, and each row's conv input; for PLE, each row's conv column and token id; for the MTP
    head, the hidden stack it drafts from and the drafted tokens (DESIGN section 7).
    """

    window: int
    gdn: GdnLayers
    hidden: int  # width of the stack the MTP head reads (all residual streams)
    ple: PleState | None = None

    def pieces(self) -> list[Piece]:
        gdn, rows = self.gdn, self.window
        pieces = []
        for layer in gdn.layers:
            pieces += [gdn.state(layer, "spare"),
                       Piece(f"{layer}.log", (rows, gdn.log_width), "float32"),
                       Piece(f"{layer}.conv_rows", (rows, gdn.conv_channels), gdn.dtype)]
        if self.ple is not None:
            pieces += [Piece("ple.rows", (rows, self.ple.width), self.ple.dtype),
                       Piece("ple.tokens", (rows,), "int64")]
        pieces += [Piece("mtp.hidden", (self.hidden,), "float32"),
                   Piece("mtp.drafts", (rows - 1,), "int64")]
        return pieces


def lane_pieces(gdn: GdnLayers, ple: PleState | None = None,
                drafts: DraftBuffers | None = None) -> list[Piece]:
    """A lane's whole piece list: its own state, then what drafting adds."""
    pieces = gdn.pieces()
    if ple is not None:
        pieces += ple.pieces()
    if drafts is not None:
        pieces += drafts.pieces()
    return pieces
