"""A window's recipe: how `engine window NAME` reaches the regime its claims need on this machine.

In a spec's ``[regime]``: ``[regime.engine]`` holds `engine serve` flags (``kv_tokens = 540`` is
``--kv-tokens 540``; ``true``/``false`` is ``--flag``/``--no-flag``), ``[regime.load]`` the load
shape (request count, prompt and output lengths in tokens, shared-prefix share, a repeated run
for prompts with text to copy, concurrency, duration, passes: waves of the same requests, agent
lanes), ``[regime.control]`` the flags
that switch the mechanism under test off for the control boot (``--control``), and
``[regime.boots]`` how many boots run one after another (``count``) and whether they share a
durable KV store (``store``). The auditor only reads and checks the recipe; the engine drives it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Scalar = str | int | float | bool

# the load shape's keys, their type and default; the engine's LoadShape has the same fields
LOAD_DEFAULTS: dict[str, Any] = {
    "requests": 32,  # requests sent in all (with duration_s: per pass, repeated until it ends)
    "prompt_tokens": [4, 120],  # each prompt's length, uniform in [lo, hi]
    "output_tokens": [8, 60],  # tokens each request generates (ignore_eos)
    "shared_prefix": 0.0,  # share of every prompt that is one common prefix
    "repeat": 0,  # > 0: each prompt's own tokens are a random run of this many, repeated
    "concurrency": 32,  # requests in flight at once
    "duration_s": 0.0,  # 0: send `requests` once; > 0: keep sending until then
    "passes": 1,  # waves: each pass sent whole and answered before the next one is sent
    "stream": True,
    "seed": 0,
    "lanes": 0,  # > 0: this many agent lanes, checkpointed in the first boot, continued after
}


class RecipeError(ValueError):
    """A recipe that cannot be driven; the message names the key."""


@dataclass(frozen=True, slots=True)
class Recipe:
    engine: tuple[tuple[str, Scalar], ...] = ()  # `engine serve` flags, in spec order
    load: dict[str, Any] = field(default_factory=dict)  # every LOAD_DEFAULTS key, checked
    control: tuple[tuple[str, Scalar], ...] = ()  # flag overrides of the control boot
    boots: int = 1  # boots one after another ([regime.boots] count), on one KV store if `store`
    store: bool = False  # the boots share a durable KV store in the window's folder

    def serve_args(self, control: bool = False) -> list[str]:
        """The flags for `engine serve`: the engine table, overridden by the control table's."""
        flags = dict(self.engine)
        if control:
            flags.update(self.control)
        return [a for name, value in flags.items() for a in flag_args(name, value)]


def flag_args(name: str, value: Scalar) -> list[str]:
    flag = "--" + name.replace("_", "-")
    if isinstance(value, bool):
        return [flag if value else "--no-" + name.replace("_", "-")]
    return [flag, str(value)]


def _flags(t: Any, where: str) -> tuple[tuple[str, Scalar], ...]:
    if not isinstance(t, dict):
        raise RecipeError(f"{where} is a table of flag = value")
    for k, v in t.items():
        if not isinstance(v, str | int | float | bool):
            raise RecipeError(f"{where}.{k} is a string, number or boolean, not {v!r}")
    return tuple(t.items())


def _pair(v: Any, where: str) -> list[int]:
    ok = isinstance(v, list) and len(v) == 2 and all(type(x) is int and x >= 0 for x in v)
    if not ok or v[0] > v[1]:
        raise RecipeError(f"{where} is [lo, hi], two whole numbers with 0 <= lo <= hi, not {v!r}")
    return list(v)


def _load(t: Any, where: str) -> dict[str, Any]:
    if not isinstance(t, dict):
        raise RecipeError(f"{where} is a table")
    unknown = sorted(set(t) - set(LOAD_DEFAULTS))
    if unknown:
        raise RecipeError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(LOAD_DEFAULTS)}"
        )
    out = {**LOAD_DEFAULTS, **t}
    for k in ("prompt_tokens", "output_tokens"):
        out[k] = _pair(out[k], f"{where}.{k}")
    for k in ("requests", "concurrency", "seed", "repeat", "lanes", "passes"):
        low = 0 if k in ("seed", "repeat", "lanes") else 1
        if type(out[k]) is not int or out[k] < low:
            raise RecipeError(f"{where}.{k} is a whole number >= {low}")
    for k, hi in (("shared_prefix", 1.0), ("duration_s", 3600.0)):
        if type(out[k]) not in (int, float) or not 0 <= out[k] <= hi:
            raise RecipeError(f"{where}.{k} is a number in [0, {hi:g}]")
    if type(out["stream"]) is not bool:
        raise RecipeError(f"{where}.stream is true or false")
    return out


def parse_recipe(regime: dict[str, Any], where: str) -> Recipe | None:
    """The recipe in a ``[regime]`` table, or None when it has no ``[regime.load]``."""
    if "load" not in regime:
        for k in ("engine", "control", "boots"):
            if k in regime:
                raise RecipeError(f"{where} [regime.{k}] needs a [regime.load] to drive")
        return None
    boots = regime.get("boots", {})
    if not isinstance(boots, dict) or set(boots) - {"count", "store"}:
        raise RecipeError(f"{where} [regime.boots] holds count (boots) and store (true/false)")
    count, store = boots.get("count", 1), boots.get("store", False)
    if type(count) is not int or count < 1 or type(store) is not bool:
        raise RecipeError(f"{where} [regime.boots]: count is a whole number >= 1, store a boolean")
    return Recipe(
        engine=_flags(regime.get("engine", {}), f"{where} [regime.engine]"),
        load=_load(regime["load"], f"{where} [regime.load]"),
        control=_flags(regime.get("control", {}), f"{where} [regime.control]"),
        boots=count,
        store=store,
    )
