"""One SSE event is one line to every client: text the model writes never splits it.

JSON leaves U+0085, U+2028 and U+2029 unescaped, and clients that split a stream with Python's
``str.splitlines`` rules (httpx's ``iter_lines``) end a line at each of them; a chunk whose text
held one reached such a client as two halves, neither of them JSON.
"""

from __future__ import annotations

import httpx
import orjson
import pytest

from engine.server.responses import sse

BREAKERS = ["\x85", "\u2028", "\u2029", "\r", "\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"]


@pytest.mark.parametrize("ch", BREAKERS, ids=[f"U+{ord(c):04X}" for c in BREAKERS])
def test_an_event_whose_text_holds_a_line_breaker_stays_one_line_to_httpx(ch):
    obj = {"choices": [{"text": f"a{ch}b", "index": 0}]}
    body = sse(obj) + sse(obj) + b"data: [DONE]\n\n"
    with httpx.Client(
        transport=httpx.MockTransport(lambda r: httpx.Response(200, content=body))
    ) as c:
        with c.stream("GET", "http://127.0.0.1/") as r:
            events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert [orjson.loads(e[6:]) for e in events[:-1]] == [obj, obj]
