"""A window's recipe (audit.recipe) as `engine window` reads it, and the load it drives."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from audit.parse import SpecError, parse_spec
from audit.recipe import LOAD_DEFAULTS, Recipe, RecipeError, parse_recipe
from audit.spec import load_spec, shipped
from measure.loadgen import LoadShape, prompts

CLAIM = '\n[[claim]]\nid = "c"\nkind = "engaged"\nselect = { kind = "boot.ready" }\n'


def spec_with(regime: str):
    return parse_spec(
        '[regime]\napplies = { kind = "boot.start" }\n' + regime + CLAIM, Path("w/spec.toml")
    )


def test_a_recipe_reads_flags_load_and_control():
    s = spec_with(
        "[regime.engine]\nkv_tokens = 540\nprefix_cache = false\n"
        "[regime.load]\nrequests = 4\nprompt_tokens = [2, 9]\n"
        '[regime.control]\nrelief_ladder = "off"\n'
    )
    r = s.regime.recipe
    assert r.serve_args() == ["--kv-tokens", "540", "--no-prefix-cache"]
    assert r.serve_args(control=True) == [
        "--kv-tokens",
        "540",
        "--no-prefix-cache",
        "--relief-ladder",
        "off",
    ]
    assert r.load == {**LOAD_DEFAULTS, "requests": 4, "prompt_tokens": [2, 9]}


def test_a_spec_without_a_load_has_no_recipe():
    assert spec_with("").regime.recipe is None


@pytest.mark.parametrize(
    ("regime", "names"),
    [
        ("[regime.load]\nrate = 3\n", "unknown key(s) rate"),
        ("[regime.load]\nprompt_tokens = [9, 2]\n", "prompt_tokens"),
        ("[regime.load]\nrequests = 0\n", "requests"),
        ("[regime.load]\nshared_prefix = 1.5\n", "shared_prefix"),
        ("[regime.load]\nstream = 1\n", "stream"),
        ("[regime.engine]\nkv_tokens = 5\n", "needs a [regime.load]"),
        ("[regime.load]\n[regime.engine]\nkv_tokens = [1]\n", "kv_tokens"),
        ("[regime.load]\nlanes = -1\n", "lanes"),
        ("[regime.load]\n[regime.boots]\ncount = 0\n", "count"),
        ("[regime.load]\n[regime.boots]\nstore = 1\n", "store"),
        ("[regime.load]\n[regime.boots]\nrestarts = 2\n", "[regime.boots] holds"),
        ("[regime.boots]\ncount = 2\n", "needs a [regime.load]"),
    ],
)
def test_a_bad_recipe_is_a_spec_error_naming_the_key(regime, names):
    with pytest.raises(SpecError, match="regime") as e:
        spec_with(regime)
    assert names in str(e.value)


def test_the_engine_drives_every_key_the_auditor_accepts():
    # the two sides of one format: a key the spec accepts must be a field the engine drives
    assert {f.name for f in dataclasses.fields(LoadShape)} == set(LOAD_DEFAULTS)
    defaults = {f.name: f.default for f in dataclasses.fields(LoadShape)}
    assert {k: list(v) if isinstance(v, tuple) else v for k, v in defaults.items()} == LOAD_DEFAULTS


def test_every_shipped_attest_window_has_a_recipe_and_the_foreign_ones_none():
    recipes = {p.name: load_spec(p).regime.recipe for p in shipped()}
    engine_windows = {
        "boot_health",
        "no_request_lost",
        "admission_park",
        "eviction_honesty",
        "relief_ladder",
        "group_agreement",
        "speculation",
        "checkpoint_durability",
        "phase_flip",
    }
    assert {w for w, r in recipes.items() if isinstance(r, Recipe)} == engine_windows
    assert recipes["relief_ladder"].control == (("relief_ladder", "off"),)


def test_prompts_have_exact_lengths_a_shared_prefix_and_repeat_by_seed():
    shape = LoadShape(requests=50, prompt_tokens=(10, 40), output_tokens=(3, 5), shared_prefix=0.5)
    work = prompts(shape)
    assert len(work) == 50 and work == prompts(shape)
    assert all(10 <= len(ids) <= 40 and 3 <= m <= 5 for ids, m in work)
    assert all(ids[:9] == work[0][0][:9] for ids, _ in work)  # 0.5 * 40 = 20 shared, capped at n-1
    assert prompts(dataclasses.replace(shape, seed=1)) != work
    assert (
        len({tuple(ids) for ids, _ in prompts(dataclasses.replace(shape, shared_prefix=0))}) == 50
    )


def test_recipe_errors_are_value_errors():
    with pytest.raises(RecipeError):
        parse_recipe({"load": {"concurrency": -1}}, "w")


def test_a_repeated_run_makes_prompts_with_text_to_copy():
    shape = LoadShape(requests=20, prompt_tokens=(10, 40), output_tokens=(3, 5), repeat=4)
    for ids, _ in prompts(shape):
        assert 10 <= len(ids) <= 40 and ids == (ids[:4] * 10)[: len(ids)]
    with pytest.raises(RecipeError, match="repeat is a whole number >= 0"):
        parse_recipe({"load": {"repeat": -1}}, "[regime]")
