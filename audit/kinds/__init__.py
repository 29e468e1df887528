"""Every claim kind the auditor knows, registered once: ``KINDS``, built from the kind modules.

A kind's module holds all of it (``audit.kinds.base.ClaimKind``): its own parameters (a frozen
subclass of ``audit.model.Claim``), its parsing from a ``[[claim]]`` table, its checker, and
whether it can FAIL. The parser, the verdict and the self-test read this registry and nothing
else: a new kind is a module here and its line in ``MODULES``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from audit.checker import Bus, Checker
from audit.kinds import (
    across,
    derived,
    engaged,
    every,
    final,
    invariant,
    never,
    prior,
    ranks_agree,
)
from audit.kinds.base import ClaimKind
from audit.model import Claim

# in the order a spec's error lists the kinds
MODULES = (engaged, never, every, derived, invariant, ranks_agree, final, prior, across)


def registry(kinds: Iterable[ClaimKind]) -> Mapping[str, ClaimKind]:
    """The kinds by name; a name declared twice is refused (one would silently shadow the other)."""
    out: dict[str, ClaimKind] = {}
    for k in kinds:
        if k.name in out:
            raise ValueError(f"claim kind {k.name!r} is registered twice")
        out[k.name] = k
    return MappingProxyType(out)


KINDS = registry(k for m in MODULES for k in m.KINDS)


def build_checker(claim: Claim, bus: Bus) -> Checker:
    """The checker of ``claim``'s kind, subscribed to ``bus``."""
    return KINDS[claim.kind].checker(claim, bus)
