"""`engine serve --tp 2` on loopback (the tiny model): the ranks a server spawns, and the ranks an
operator starts one per node (`--dist-init env` + `engine worker`), serve, stop together and
write one boot log per rank that the auditor judges as one boot; a rank that dies ends the boot
loudly (`boot.stop` rank_lost, 503s, exit 1). Token equality with tp=1 is tested elsewhere."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import psutil
import pytest

from tests.e2e.audit_cli import audit
from tests.e2e.server_proc import Plain, ServerProc, free_port

POOLS = (1024, 640)  # rank 0's pool, rank 1's: the group decides from the smaller
# --group-timeout for the tests of a rank's death: far above any wait for a live rank on a busy
# machine (a rank importing torch, a slow step), and far above the bounds the tests set on
# seeing a death, which comes from the dead rank's closed sockets, not from this timeout
GROUP_TIMEOUT = "300"
LONG = {"prompt": [7, 8, 9, 10], "max_tokens": 400, "ignore_eos": True}
# what a client reads when a rank is lost (the collective's own text goes to stderr)
LOST = "scheduler failed: the scheduler lost a rank; the server cannot serve"


def receipts(path: Path) -> list[dict]:
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.startswith(b"{")]


def of(recs: list[dict], event: str) -> list[dict]:
    return [r for r in recs if r["event"] == event]


def verdicts(*args: str) -> tuple[int, dict[str, str], dict[str, dict[str, dict]]]:
    """`audit verdict ARGS --json`: (exit status, verdict by spec, claims by spec and id)."""
    r = audit("verdict", *args, "--json")
    assert r.returncode in (0, 1, 2), r.stdout + r.stderr
    d = orjson.loads(r.stdout)
    specs = {s["spec"]: s["verdict"] for s in d["specs"]}
    claims = {s["spec"]: {c["claim"]: c for c in s["claims"]} for s in d["specs"]}
    return r.returncode, specs, claims


def spawned_ranks(srv: ServerProc) -> list[psutil.Process]:
    """The ranks above 0 that the scheduler process (rank 0) started."""
    sched = psutil.Process(srv.scheduler_pid())
    return [c for c in sched.children() if "engine.core.group_boot" in " ".join(c.cmdline())]


class Stream(threading.Thread):
    """A streaming completion in the background: its status and SSE data lines."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.base, self.status, self.lines = base, None, []
        self.first = threading.Event()
        self.start()

    def run(self) -> None:
        with httpx.stream(
            "POST", self.base + "/v1/completions", json={**LONG, "stream": True}, timeout=300
        ) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.lines.append(line[6:])
                    self.first.set()
        self.first.set()


def test_tp2_serves_concurrent_completions_and_its_rank_logs_pass_the_audit(
    tiny_model_dir, tmp_path
):
    logs = tmp_path / "logs"
    logs.mkdir()
    srv = ServerProc(
        logs / "boot.jsonl",
        "--model",
        tiny_model_dir,
        "--tp",
        "2",
        "--kv-tokens",
        ",".join(map(str, POOLS)),
        "--page-size",
        "4",
        "--check-invariants",
        "--served-model-name",
        "tiny",
    )
    try:
        health = httpx.get(srv.base + "/health", timeout=60).json()
        assert health["status"] == "ok"
        models = httpx.get(srv.base + "/v1/models", timeout=60).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
        assert len(spawned_ranks(srv)) == 1
        # 8 x (prompt + 80) tokens is more than rank 1's 640: the published floor binds
        prompts = [[2 + (3 * i + j) % 300 for j in range(5 + i)] for i in range(8)]

        def complete(ids: list[int]) -> httpx.Response:
            return httpx.post(
                srv.base + "/v1/completions",
                timeout=300,
                json={"model": "tiny", "prompt": ids, "max_tokens": 80, "ignore_eos": True},
            )

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(complete, prompts))
    finally:
        code, out = srv.stop()
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers]
    for ids, a in zip(prompts, answers, strict=True):
        u = a.json()["usage"]
        assert (u["prompt_tokens"], u["completion_tokens"]) == (len(ids), 80), u
        assert u["total_tokens"] == len(ids) + 80
        assert a.json()["choices"][0]["finish_reason"] == "length"
    assert code == 0, out

    assert sorted(p.name for p in logs.iterdir() if p.suffix == ".jsonl") == [
        "boot.jsonl",
        "boot.rank1.jsonl",
    ]
    r0, r1 = receipts(logs / "boot.jsonl"), receipts(logs / "boot.rank1.jsonl")
    assert {r["boot"] for r in r0} == {r["boot"] for r in r1} and len({r["boot"] for r in r0}) == 1
    assert ({r["rank"] for r in r0}, {r["rank"] for r in r1}) == ({0}, {1})
    for rank, recs in enumerate((r0, r1)):
        assert of(recs, "boot.start")[0]["config"]["tp"] == 2
        assert of(recs, "boot.pool_sized")[0]["kv_tokens"] == POOLS[rank]
        stop = recs[-1]
        assert (stop["event"], stop["reason"], stop["in_flight"]) == ("boot.stop", "sigterm", 0)
    # every request ran to its end on both ranks, with the same counts
    rids = {a.json()["id"] for a in answers}
    for recs in (r0, r1):
        fin = {r["rid"]: (r["prompt_tokens"], r["tokens"]) for r in of(recs, "request.finish")}
        assert fin == {a.json()["id"]: (len(p), 80) for p, a in zip(prompts, answers, strict=True)}
        assert set(fin) == rids
    # the same batch on both ranks at each iteration, a digest on every one that ran work
    d0 = [(r["iter"], r["digest"]) for r in of(r0, "iteration")]
    d1 = [(r["iter"], r["digest"]) for r in of(r1, "iteration")]
    assert d0 == d1 and len(d0) >= 80 and all(d for _, d in d0)
    # rank 0 decides from the floor rank 1 sets: it binds on rank 0 only, and stays the
    # difference of the pools (both ranks made the same allocations)
    floors = of(r0, "group.floor")
    assert floors and {f["local"] - f["floor"] for f in floors} == {POOLS[0] - POOLS[1]}
    assert of(r1, "group.floor") == []
    assert not of(r0, "invariant.violation") and not of(r1, "invariant.violation")

    code, specs, claims = verdicts(str(logs), "--spec", "group_agreement", "--spec", "boot_health")
    assert (code, specs) == (0, {"group_agreement": "PASS", "boot_health": "PASS"}), claims
    # rank 0's log alone cannot say the group agreed
    code, specs, claims = verdicts(str(logs / "boot.jsonl"), "--spec", "group_agreement")
    assert code == 2 and claims["group_agreement"]["digests_agree"]["reason"] == "rank_missing"


def test_two_nodes_on_loopback_serve_and_stop_together(tiny_model_dir, tmp_path):
    """Rank 0 `engine serve --dist-init env`, rank 1 `engine worker`, as two nodes would run
    them, with the standard torch.distributed environment."""
    logs = tmp_path / "logs"
    logs.mkdir()
    group = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    worker_out = tmp_path / "worker.out"
    with open(worker_out, "w") as f:
        worker = subprocess.Popen(
            [sys.executable, "-m", "cli.engine_app", "worker"],
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, **group, "RANK": "1"},
        )
    try:
        srv = ServerProc(
            logs / "boot.jsonl",
            "--model",
            tiny_model_dir,
            "--tp",
            "2",
            "--dist-init",
            "env",
            "--kv-tokens",
            "1024",
            "--threads",
            "1",
            env={**group, "RANK": "0"},
        )
        try:
            assert spawned_ranks(srv) == []  # the worker is the other rank, not a child
            assert worker.poll() is None
            r = httpx.post(
                srv.base + "/v1/completions",
                timeout=300,
                json={"prompt": [5, 6, 7, 8, 9], "max_tokens": 12, "ignore_eos": True},
            )
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 12
        finally:
            code, out = srv.stop()
        assert code == 0, out
        # it ends with rank 0 (its wait for rank 0's next word breaks with rank 0's sockets);
        # missed, it would wait for good: the limit only has to be finite
        assert worker.wait(120) == 0, worker_out.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    r0, r1 = receipts(logs / "boot.jsonl"), receipts(logs / "boot.rank1.jsonl")
    assert r0[0]["boot"] == r1[0]["boot"]
    assert of(r1, "boot.start")[0]["config"]["dist_init"] == "env"  # rank 0's configuration
    for recs in (r0, r1):
        assert (recs[-1]["event"], recs[-1]["reason"]) == ("boot.stop", "sigterm")
        assert [x["rid"] for x in of(recs, "request.finish")] == [r.json()["id"]]
    code, specs, claims = verdicts(
        str(logs / "boot*.jsonl"), "--spec", "group_agreement", "--spec", "boot_health"
    )
    assert (code, specs) == (0, {"group_agreement": "PASS", "boot_health": "PASS"}), claims


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "dist_init env needs MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK in the environment"),
        (
            {"MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "2", "RANK": "1"},
            "dist_init env needs MASTER_PORT in the environment",
        ),
        (
            {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "0"},
            "RANK 0 is the engine that serves: start it with `engine serve`",
        ),
        (
            {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "x"},
            "RANK and WORLD_SIZE must be integers with 0 <= RANK < WORLD_SIZE, got RANK='x'",
        ),
        (
            {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "2"},
            "0 <= RANK < WORLD_SIZE, got RANK='2' WORLD_SIZE='2'",
        ),
    ],
    ids=["no-env", "no-port", "rank-0", "rank-not-a-number", "rank-past-the-world"],
)
def test_engine_worker_without_its_place_exits_2_naming_what_is_missing(env, message):
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
    }
    done = subprocess.run(
        [sys.executable, "-m", "cli.engine_app", "worker"],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr


def test_a_rank_killed_mid_stream_ends_the_boot_rank_lost_503_and_exit_1(tiny_model_dir, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    # the loss is seen by the dead rank's closed sockets; where gloo misses them (a pair closed
    # between two operations leaves the next one waiting), by the group timeout: 60 s, far
    # below the bounds here and far above any wait for a live rank
    srv = ServerProc(
        logs / "boot.jsonl",
        "--model",
        tiny_model_dir,
        "--tp",
        "2",
        "--kv-tokens",
        "4096",
        "--group-timeout",
        "60",
    )
    try:
        (rank1,) = spawned_ranks(srv)
        assert rank1.cmdline()[rank1.cmdline().index("engine.core.group_boot") + 1] == "1"
        streams = [Stream(srv.base), Stream(srv.base)]
        plain = Plain(srv.base, LONG)
        assert all(s.first.wait(300) for s in streams)
        # mid-stream: the plain request is in the scheduler too, and each stream has tokens
        # behind its first (a loaded machine may take a while between the two)
        deadline = time.monotonic() + 300
        while (h := httpx.get(srv.base + "/health", timeout=60).json())["running"] < 3 or any(
            len(s.lines) < 2 for s in streams
        ):
            assert time.monotonic() < deadline, (h, [len(s.lines) for s in streams])
            time.sleep(0.05)
        assert srv.proc.poll() is None and not any(s.lines[-1] == "[DONE]" for s in streams)
        rank1.kill()
        t0 = time.monotonic()
        for t in (*streams, plain):
            t.join(300)
            if t.is_alive():  # a hang: where each process waits, in the failure's message
                srv.dump_stacks()
                srv.proc.kill()
                raise AssertionError(f"{t} still waits: {srv.proc.communicate()[0]}")
        code, out = srv.stop(signal.SIGCONT)  # no signal needed: it exits by itself
        # seen by the closed sockets, or at the latest by the group timeout (60 s)
        assert time.monotonic() - t0 < 600
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    assert code == 1, out
    assert "the scheduler process died: GroupFailure" in out
    # every request in flight heard why: 503 before the answer, an error event in a stream
    assert plain.status == 503 and LOST in plain.body["error"]["message"]
    for s in streams:
        assert s.status == 200 and s.lines[-1] == "[DONE]"
        error = orjson.loads(s.lines[-2])["error"]
        assert error["code"] == 503 and LOST in error["message"]
    r0 = receipts(logs / "boot.jsonl")
    stop = r0[-1]
    assert (stop["event"], stop["reason"], stop["in_flight"]) == ("boot.stop", "rank_lost", 3)
    # the broken connection is seen a moment before the dead rank is reapable: named anyway
    assert stop["lost_ranks"] == [1], stop
    assert len(of(r0, "boot.stop")) == 1  # the scheduler wrote its end; the frontend did not
    aborts = of(r0, "request.abort")
    assert len(aborts) == 3 and {a["reason"] for a in aborts} == {"rank_lost"}
    assert of(receipts(logs / "boot.rank1.jsonl"), "boot.stop") == []  # killed: no last word
    code, specs, claims = verdicts(str(logs), "--spec", "boot_health")
    assert (code, specs["boot_health"]) == (1, "FAIL")
    assert claims["boot_health"]["stopped_in_order"]["verdict"] == "FAIL"
    assert "rank_lost" in claims["boot_health"]["stopped_in_order"]["why"]


def test_a_rank_lost_while_idle_fails_the_next_request_and_names_the_rank(tiny_model_dir, tmp_path):
    log = tmp_path / "boot.jsonl"
    srv = ServerProc(
        log,
        "--model",
        tiny_model_dir,
        "--tp",
        "2",
        "--kv-tokens",
        "1024",
        "--group-timeout",
        GROUP_TIMEOUT,
    )
    try:
        (rank1,) = spawned_ranks(srv)
        rank1.kill()
        deadline = time.monotonic() + 120
        while rank1.is_running() and rank1.status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # answered at once (the closed sockets), far within the group timeout (300 s)
        r = httpx.post(srv.base + "/v1/completions", json={**LONG, "max_tokens": 8}, timeout=60)
        code, out = srv.stop(signal.SIGCONT)
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
    assert r.status_code == 503 and LOST in r.json()["error"]["message"]
    assert code == 1, out
    stop = receipts(log)[-1]
    assert (stop["event"], stop["reason"]) == ("boot.stop", "rank_lost")
    assert (stop["lost_ranks"], stop["in_flight"]) == ([1], 1)


def test_a_sigterm_to_the_whole_process_group_drains_every_rank_in_order(tiny_model_dir, tmp_path):
    """A supervisor's stop (`kill -- -PGID`, systemd, torchrun) signals every process of the
    group: the frontend drains, and neither the scheduler process nor a rank dies of it."""
    logs = tmp_path / "logs"
    logs.mkdir()
    srv = ServerProc(
        logs / "boot.jsonl",
        "--model",
        tiny_model_dir,
        "--tp",
        "2",
        "--kv-tokens",
        "1024",
        new_session=True,
    )
    r = httpx.post(
        srv.base + "/v1/completions", timeout=300, json={"prompt": [5, 6, 7], "max_tokens": 4}
    )
    assert r.status_code == 200
    os.killpg(srv.proc.pid, signal.SIGTERM)
    code, out = srv.stop()
    assert code == 0, out
    for name in ("boot.jsonl", "boot.rank1.jsonl"):
        stop = receipts(logs / name)[-1]
        assert stop["event"] == "boot.stop" and stop["reason"] == "sigterm", stop


def test_a_split_while_serving_answers_503_exits_1_and_ends_every_rank_log(
    tiny_model_dir, tmp_path
):
    """The test switch --own-pool: each rank decides from its own pool; the larger admits what
    the smaller cannot, the digests differ before the forward, and the group stops."""
    logs = tmp_path / "logs"
    logs.mkdir()
    srv = ServerProc(
        logs / "boot.jsonl",
        "--model",
        tiny_model_dir,
        "--tp",
        "2",
        "--kv-tokens",
        "1024,640",
        "--page-size",
        "4",
        "--check-invariants",
        "--own-pool",
        "--relief-ladder",
        "off",
    )
    prompts = [[2 + (3 * i + j) % 300 for j in range(60 + i)] for i in range(12)]

    def complete(ids: list[int]) -> int:
        try:
            return httpx.post(
                srv.base + "/v1/completions",
                timeout=300,
                json={"prompt": ids, "max_tokens": 60, "ignore_eos": True},
            ).status_code
        except httpx.HTTPError:
            return -1

    with ThreadPoolExecutor(12) as pool:
        codes = list(pool.map(complete, prompts))
    code, out = srv.stop()
    assert code == 1, out
    assert 503 in codes, codes
    for name in ("boot.jsonl", "boot.rank1.jsonl"):
        recs = receipts(logs / name)
        assert [v["what"] for v in of(recs, "invariant.violation")] == ["group_split"]
        assert recs[-1]["event"] == "boot.stop" and recs[-1]["reason"] == "group_split"
    assert len(of(receipts(logs / "boot.jsonl"), "boot.stop")) == 1  # not a second ending


def test_a_layout_cutover_over_http_moves_a_serving_group_and_its_streams_finish(
    six_layers, tmp_path
):
    """`POST /admin/cutover` with kind layout on a served group of two: shards to stages
    while streams run, every stream finishes with all its tokens, the answer says the new
    layout; `engine cutover layout` takes it back; a layout of another rank count is a 400
    naming the numbers, and nothing changes."""
    logs = tmp_path / "logs"
    logs.mkdir()
    srv = ServerProc(
        logs / "boot.jsonl",
        "--model",
        six_layers,
        "--tp",
        "2",
        "--kv-tokens",
        "2048",
        "--page-size",
        "4",
        "--check-invariants",
        "--group-timeout",
        GROUP_TIMEOUT,
    )
    body = {
        "prompt": [5, 6, 7, 8],
        "max_tokens": 60,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    def stream() -> int:  # the tokens the stream's last chunk says it generated
        n = -1
        with httpx.stream("POST", srv.base + "/v1/completions", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and (usage := orjson.loads(line[6:]).get("usage")):
                    n = usage["completion_tokens"]
        return n

    try:
        with ThreadPoolExecutor(4) as pool:
            streams = [pool.submit(stream) for _ in range(4)]
            time.sleep(0.5)  # the streams are in flight (a carry with nobody resident is fine too)
            ask = {"kind": "layout", "mode": "carry", "tp": 1, "pp": 2}
            moved = httpx.post(srv.base + "/admin/cutover", json=ask, timeout=300)
            counts = [s.result() for s in streams]
        bad = httpx.post(
            srv.base + "/admin/cutover",
            timeout=60,
            json={"kind": "layout", "mode": "carry", "tp": 2, "pp": 2},
        )
        back = subprocess.run(
            [
                sys.executable,
                "-m",
                "cli.engine_app",
                "cutover",
                "layout",
                "--tp",
                "2",
                "--pp",
                "1",
                "--url",
                srv.base,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        after = httpx.post(
            srv.base + "/v1/completions",
            timeout=300,
            json={"prompt": [5, 6, 7, 8], "max_tokens": 8},
        )
    finally:
        code, out = srv.stop()
    assert moved.status_code == 200, moved.text
    assert (moved.json()["tp"], moved.json()["pp"], moved.json()["outcome"]) == (1, 2, "ok")
    assert counts == [60] * 4
    assert bad.status_code == 400 and "keeps the group's 2 ranks" in bad.json()["error"]["message"]
    assert back.returncode == 0, back.stderr
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 8
    assert code == 0, out
    for path in (logs / "boot.jsonl", logs / "boot.rank1.jsonl"):
        layouts = [(r["tp"], r["pp"]) for r in of(receipts(path), "group.layout")]
        assert layouts == [(1, 2), (2, 1)]
