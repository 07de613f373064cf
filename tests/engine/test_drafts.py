"""What a verify round keeps, copy drafts, and a lane's draft counts (pure Python)."""

from __future__ import annotations

import pytest

from tfd.engine.drafts import COPY_MATCH, DraftCounts, copy_drafts, kept

EOS = 7


@pytest.mark.parametrize(("drafts", "sampled", "want"), [
    ([], [5], 1),  # no drafts: the pending row alone
    ([5, 6, 9], [5, 6, 9, 4], 4),  # every draft right: all rows and the bonus token
    ([5, 6, 9], [5, 6, 8, 4], 3),  # the third wrong: rows 0-2 kept, s_2 = 8 replaces it
    ([5, 6, 9], [3, 6, 9, 4], 1),  # the first wrong: later agreement counts for nothing
    ([EOS, 6], [EOS, 6, 1], 1),  # an EOS drawn ends the round, even when the draft guessed it
    ([5, EOS, 2], [5, EOS, 2, 3], 2),  # the EOS row is kept (drawn at row 1), nothing after it
])
def test_a_round_keeps_the_rows_up_to_the_first_wrong_draft(drafts: list[int], sampled: list[int],
                                                             want: int) -> None:
    assert kept(drafts, sampled, {EOS}) == want


def test_a_window_draws_one_token_more_than_it_has_drafts() -> None:
    with pytest.raises(ValueError, match="a window of 2 drafts draws 3 tokens, got 2"):
        kept([1, 2], [1, 2], {EOS})


def test_copy_drafts_continue_the_latest_earlier_occurrence() -> None:
    phrase = list(range(100, 100 + COPY_MATCH))
    context = [1, *phrase, 50, 51, 52, 2, 3, *phrase, 60, 61, 9, *phrase]
    assert copy_drafts(context, 2) == [60, 61]  # the latest occurrence, not the first
    assert copy_drafts(context, 0) == []
    assert copy_drafts([1, *phrase, 50], 3) == []  # the tail never occurred before
    assert copy_drafts(phrase, 3) == []  # the context is the tail alone


def test_copy_drafts_may_overlap_the_tail_and_stop_at_the_context_end() -> None:
    context = [4] * (COPY_MATCH + 3)  # a run: every earlier window matches; the latest is one back
    assert copy_drafts(context, 5) == [4]
    assert copy_drafts([9, 1, 2, 3, 1, 2, 3], 4, match=3) == [1, 2, 3]


def test_draft_counts_add_rounds_and_keep_the_narrowest_window() -> None:
    counts = DraftCounts()
    assert counts.rate is None
    counts.add(3, 4)
    counts.add(2, 1)
    counts.add(0, 1)  # a round without drafts: a window of one row
    assert (counts.rounds, counts.drafted, counts.accepted, counts.narrowest) == (3, 5, 3, 1)
    assert counts.rate == pytest.approx(0.6)
    with pytest.raises(ValueError, match="keeps 1 to 3 rows, got 4"):
        counts.add(2, 4)
