"""The scheduler process's loop never blocks on the pipe while a prepared guide's answer waits to
be sent: a guide found compiled is answered on the loop's next turn, not after the heartbeat's
wait (which, computed before the guide arrived, held every guided request half a second). The
loop is driven by a scripted pipe that records each wait it is asked for: no clock is read."""

from __future__ import annotations

from typing import Any

from engine.guided.compiler import Grammars
from engine.request.guide import Guide
from engine.request.messages import HEARTBEAT_S, GuideReady, PrepareGuide
from engine.server.scheduler_proc import GUIDE_POLL_S, _serve_loop

GUIDE = Guide("json_object")


class Receipts:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def emit(self, event: str, /, **fields: Any) -> None:
        self.kinds.append(event)

    def notice(self, key: str, text: str, **fields: Any) -> None:
        self.kinds.append(key)


class Scheduler:
    """An idle scheduler whose grammars are real, one guide already compiled (a cache hit)."""

    def __init__(self, receipts: Receipts) -> None:
        self.grammars = Grammars(None, 8, receipts, timeout_s=30)  # type: ignore[arg-type]
        self.grammars._cache[GUIDE] = object()  # compiled earlier: prepare answers at once

    def has_work(self) -> bool:
        return False

    def snapshot(self) -> dict[str, Any]:
        return {}


class Core:
    def __init__(self) -> None:
        self.receipts = Receipts()
        self.scheduler = Scheduler(self.receipts)
        self.ended: str | None = None

    def shutdown(self, reason: str) -> None:
        self.ended = reason


class ScriptedPipe:
    """Hands the loop its messages in order; once they are read, a wait that would block is
    the frontend gone (EOFError), so the loop ends there. Records each poll's timeout, each
    message read and each one sent, in order."""

    def __init__(self, *messages: Any) -> None:
        self.script = list(messages)
        self.events: list[tuple[str, Any]] = []

    def poll(self, timeout: float = 0.0) -> bool:
        self.events.append(("poll", timeout))
        if self.script:
            return True
        if timeout > 0:
            raise EOFError  # it would block: the test is over
        return False

    def recv(self) -> Any:
        msg = self.script.pop(0)
        self.events.append(("recv", msg))
        return msg

    def send(self, obj: Any) -> None:
        self.events.append(("send", obj))


def _sent(pipe: ScriptedPipe) -> list[Any]:
    return [x for what, x in pipe.events if what == "send"]


def test_a_guide_found_compiled_is_answered_before_the_loop_waits_again():
    core, pipe = Core(), ScriptedPipe(PrepareGuide(guide=GUIDE, ticket=7))
    _serve_loop(core, pipe)  # type: ignore[arg-type]
    assert GuideReady(ticket=7) in _sent(pipe)
    answered = pipe.events.index(("send", GuideReady(ticket=7)))
    read = pipe.events.index(("recv", PrepareGuide(guide=GUIDE, ticket=7)))
    waits = [x for what, x in pipe.events[read:answered] if what == "poll"]
    assert waits and all(w == 0 for w in waits), pipe.events  # no wait between read and answer
    assert core.receipts.kinds == ["grammar.compile"] and core.ended == "frontend_gone"


def test_an_idle_loop_with_nothing_pending_waits_for_the_heartbeat():
    core, pipe = Core(), ScriptedPipe()
    _serve_loop(core, pipe)  # type: ignore[arg-type]
    assert pipe.events == [("poll", HEARTBEAT_S)]


def test_a_guide_compiling_elsewhere_is_looked_for_every_moment_not_every_heartbeat():
    core, pipe = Core(), ScriptedPipe()
    grammars = core.scheduler.grammars
    grammars._line[Guide("regex", "a+")] = [3]  # waiting for a worker: pending, no answer yet
    grammars.workers = 0  # none frees: it stays pending
    _serve_loop(core, pipe)  # type: ignore[arg-type]
    assert pipe.events[0] == ("poll", GUIDE_POLL_S)
