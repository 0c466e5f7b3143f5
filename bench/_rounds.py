"""Alternating rounds, shared by bench/producer.py and bench/consumer.py.

A machine's speed drifts between runs (other work on its cores, caches,
clocks), so one run of A then one of B measures the drift as much as A and B.
Instead, each round runs every contender of a group once, in an order that
reverses every other round (ABBA: A B, B A, A B, ...), so whoever a drifting
machine favours for going first or last is favoured as often as not; the
figure is the median of the per-round ratios, which one disturbed round does
not move.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any


def order(names: Sequence[str], round_: int) -> list[str]:
    """The order of `names` in round `round_` (from 0): as given in even rounds, reversed in odd ones."""
    return list(names) if round_ % 2 == 0 else list(reversed(names))


def run_rounds(
    rounds: int, groups: Sequence[Sequence[str]], run: Callable[[str, int], float]
) -> dict[str, list[float]]:
    """Each contender's seconds per round: `run(name, round_)` for every name of every group, in `order`."""
    runs: dict[str, list[float]] = {name: [] for group in groups for name in group}
    for round_ in range(rounds):
        for group in groups:
            for name in order(group, round_):
                runs[name].append(run(name, round_))
    return runs


def ratios(seconds: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Per round, a contender's throughput over the baseline's (same work): baseline s / contender s."""
    return [b / s for s, b in zip(seconds, baseline, strict=True)]


def throughput(seconds: Sequence[float], work: int) -> dict[str, Any]:
    """The JSON row of one contender: its seconds per round, and `work` over the median of them."""
    return {
        "seconds": [round(s, 3) for s in seconds],
        "messagesPerSecond": round(work / statistics.median(seconds)),
    }
