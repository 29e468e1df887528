"""The relief ladder (law 4): providers asked in order, each fallible, each outcome a receipt.

Providers are rank-local by contract: where the ladder is asked the group has committed to a
batch (or is about to), and a provider taking a collective would hang the first time one rank
arrived alone. An empty registry (``--relief-ladder off``) is a legitimate state and says so
once, so "no relief existed" is never silent. The production rungs are in ``rungs.py``.

The ladder is asked where memory runs short, and says where (``site``): ``decode`` (the step's
decode tokens cannot be funded), ``park`` (the in-flight chunked prefill would park: the budget
cannot fund one page of it), ``admission`` (the chunks admission planned on evictable tokens
must now be paid), ``alloc_net`` (an allocation failed after flushing staged frees). A rung
serves the sites it was registered for: retraction cannot run once the step's batch is being
built, and a provider registered without sites serves the allocation-site net alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from engine.obs import schema
from engine.obs.receipts import Receipts

Provider = Callable[[int], int]  # asked for n tokens, returns the tokens it freed
SITES = ("decode", "park", "admission", "alloc_net")


class ReliefRegistry:
    def __init__(self, receipts: Receipts) -> None:
        self.receipts = receipts
        self.providers: list[tuple[str, Provider, frozenset[str]]] = []
        # the engagement in progress, for rungs that name it in their own receipts
        self.site: str | None = None
        self.rid: str | None = None

    def register(
        self, name: str, provider: Provider, sites: Iterable[str] = ("alloc_net",)
    ) -> None:
        """Add a rung after the ones registered before it, asked at ``sites`` (of ``SITES``)."""
        unknown = set(sites) - set(SITES)
        if unknown:
            raise ValueError(f"relief provider {name!r}: unknown sites {sorted(unknown)}")
        self.providers.append((name, provider, frozenset(sites)))

    def serves(self, site: str) -> bool:
        """Whether any registered rung is asked at ``site``."""
        return any(site in sites for _, _, sites in self.providers)

    def relieve(self, need: int, site: str = "alloc_net", rid: str | None = None) -> int:
        """Ask each provider serving ``site`` once, in order, until ``need`` is met; a provider
        that raises or pays short is an outcome, not a crash. Returns the tokens freed (as the
        providers report them)."""
        if not self.providers:
            self.receipts.notice(
                "empty_relief_registry",
                "no relief provider is registered at the allocation site: "
                "admission is the whole guarantee",
            )
            return 0
        rungs = [(n, p) for n, p, sites in self.providers if site in sites]
        self.receipts.emit(schema.RELIEF_ENGAGE, shortfall=need, rungs=len(rungs), site=site)
        self.site, self.rid = site, rid
        freed = 0
        try:
            for name, provider in rungs:
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
                    schema.RELIEF_RUNG, rung=name, asked=asked, paid=paid, outcome=outcome,
                    error=error, site=site,
                )  # fmt: skip
        finally:
            self.site, self.rid = None, None
        return freed

    def pay(
        self, site: str, need: int, available: Callable[[], int], evict: Callable[..., int]
    ) -> None:
        """Make ``need`` tokens available at ``site``: the ladder first when rungs serve it,
        then the prefix cache's own eviction for whatever is still short (the floor every boot
        has: the evictable counter promised it)."""
        if self.serves(site) and need > available():
            self.relieve(need - available(), site)
        if need > available():
            evict(need - available(), reason=site)
