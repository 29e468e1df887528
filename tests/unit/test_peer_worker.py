"""A peer's worker spoken to in JSON lines: its load answer is ``info``, each request gets its
answer, a worker that ends is an error naming whose it was, and close makes it quit. A real
worker process (this interpreter running a short script), not a stand-in."""

from __future__ import annotations

import sys

import pytest

from measure.peer_worker import PeerWorker

SCRIPT = """
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "quit":
        break
    if req["op"] == "die":
        sys.exit(3)
    print(json.dumps({"echo": req}), flush=True)
"""


class Echo(PeerWorker):
    name = "the echo"


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(SCRIPT)
    return path


def test_the_load_answer_is_info_and_each_request_gets_its_answer(script):
    with Echo(sys.executable, script, {"op": "load", "model": "m"}) as w:
        assert w.info == {"echo": {"op": "load", "model": "m"}}
        assert w._ask({"op": "generate", "new": 2}) == {"echo": {"op": "generate", "new": 2}}
    assert w.proc.returncode == 0  # it quit when asked


def test_a_worker_that_ends_is_an_error_naming_whose_it_was(script):
    w = Echo(sys.executable, script, {"op": "load"})
    with pytest.raises(RuntimeError, match=r"the echo's worker ended \(exit 3\)"):
        w._ask({"op": "die"})
    w.close()  # nothing left to close: no hang, no error


def test_a_load_the_worker_dies_on_is_that_error(script):
    with pytest.raises(RuntimeError, match="worker ended"):
        Echo(sys.executable, script, {"op": "die"})
