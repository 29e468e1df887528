"""The relief registry consulted once at an allocation site (law 5).

Providers are rank-local by contract: at the allocation site the group has committed to a batch,
and a provider taking a collective would hang the first time one rank arrived alone. An empty
registry is a legitimate state and says so once, so "no relief existed" is never silent.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.obs import schema
from engine.obs.receipts import Receipts

Provider = Callable[[int], int]  # asked for n tokens, returns the tokens it freed


class ReliefRegistry:
    def __init__(self, receipts: Receipts) -> None:
        self.receipts = receipts
        self.providers: list[tuple[str, Provider]] = []

    def register(self, name: str, provider: Provider) -> None:
        """Add a rung after the ones registered before it. An extension point that only tests
        use today: no provider is registered in production yet, so the net's own eviction is
        the whole relief and the registry says it is empty (once)."""
        self.providers.append((name, provider))

    def relieve(self, need: int) -> int:
        """Ask each provider once, in order, until ``need`` is met; a provider that raises is an
        outcome, not a crash. Returns the tokens freed."""
        if not self.providers:
            self.receipts.notice(
                "empty_relief_registry",
                "no relief provider is registered at the allocation site: "
                "admission is the whole guarantee",
            )
            return 0
        self.receipts.emit(schema.RELIEF_ENGAGE, shortfall=need, rungs=len(self.providers))
        freed = 0
        for name, provider in self.providers:
            if freed >= need:
                break
            asked = need - freed
            try:
                paid = max(0, int(provider(asked)))
                outcome, error = ("paid" if paid >= asked else "short"), None
            except Exception as e:  # an outcome, not a crash: the ladder goes on
                paid, outcome, error = 0, "raised", f"{type(e).__name__}: {e}"
            freed += paid
            self.receipts.emit(
                schema.RELIEF_RUNG, rung=name, asked=asked, paid=paid, outcome=outcome, error=error
            )
        return freed
