"""lm-eval (lm-evaluation-harness), a real evaluation client, against `engine serve`: the shipped
tasks (tests/lm_eval_tasks: a multiple-choice one scored by log-likelihood, a generation one)
through lm-eval's ``local-completions`` model (the server's /v1/completions with echo and
logprobs, and its /tokenize routes for the tokens) and through lm-eval's own ``hf`` model on the
same weights. Same accuracy, every choice's log-likelihood within 1e-3 and the same greedy flag,
every generation the same text.

lm-eval runs in its own virtualenv (measure/clients.py), made here on demand when it is
not there: about 45 s once; later runs reuse it. The tiny random model runs by default; the
default model (its GGUF file, which transformers reads too) is a slow test."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from measure.clients import bin_path, ensure
from tests.conftest import requires_default_model, requires_transformers
from tests.e2e.server_proc import ServerProc

pytestmark = requires_transformers

ROOT = Path(__file__).parents[2]  # the tasks' data paths are relative to it
TASKS = ("attest_mc", "attest_gen")
METRICS = {"attest_mc": "acc,none", "attest_gen": "exact_match,strip"}
CLOSE = 1e-3


@pytest.fixture(scope="module")
def lm_eval():
    ensure("lm-eval", ROOT / "build" / "clients")
    return bin_path("lm-eval", "lm_eval", ROOT / "build" / "clients")


class Evaluation:
    """lm_eval on the shipped tasks, started at once; ``answers()`` waits for it."""

    def __init__(
        self, lm_eval: Path, model: str, args: str, out: Path, extra: tuple[str, ...] = ()
    ) -> None:
        env = {
            **os.environ,
            "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_OFFLINE": "1",
            "HF_HOME": str(out / "hf-home"),
            "TOKENIZERS_PARALLELISM": "false",
        }
        cmd = [
            str(lm_eval),
            "--model",
            model,
            "--model_args",
            args,
            "--include_path",
            "tests/lm_eval_tasks",
            "--tasks",
            ",".join(TASKS),
            "--log_samples",
            "--output_path",
            str(out),
            *extra,
        ]
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.log = out, open(out / "lm_eval.log", "w+")  # noqa: SIM115 (answers)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=self.log)

    def answers(self) -> tuple[dict, dict]:
        """({task: metric}, {(task, doc_id): sample})."""
        code = self.proc.wait()
        self.log.seek(0)
        said = self.log.read()
        self.log.close()
        assert code == 0, said[-4000:]
        return read_results(self.out)

    def stop(self) -> None:
        """Ended, whatever happened meanwhile."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def read_results(out: Path) -> tuple[dict, dict]:
    """lm_eval's output in ``out``: ({task: metric}, {(task, doc_id): sample})."""
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    samples = {}
    for path in out.rglob("samples_*.jsonl"):
        task = next(t for t in TASKS if path.name.startswith(f"samples_{t}_"))
        for line in path.read_text().splitlines():
            s = json.loads(line)
            samples[(task, s["doc_id"])] = s
    return {t: results[t][METRICS[t]] for t in TASKS}, samples


def same_answers(server: tuple, hf: tuple) -> None:
    (metrics, samples), (hf_metrics, hf_samples) = server, hf
    assert metrics == hf_metrics
    assert samples.keys() == hf_samples.keys() and len(samples) == 20
    worst = 0.0
    for key, s in samples.items():
        mine, theirs = s["resps"], hf_samples[key]["resps"]
        if key[0] == "attest_mc":
            for [(ll, greedy)], [(hf_ll, hf_greedy)] in zip(mine, theirs, strict=True):
                worst = max(worst, abs(float(ll) - float(hf_ll)))
                assert greedy == hf_greedy, key
        else:
            assert mine == theirs, key
    assert worst < CLOSE, worst
    print(f"\n{metrics}; the largest log-likelihood difference: {worst:.2e}")


def serve_and_evaluate(lm_eval, model: str, tmp: Path, hf_args: str):
    # lm-eval's own reading of the weights needs no server: it runs meanwhile
    hf = Evaluation(lm_eval, "hf", hf_args + ",dtype=float32", tmp / "hf", ("--device", "cpu"))
    try:
        srv = ServerProc(
            tmp / "boot.jsonl", "--model", model, "--kv-tokens", "2048", "--served-model-name", "m"
        )
        try:
            args = f"model=m,base_url={srv.base}/v1/completions,tokenizer_backend=remote,"
            server = Evaluation(
                lm_eval,
                "local-completions",
                args + "num_concurrent=1,max_retries=1",
                tmp / "server",
            ).answers()
        finally:
            code, out = srv.stop()
        assert code == 0 and "Traceback" not in out, out[-3000:]
        hf_answers = hf.answers()
    finally:
        hf.stop()
    same_answers(server, hf_answers)


def test_lm_eval_gets_the_hf_models_answers_from_the_server_tiny(lm_eval, tiny_model_dir, tmp_path):
    serve_and_evaluate(lm_eval, tiny_model_dir, tmp_path, f"pretrained={tiny_model_dir}")


@pytest.mark.slow
@requires_default_model
def test_lm_eval_gets_the_hf_models_answers_from_the_server_default(lm_eval, tmp_path):
    from engine.model.loader import default_model_path

    path = Path(default_model_path())
    hf_args = f"pretrained={path.parent},gguf_file={path.name}"
    serve_and_evaluate(lm_eval, str(path), tmp_path, hf_args)
