"""The real clients' environments: pinned exactly, and a missing one says how to make it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.engine_app import app
from measure.clients import CLIENTS, MissingClient, check


def test_every_client_is_pinned_to_one_version():
    for name, c in CLIENTS.items():
        assert c.pin == f"{c.dist}{c.extras}=={c.version}" and c.version[0].isdigit(), name
        assert all(p.count("==") == 1 and p.split("==")[1][0].isdigit() for p in c.pins), name


def test_a_missing_environment_names_the_command_that_makes_it(tmp_path):
    with pytest.raises(MissingClient, match=r"engine client-env lm-eval.*lm-eval\[api\]==0\.4\.13"):
        check("lm-eval", tmp_path)


def test_an_unknown_client_is_refused_with_the_known_ones(tmp_path):
    r = CliRunner().invoke(app, ["client-env", "nope", "--root", str(tmp_path)])
    assert r.exit_code == 64 and "guidellm, lm-eval" in r.output
    assert not any(tmp_path.iterdir())  # nothing made
