"""The real clients' environments: pinned exactly, and a missing one says how to make it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.engine_app import app
from measure.clients import CLIENTS, MissingClient, check, uv_flags


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


PIP_CONFIG = """\
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.find-links='{wheels}'
global.constraint='{constraints}'
global.extra-index-url='file://{mirror} file:///nowhere/simple https://example.test/simple'
global.find-links='{wheels}'
install.index-url='https://pypi.example.test/simple'
global.timeout='60'
"""


def test_pips_configuration_reaches_uv_as_flags(tmp_path):
    wheels, mirror, constraints = tmp_path / "w", tmp_path / "m", tmp_path / "c.txt"
    wheels.mkdir(), mirror.mkdir(), constraints.write_text("torch<=2.14.1\n")
    text = PIP_CONFIG.format(wheels=wheels, mirror=mirror, constraints=constraints)
    flags, env = uv_flags(text)
    pairs = list(zip(flags[::2], flags[1::2]))
    assert pairs == [
        ("--find-links", str(wheels)),  # given twice (environment and file), passed once
        ("--constraint", str(constraints)),
        ("--extra-index-url", f"file://{mirror}"),  # the missing file:// index left out
        ("--extra-index-url", "https://example.test/simple"),
        ("--index-url", "https://pypi.example.test/simple"),
    ]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}  # timeout: no flag


def test_an_empty_pip_configuration_gives_uv_nothing():
    assert uv_flags("") == ([], {})
