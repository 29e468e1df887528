"""The walk of one chat request in the HTTP process: which of the engine's files its code enters,
in order, from the app's door to the ``AddRequest`` it sends the scheduler process (the socket's
protocol class runs under the app and is not counted). A plain chat request (no tools, no
guide) over a tiny random model; calls traced with a profiler in every thread.

    .venv/bin/python bench/request_walk.py [TREE]

``TREE``: the checkout to walk (another commit's, beside this one), by default this one. Prints
the calls up to ``EngineDriver.submit`` (``stops``: a call into a file other than the caller's),
the files, and how many stops return to a file already left.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import threading
from pathlib import Path

TREE = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1]).resolve()
sys.path.insert(0, str(TREE))

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2}


def walk() -> list[tuple[str, str]]:
    """(file, function) for each call that enters a file other than the caller's."""
    import httpx

    from engine.config import EngineConfig
    from engine.server.app import create_app
    from engine.server.driver import EngineDriver
    from tests.tiny_model import make_tiny_model

    folder = Path(tempfile.mkdtemp())
    model = make_tiny_model(folder / "m")
    config = EngineConfig.from_kwargs(
        model=str(model), kv_tokens=1024, log_file=str(folder / "log.jsonl")
    )
    driver = EngineDriver(config)
    driver.start()
    app = create_app(driver, "m")
    engine = f"{TREE / 'engine'}/"
    stops: list[tuple[str, str]] = []
    submitted = threading.Event()

    def profile(frame, event, arg):
        code = frame.f_code
        if submitted.is_set() or event != "call" or code.co_name == "<module>":
            return
        if code.co_filename.startswith(engine):
            where = code.co_filename[len(str(TREE)) + 1 :]
            if not stops or stops[-1][0] != where:
                stops.append((where, code.co_name))
            if where.endswith("driver.py") and code.co_name == "submit":
                submitted.set()  # the call that sends AddRequest: the scheduler's door

    async def ask() -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            threading.setprofile(profile)
            sys.setprofile(profile)
            answer = await client.post("/v1/chat/completions", json=BODY)
            sys.setprofile(None)
            threading.setprofile(None)
            return answer.status_code

    status = asyncio.run(ask())
    assert status == 200, status  # the walk of a request that was served, nothing else
    assert submitted.is_set(), "the request never reached EngineDriver.submit"
    return stops


def main() -> None:
    stops = walk()
    files = list(dict.fromkeys(f for f, _ in stops))
    returns = sum(1 for i, (f, _) in enumerate(stops) if f in {g for g, _ in stops[: i - 1]})
    print(f"tree {TREE}")
    print(f"stops {len(stops)}  files {len(files)}  returns {returns}")
    for f in files:
        print(f"  {f}")
    os._exit(0)  # the scheduler process is a daemon of this one


if __name__ == "__main__":
    main()
