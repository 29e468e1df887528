"""`engine bench`: offline throughput against transformers (``run_offline``), and the
three-engine table, Attest's arms against transformers and llama.cpp on the same GGUF
(``run_table``)."""

from engine.benchmark.offline import ArmResult, run_offline

__all__ = ["ArmResult", "run_offline"]
