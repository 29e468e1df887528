"""The batch digest an `iteration` receipt carries with more than one rank: the same batch gives
the same digest in every process, any change of a rid, a token count or the order changes it."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from engine.observability import computed, schema

BATCH = [("r-1", 32), ("r-7", 1), ("r-2", 1)]


def test_a_digest_is_16_hex_characters_and_the_iteration_kind_may_carry_it():
    d = computed.batch_digest(BATCH)
    assert len(d) == 16 and int(d, 16) >= 0
    assert schema.known_field(schema.ITERATION, "digest")
    assert "digest" not in schema.CATALOG[schema.ITERATION].fields  # optional: one rank omits it


def test_the_same_batch_digests_alike_in_another_process():
    code = "from engine.observability import computed; print(computed.batch_digest([('r-1', 32), ('r-7', 1), ('r-2', 1)]))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert outs == {computed.batch_digest(BATCH)}


def test_a_rid_a_token_count_or_the_order_changes_the_digest():
    d = computed.batch_digest(BATCH)
    assert computed.batch_digest([("r-1", 32), ("r-7", 1), ("r-3", 1)]) != d
    assert computed.batch_digest([("r-1", 31), ("r-7", 1), ("r-2", 1)]) != d
    assert computed.batch_digest([("r-7", 1), ("r-1", 32), ("r-2", 1)]) != d
    assert computed.batch_digest(BATCH[:2]) != d
    assert computed.batch_digest([]) != d


def test_entries_cannot_run_into_each_other():
    # a separator inside a rid must not let two different batches spell the same text
    assert computed.batch_digest([("a:1;b", 2)]) != computed.batch_digest([("a", 1), ("b", 2)])
    assert computed.batch_digest([("r-1", 12)]) != computed.batch_digest([("r-11", 2)])


@given(
    st.lists(st.tuples(st.text(max_size=8), st.integers(0, 1 << 20)), max_size=6),
    st.lists(st.tuples(st.text(max_size=8), st.integers(0, 1 << 20)), max_size=6),
)
def test_different_batches_digest_differently(a, b):
    if a != b:
        assert computed.batch_digest(a) != computed.batch_digest(b)
    else:
        assert computed.batch_digest(a) == computed.batch_digest(b)
