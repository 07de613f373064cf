"""The load report: how the pool is cut and what a lane costs, as a log line and a dict.

The dict is what the admin ``pool`` command shows beside the census.
"""

from __future__ import annotations

import attrs

from tfd.pool.device_plan import GIB, DevicePlan
from tfd.pool.pages import Pool

MIB = 1 << 20


@attrs.frozen
class LoadReport:
    mode: str
    page_rows: int
    page_bytes: int
    row_bytes: float
    pages: int
    window: int
    pieces_a_lane: int
    piece_bytes_a_lane: int
    state_pages_a_lane: int
    row_pages_a_lane: int
    pages_a_lane: int
    padding_bytes: int
    padding_percent: float
    fixed_bytes_a_lane: int
    outside: tuple[str, ...]
    lane_slots: int | None
    lanes_that_fit: int
    pool_bytes: int
    device: dict[str, int] | None = None  # a GPU's plan (``DevicePlan.as_dict``), then what it measured

    @classmethod
    def of(cls, pool: Pool, window: int, plan: DevicePlan | None = None) -> LoadReport:
        """Figures of ``pool`` for lanes of ``window`` tokens, cut by ``plan`` on a GPU."""
        layout = pool.layout
        piece_map = layout.piece_map
        state_bytes = piece_map.pages * layout.page_bytes
        by_pages = pool.pages // layout.need(window)
        return cls(
            mode=pool.mode.value,
            page_rows=layout.page_rows,
            page_bytes=layout.page_bytes,
            row_bytes=round(layout.row_bytes, 2),
            pages=pool.pages,
            window=window,
            pieces_a_lane=len(layout.pieces),
            piece_bytes_a_lane=piece_map.piece_bytes,
            state_pages_a_lane=piece_map.pages,
            row_pages_a_lane=layout.row_pages(window),
            pages_a_lane=layout.need(window),
            padding_bytes=piece_map.padding_bytes,
            padding_percent=round(100 * piece_map.padding_bytes / state_bytes, 2) if state_bytes else 0.0,
            fixed_bytes_a_lane=layout.fixed_bytes,
            outside=tuple(piece.name for piece in layout.outside),
            lane_slots=pool.max_lanes,
            lanes_that_fit=by_pages if pool.max_lanes is None else min(by_pages, pool.max_lanes),
            pool_bytes=(pool.pages + 1) * layout.page_bytes,
            device=None if plan is None else plan.as_dict(),
        )

    def measured(self, **found: int) -> LoadReport:
        """This report with what the device showed once serving began (graph bytes, free bytes)."""
        return attrs.evolve(self, device={**(self.device or {}), **found})

    def as_dict(self) -> dict[str, object]:
        return attrs.asdict(self)

    def line(self) -> str:
        """One line for the log at load."""
        outside = (f"; {self.fixed_bytes_a_lane / MIB:.2f} MiB a lane outside the pool "
                   f"({', '.join(self.outside)})" if self.fixed_bytes_a_lane else "")
        device = ""
        if self.device is not None:
            gib = {key: value / GIB for key, value in self.device.items()}
            device = (f"; device: {gib['planned_bytes']:.2f} GiB planned: weights {gib['weight_bytes']:.2f}, "
                      f"activations {gib['activation_bytes']:.2f}, graphs {gib['graph_bytes']:.2f}, "
                      f"runtime {gib.get('runtime_bytes', 0):.2f}, reserve {gib['reserve_bytes']:.2f}, "
                      f"pool {self.pool_bytes / GIB:.2f} GiB")
        return (f"pool: {self.pool_bytes / GIB:.3g} GiB, {self.pages} pages of {self.page_rows} rows, "
                f"{self.page_bytes / MIB:.2f} MiB "
                f"each ({self.mode}); a lane of {self.window} tokens: {self.pieces_a_lane} pieces "
                f"({self.piece_bytes_a_lane / MIB:.2f} MiB) on {self.state_pages_a_lane} pages, "
                f"padding {self.padding_bytes / MIB:.2f} MiB ({self.padding_percent} %), "
                f"plus {self.row_pages_a_lane} row pages = {self.pages_a_lane} pages{outside}; "
                f"{self.lanes_that_fit} lanes fit{device}")
