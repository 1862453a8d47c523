"""Data-parallel model replicas on several devices inside one process (the engines' trainers and workers).

One *master* model lives on the first device and is what the optimiser updates; every further device trains a
replica. An iteration runs each replica on its share, :meth:`Replicas.reduce` sums the replicas' parameter
gradients into the master's (the all-reduce of data-parallel training), the optimiser steps once on the master,
and :meth:`Replicas.sync` copies its parameters back into the replicas. Threads drive the devices (CPU "devices"
in tests, GPUs otherwise); the same code runs both.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from gnnscale import runtime as rt
from gnnscale.nn.stack import Stack


class Replicas:
    """``models[master]`` is the master (the model passed in, on ``devices[master]``), ``models[i]`` its replica
    on ``devices[i]`` (a sim device's replica is in host memory, where its tensors are)."""

    def __init__(self, model: Stack, devices: Sequence[rt.Device], master: int = 0):
        self.devices: list[rt.Device] = list(devices)
        self.master = master
        self.models = [model if i == master else copy.deepcopy(model).to(rt.torch_device(d))
                       for i, d in enumerate(self.devices)]

    def _replicas(self) -> list[Stack]:
        return [m for i, m in enumerate(self.models) if i != self.master]

    def __len__(self) -> int:
        return len(self.models)

    def sync(self) -> None:
        """Replicas take the master's parameters, buffers and train/eval mode; their gradients are cleared."""
        master = self.models[self.master]
        for replica in self._replicas():
            with torch.no_grad():
                for p, q in zip(master.parameters(), replica.parameters(), strict=True):
                    q.copy_(p)
                for b, c in zip(master.buffers(), replica.buffers(), strict=True):
                    c.copy_(b)  # BatchNorm's running statistics (a loaded checkpoint's too)
            replica.zero_grad(set_to_none=True)
            replica.train(master.training)

    def reduce(self) -> None:
        """Sum the replicas' parameter gradients into the master's (a replica without a gradient adds nothing)."""
        for replica in self._replicas():
            for p, q in zip(self.models[self.master].parameters(), replica.parameters(), strict=True):
                if q.grad is None:
                    continue
                g = q.grad.to(p.device)
                p.grad = g if p.grad is None else p.grad.add_(g)
