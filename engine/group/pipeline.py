"""Pipeline stages (``--pp N``): which of the model's layers a stage runs, and how a batch's
activations cross from one stage to the next and its logits come back to every rank.

A stage receives each micro-batch's residual stream and normed input from the stage before it
(the first stage embeds the tokens instead), runs its layers, and sends both on; the last stage
computes the logits, which its first shard broadcasts to every rank, so every rank samples the
same tokens and steps the same scheduler. Sends do not wait: a stage computes its next
micro-batch while the one before crosses, so stages overlap within a batch (``drain`` waits for
the sends before the batch ends). ``Stage`` is one stage alone: nothing crosses."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """The layers stage ``stage`` of ``pp`` runs: contiguous, the earlier stages one more where
    they do not divide evenly."""
    if not 1 <= pp <= num_layers:
        raise ValueError(f"pp {pp} must be between 1 and the model's {num_layers} layers")
    base, extra = divmod(num_layers, pp)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (stage < extra))


class Stage:
    """One stage alone (``pp`` 1): the whole model runs here and nothing crosses."""

    index, count = 0, 1

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def send(self, tensors: list[torch.Tensor]) -> None:
        """Hand ``tensors`` to the next stage (without waiting for it to take them)."""
        raise RuntimeError("the last stage sends nothing on")

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, n: int) -> list[torch.Tensor]:
        """``n`` tensors of ``shape`` from the stage before, in the order it sent them."""
        raise RuntimeError("the first stage receives nothing")

    def drain(self) -> None:
        """Wait until every tensor sent has been taken."""

    def share(self, logits: torch.Tensor | None, shape: tuple[int, int]) -> torch.Tensor:
        """The last stage's ``logits`` on every rank (the others pass None and ``shape``)."""
        assert logits is not None
        return logits


class TorchStage(Stage):
    """Stage ``rank // tp`` of ``pp`` in a ``torch.distributed`` group: it talks to the same
    shard of the stages beside it; the last stage's first shard broadcasts the logits over the
    whole group. ``call`` turns a failed send or wait into the group's failure."""

    def __init__(
        self,
        dist: ModuleType,  # torch.distributed, imported by the comm that makes the group
        rank: int,
        tp: int,
        pp: int,
        device: torch.device,
        call: Callable[..., Any],  # ``TorchComm._call``: a failed send or wait, the group's
    ):
        self.dist, self.call, self.device = dist, call, device
        self.index, self.count = rank // tp, pp
        self.prev, self.next = rank - tp, rank + tp
        self.logits_from = (pp - 1) * tp  # the last stage's first shard
        self._sent: list[Any] = []
        self._taken = 0  # tensors received in this batch: each crossing has its own tag

    def send(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:  # sends in flight together may arrive in any order: tags name them
            t, tag = t.contiguous(), len(self._sent)
            self._sent.append((t, self.call("stage send", self.dist.isend, t, self.next, tag=tag)))

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, n: int) -> list[torch.Tensor]:
        out = [torch.empty(shape, dtype=dtype, device=self.device) for _ in range(n)]
        for t in out:
            self.call("stage recv", self.dist.recv, t, self.prev, tag=self._taken)
            self._taken += 1
        return out

    def drain(self) -> None:
        sent, self._sent, self._taken = self._sent, [], 0
        for _, work in sent:
            self.call("stage send", work.wait)

    def share(self, logits: torch.Tensor | None, shape: tuple[int, int]) -> torch.Tensor:
        if logits is None:
            logits = torch.empty(shape, dtype=torch.float32, device=self.device)
        else:  # gloo sends the storage from the first element on: a strided view would be wrong
            logits = logits.contiguous()
        self.call("logits broadcast", self.dist.broadcast, logits, self.logits_from)
        return logits
