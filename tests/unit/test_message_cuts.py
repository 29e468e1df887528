"""Text shortened for a message is cut between whole words, never inside one, and says how
many it left out: a number, an address or a path cut short reads as another one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.core.engine_core import EngineCore
from engine.group.comm import GroupFailure
from engine.observability.clip import clip
from measure.loadgen import LoadResult

WORDS = " ".join(f"peer [10.0.{i}.1]:29500 closed after {8192 + i} tokens;" for i in range(60))


def _whole_words(shown: str, source: str) -> None:
    body, _, left = shown.partition(" ... (")
    words = body.split(" ")
    assert words == source.split(" ")[: len(words)], shown[-80:]
    assert left == f"{len(source.split(' ')) - len(words)} more words)", shown[-80:]


def test_a_load_failure_is_kept_in_whole_words():
    res = LoadResult()
    res.fail(WORDS)
    _whole_words(res.failures[0], WORDS)


def test_a_group_failure_reaches_boot_stop_in_whole_words():
    ended: dict = {}
    core = SimpleNamespace(
        _stopped=False,
        member=None,
        comm=SimpleNamespace(close=lambda: None),
        _end_boot=lambda reason, outs, **fields: ended.update(fields, reason=reason),
    )
    EngineCore.fail(core, GroupFailure(WORDS))
    assert ended["reason"] == "rank_lost"
    _whole_words(ended["error"], WORDS)


@pytest.mark.parametrize(
    ("items", "limit", "want"),
    [
        (["a", "bb", "ccc"], 10, "a bb ccc"),
        (["a", "bb", "ccc"], 4, "a bb ... (1 more word)"),
        (["a", "bb", "ccc"], 1, "a ... (2 more words)"),
        (["a-long-first-one", "b"], 3, "a-long-first-one ... (1 more word)"),  # never cut inside
        ([], 3, ""),
    ],
)
def test_clip_keeps_whole_items_and_counts_the_rest(items, limit, want):
    assert clip(items, limit) == want
