"""Data-parallel model replicas on several devices inside one process (the engines' trainers and workers).

One *master* model lives on the first device and is what the optimiser updates; every further device trains a
replica. An iteration runs each replica on its share, :meth:`Replicas.reduce` sums the replicas' parameter
gradients into the master's (the all-reduce of data-parallel training), the optimiser steps once on the master,
and :meth:`Replicas.sync` copies its parameters back into the replicas. Threads drive the devices (CPU "devices"
in tests, GPUs otherwise); the same code runs both.
"""

from __future__ import annotations

import copy

import torch

from gnnscale.nn.model import GNN


class Replicas:
    """``models[0]`` is the master (the model passed in, on ``devices[0]``), ``models[i]`` its replica on
    ``devices[i]``."""

    def __init__(self, model: GNN, devices: list[torch.device]):
        self.devices = list(devices)
        self.models = [model] + [copy.deepcopy(model).to(d) for d in self.devices[1:]]

    def __len__(self) -> int:
        return len(self.models)

    def sync(self) -> None:
        """Replicas take the master's parameters and train/eval mode; their gradients are cleared."""
        master = self.models[0]
        for replica in self.models[1:]:
            with torch.no_grad():
                for p, q in zip(master.parameters(), replica.parameters(), strict=True):
                    q.copy_(p)
            replica.zero_grad(set_to_none=True)
            replica.train(master.training)

    def reduce(self) -> None:
        """Sum the replicas' parameter gradients into the master's (a replica without a gradient adds nothing)."""
        for replica in self.models[1:]:
            for p, q in zip(self.models[0].parameters(), replica.parameters(), strict=True):
                if q.grad is None:
                    continue
                g = q.grad.to(p.device)
                p.grad = g if p.grad is None else p.grad.add_(g)
