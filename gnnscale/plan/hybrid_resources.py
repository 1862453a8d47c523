"""What HyScale-GNN's DRM moves (Lin et al., §IV-A): the CPU's threads between its three stages
(:class:`Threads`: ``--threads S,L,T``) and the trainers' shares of every global batch (:func:`rebalance`, by the
cost models :func:`fit_cost` fits to measured iterations); and the checks of the resources a run is given
(``--threads``, ``--devices``)."""

from __future__ import annotations

from dataclasses import dataclass

THREAD_STAGES = {"SC": "sampler", "Load": "loader", "TC": "trainer"}
"""Algorithm 1's CPU stages and the thread pool each one owns."""


@dataclass(frozen=True)
class Threads:
    """The CPU's threads: the CPU sampler's, the feature loader's and the CPU trainer's (``--threads S,L,T``)."""

    sampler: int
    loader: int
    trainer: int

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.sampler, self.loader, self.trainer)

    def move(self, src: str, dst: str) -> Threads | None:
        """One thread from stage ``src`` to stage ``dst`` (Algorithm 1's names); ``None`` when ``src`` has one
        thread left or either is not a CPU stage."""
        if src not in THREAD_STAGES or dst not in THREAD_STAGES or src == dst:
            return None
        counts = {name: getattr(self, name) for name in THREAD_STAGES.values()}
        if counts[THREAD_STAGES[src]] <= 1:
            return None
        counts[THREAD_STAGES[src]] -= 1
        counts[THREAD_STAGES[dst]] += 1
        return Threads(**counts)


def default_threads(cores: int) -> Threads:
    """Half the cores to the CPU trainer, the rest split between the sampler and the loader; one each at least
    (so three threads share fewer than three cores)."""
    trainer = max(1, cores // 2)
    sampler = max(1, (cores - trainer) // 2)
    return Threads(sampler, max(1, cores - trainer - sampler), trainer)


def check_threads(threads: tuple[int, ...], cores: int) -> str | None:
    """Why ``--threads`` cannot run on ``cores`` cores, or ``None``."""
    if len(threads) != 3:
        return f"--threads takes three counts (sampler, loader, CPU trainer), got {len(threads)}"
    if any(t < 1 for t in threads):
        return f"--threads must each be >= 1, got {','.join(map(str, threads))}"
    if max(threads) > cores or sum(threads) > max(cores, 3):
        return (f"--threads {','.join(map(str, threads))} asks for {sum(threads)} threads, more than this "
                f"machine's {cores} cores (they share them: the sum may be at most {max(cores, 3)})")
    return None


def _canonical_device(name: str) -> str:
    """``cpu`` and ``cpu:0`` (``cuda`` and ``cuda:0``) name one device."""
    name = name.strip().lower()
    return f"{name}:0" if name in ("cpu", "cuda") else name


def check_devices(devices: tuple[str, ...]) -> str | None:
    """Why ``--devices`` cannot be the hybrid engine's trainers (a CPU among them, none twice), or ``None``."""
    names = [_canonical_device(d) for d in devices]
    if not any(n.startswith("cpu") for n in names):
        return (f"--devices {','.join(devices)} has no CPU: the hybrid engine trains on the CPU beside the "
                "accelerators; add cpu (e.g. --devices cpu,cuda:0)")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        return (f"--devices {','.join(devices)} lists {', '.join(repeated)} more than once; the hybrid engine runs "
                "one trainer per device (cpu:1, cpu:2, ... stand in for accelerators on a machine without one)")
    return None


Cost = tuple[float, float]
"""A trainer's seconds per iteration as ``a + b * seeds``: a fixed part (launches, the loss, the optimiser's
hand-over) and a part per seed."""


COST_SPREAD = 3.0
"""The least ratio of a trainer's largest to smallest sampled seed count for :func:`fit_cost` to fit a fixed
part: closer counts make the slope mostly noise."""


def fit_cost(samples: list[tuple[int, float]]) -> Cost | None:
    """``(a, b)`` of ``seconds = a + b * seeds`` by least squares over ``(seeds, seconds)`` samples; through zero
    (``a = 0``) when the seed counts vary too little to tell the parts apart (less than :data:`COST_SPREAD`
    times) or the fit is not a cost (a negative part); ``None`` without a sample."""
    pts = [(n, t) for n, t in samples if n > 0 and t > 0]
    if not pts:
        return None
    ns = [n for n, _ in pts]
    proportional = (0.0, sum(t for _, t in pts) / sum(ns))
    if max(ns) < COST_SPREAD * min(ns):
        return proportional
    mn = sum(ns) / len(ns)
    mt = sum(t for _, t in pts) / len(pts)
    b = sum((n - mn) * (t - mt) for n, t in pts) / sum((n - mn) ** 2 for n in ns)
    a = mt - b * mn
    return (a, b) if a >= 0 and b > 0 else proportional


def rebalance(split: list[float], busy: list[float], seeds: list[int], *, min_share: float,
              tolerance: float, costs: list[Cost | None] | None = None) -> list[float] | None:
    """*balance work*: new shares of the global batch under which every trainer takes the same time, the fast
    ones taking work from the slow ones. A trainer's time is its cost model (``costs[g]``, fitted over
    iterations by :func:`fit_cost`) or, without one, this iteration's seconds per seed (``busy[g] / seeds[g]``).
    ``None`` when the times the models give this split already lie within ``tolerance`` of each other. A trainer
    with no seeds keeps its share; none falls below ``min_share``."""
    measured = [g for g in range(len(split)) if seeds[g] > 0 and busy[g] > 0]
    if len(measured) < 2:
        return None
    cost = {g: (costs[g] if costs is not None and costs[g] is not None else None) or (0.0, busy[g] / seeds[g])
            for g in measured}
    times = [cost[g][0] + cost[g][1] * seeds[g] for g in measured]  # what the models say this split costs
    if max(times) <= (1 + tolerance) * min(times):
        return None
    free = sum(split[g] for g in measured)  # the measured trainers' shares are redistributed among themselves
    total = sum(seeds[g] for g in measured)  # ... as seeds of this batch
    floor = min_share * total / free
    floored: set[int] = set()
    while True:  # equal time T over the trainers not held at the floor: sum (T - a) / b = their seeds
        rest = [g for g in measured if g not in floored]
        left = total - floor * len(floored)
        t = (left + sum(cost[g][0] / cost[g][1] for g in rest)) / sum(1 / cost[g][1] for g in rest)
        n = {g: (t - cost[g][0]) / cost[g][1] for g in rest}
        low = [g for g in rest if n[g] < floor]
        if not low or len(low) == len(rest):
            break
        floored.update(low)
    new = list(split)
    for g in measured:
        new[g] = free * (floor if g in floored else n[g]) / total
    return new

