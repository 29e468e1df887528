"""The frontend's side of the process split: the HTTP process imports no torch, what the
scheduler process sends it (typed messages, in order) unpickles without torch too, and a
frontend that cannot set up its HTTP server has the scheduler end the boot saying why."""

from __future__ import annotations

import pickle
import signal
import socket
import subprocess
import sys
from collections import deque
from pathlib import Path

import orjson
import pytest

from engine.config import EngineConfig
from engine.request.messages import (
    AbortRequest,
    AddRequest,
    Heartbeat,
    Notice,
    Outputs,
    Ready,
    Rejected,
    Stop,
    Stopped,
)
from engine.request.sampling_params import SamplingParams
from engine.server import launch
from engine.server.scheduler_proc import scheduler_main
from tests.tiny_model import VOCAB

ROOT = Path(__file__).resolve().parents[2]
# what `engine serve`'s own process imports: the CLI, then the server and what it reads
FRONTEND_MODULES = (
    "cli.engine_app",
    "engine.server.launch",
    "engine.server.app",
    "engine.server.driver",
    "engine.server.protocol",
    "engine.observability.metrics",
    "engine.request.messages",
)


def _fresh_interpreter(code: str) -> str:
    """Run ``code`` in a new interpreter from the repository root; its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _torch_after(setup: str) -> str:
    return _fresh_interpreter(
        f"import sys\n{setup}\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )


def test_the_frontend_modules_import_no_torch():
    assert _torch_after("\n".join(f"import {m}" for m in FRONTEND_MODULES)) == "[]"
    # the check can fail: the engine itself does pull torch in
    assert _torch_after("import engine.core.engine_core") != "[]"


class _Pipe:
    """The scheduler's end of the pipe, in this process: it hands over the frontend's messages
    (``Stop`` only once the scheduler has answered every request) and keeps what it sends."""

    def __init__(self, *incoming: object, answers: int) -> None:
        self.incoming = deque(incoming)
        self.sent: list[object] = []
        self.answers = answers
        self.polls = 0

    def _answered(self) -> int:
        ended = [o for m in self.sent if isinstance(m, Outputs) for o in m.outputs if o.finished]
        return len(ended) + sum(isinstance(m, Rejected) for m in self.sent)

    def poll(self, timeout: float = 0) -> bool:
        self.polls += 1
        assert self.polls < 10_000, f"the scheduler never answered: {self.sent}"
        if not self.incoming:
            return False
        return not isinstance(self.incoming[0], Stop) or self._answered() >= self.answers

    def recv(self) -> object:
        return self.incoming.popleft()

    def send(self, msg: object) -> None:
        self.sent.append(msg)


def _serve(tiny_model_dir: str, log: Path, *incoming: object, answers: int) -> list[object]:
    cfg = EngineConfig.from_kwargs(model=tiny_model_dir, kv_tokens=1024, log_file=str(log))
    pipe = _Pipe(*incoming, answers=answers)
    sigint = signal.getsignal(signal.SIGINT)
    try:
        scheduler_main(cfg, pipe)
    finally:
        signal.signal(signal.SIGINT, sigint)  # scheduler_main ignores SIGINT, as its process must
    return pipe.sent


def test_the_scheduler_answers_in_typed_messages_that_unpickle_without_torch(
    tiny_model_dir, tmp_path
):
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    sent = _serve(
        tiny_model_dir,
        tmp_path / "boot.jsonl",
        Notice(key="hello", text="from the frontend", fields={"process": "frontend"}),
        AddRequest(rid="ok", prompt_ids=[5, 6, 7], params=params),
        AddRequest(rid="bad", prompt_ids=[5, VOCAB + 3], params=params),
        AbortRequest(rid="nobody", reason="client_disconnect"),
        Stop(reason="sigterm"),
        answers=2,
    )
    ready, *middle, stopped = [m for m in sent if not isinstance(m, Heartbeat)]
    assert isinstance(ready, Ready) and ready.info.vocab == VOCAB
    assert stopped == Stopped(reason="sigterm", in_flight=0)
    rejected = [m for m in middle if isinstance(m, Rejected)]
    assert [m.rid for m in rejected] == ["bad"]
    outputs = [m for m in middle if isinstance(m, Outputs)]
    assert len(outputs) + len(rejected) == len(middle)
    ok = [o for m in outputs for o in m.outputs]
    assert {o.rid for o in ok} == {"ok"}
    assert sum(len(o.new_token_ids) for o in ok) == 4 and ok[-1].finish_reason == "length"
    # each snapshot is taken after its step: with the last output, the memory is back
    last = outputs[-1].snapshot
    assert last.running == last.waiting == last.kv_used == 0
    assert last.kv_free + last.kv_evictable == ready.snapshot.kv_free + ready.snapshot.kv_evictable
    # the frontend's notice went into the one boot log, between boot and stop
    recs = [orjson.loads(line) for line in (tmp_path / "boot.jsonl").read_bytes().splitlines()]
    notices = [r for r in recs if r["event"] == "notice" and r.get("process") == "frontend"]
    assert [r["text"] for r in notices] == ["from the frontend"]
    assert recs[-1]["event"] == "boot.stop" and recs[-1]["reason"] == "sigterm"

    path = tmp_path / "sent.pkl"
    path.write_bytes(pickle.dumps(sent))
    # the frontend unpickles each of them (the tokenizer, the outputs) and still has no torch
    assert _torch_after(f"import pickle; pickle.loads(open({str(path)!r}, 'rb').read())") == "[]"


def test_a_frontend_that_cannot_set_up_its_server_ends_the_boot_with_boot_failed(
    tiny_model_dir, tmp_path, monkeypatch
):
    def broken(*args, **kwargs):
        raise OSError("no room for the app")

    monkeypatch.setattr(launch, "create_app", broken)  # this process's; the scheduler's is whole
    log = tmp_path / "boot.jsonl"
    cfg = EngineConfig.from_kwargs(model=tiny_model_dir, kv_tokens=1024, log_file=str(log))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(launch.BootFailed, match="OSError: no room for the app") as failed:
        launch.serve(cfg, port=port)
    assert failed.value.code == 2
    recs = [orjson.loads(line) for line in log.read_bytes().splitlines()]
    assert recs[0]["event"] == "boot.start"
    assert "boot.ready" not in {r["event"] for r in recs}  # it never served
    stop = recs[-1]  # written by the scheduler process, told why in its Stop
    assert stop["event"] == "boot.stop" and stop["reason"] == "boot_failed"
    assert stop["exit_code"] == 2 and stop["error"] == str(failed.value)
    assert (stop["boot"], stop["seq"]) == (recs[0]["boot"], len(recs))
