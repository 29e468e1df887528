"""A peer's worker spoken to in JSON lines: its load answer is ``info``, each request gets its
answer, a worker that ends is an error naming whose it was, and close makes it quit. A real
worker process (this interpreter running a short script), not a stand-in."""

from __future__ import annotations

import socket
import sys

import httpx
import pytest

from measure.peer_worker import LoopbackServer, PeerWorker

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


HEALTH = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        print("served", self.path, flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_loopback_server_is_up_once_healthy_and_stop_ends_it(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "server.log"
    server = LoopbackServer([sys.executable, "-c", HEALTH, str(port)], port, log, 60, "a peer")
    try:
        assert httpx.get(server.base + "/health").status_code == 200
    finally:
        server.stop()
    assert server.proc.poll() is not None and "served /health" in log.read_text()
    with pytest.raises(RuntimeError, match=r"a peer \(.*\) exited early \(exit 1\)"):
        LoopbackServer([sys.executable, "-c", "raise SystemExit(1)"], port, log, 60, "a peer")
