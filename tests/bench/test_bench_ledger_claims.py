"""bench/ledger_claims.py's pairing: which side goes first alternates, and the ratio is the
median of the paired rounds (the benchmark itself needs PostgreSQL and minutes)."""

from __future__ import annotations

import ledger_claims


def test_the_side_that_goes_first_alternates_from_round_to_round():
    # Run second, a side works on the table the other has just grown and filled with dead
    # row versions; always the ledger second biased the ratio against it.
    orders = [ledger_claims.round_order(i) for i in range(4)]
    assert orders == [("baseline", "ledger"), ("ledger", "baseline")] * 2


def test_the_ratio_is_the_median_of_the_paired_rounds():
    # Rounds 100/200, 300/300, 50/200: paired 0.5, 1.0, 0.25 -> 0.5; medians would say 1.0 / 2.
    assert ledger_claims.paired_ratio([100, 300, 50], [200, 300, 200]) == 0.5
