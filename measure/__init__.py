"""The measuring tools, outside the product: `engine bench`'s offline throughput against
transformers (``run_offline``) and its three-engine table against llama.cpp, the peers and real
clients they drive, and the load an `engine window` sends a running server (``loadgen``,
``lanes``), with greedy agreement between two engines (``agreement``)."""

from measure.offline import ArmResult, run_offline

__all__ = ["ArmResult", "run_offline"]
