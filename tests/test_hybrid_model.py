"""HyScale-GNN planning pieces: Algorithm 1 (dynamic resource management) as a decision table, every branch,
and the performance model (Eqs. 5-13) against hand calculations."""

from __future__ import annotations

import pytest

from gnnscale.plan.hybrid import Decision, StageTimes, drm_decide


def T(SC: float = 1, Load: float = 1, TC: float = 1, Tran: float | None = 1, TA: float | None = 1,
      SA: float | None = 1) -> StageTimes:
    return StageTimes(SC=SC, Load=Load, TC=TC, Tran=Tran, TA=TA, SA=SA)


@pytest.mark.parametrize(("times", "want"), [
    # line 11: the accelerator sampler is the bottleneck -> move sampling work to the CPU sampler
    (T(SA=9, SC=2), Decision("work", "SA", "SC", "SA")),
    # line 13: the accelerator (transfer and training bundled, line 1) -> move seeds to the CPU trainer
    (T(TA=9, TC=3), Decision("work", "Accel", "TC", "Accel")),
    (T(Tran=9, TA=2, TC=3), Decision("work", "Accel", "TC", "Accel")),  # the transfer counts as the accelerator's
    # line 15: feature loading -> a thread from the fastest CPU task
    (T(Load=9, SC=3, TC=2), Decision("thread", "TC", "Load", "Load")),
    (T(Load=9, SC=1.5, TC=2), Decision("thread", "SC", "Load", "Load")),
    # line 18: CPU sampler, accelerator sampler fastest -> sampling work to the accelerator
    (T(SC=9, SA=0.5, Load=2, TC=2, Tran=1, TA=1), Decision("work", "SC", "SA", "SC")),
    # line 20: CPU sampler, accelerator trainer fastest then accelerator sampler -> the same
    (T(SC=9, Tran=0.2, TA=0.5, SA=0.8, Load=2, TC=2), Decision("work", "SC", "SA", "SC")),
    # line 23: CPU sampler, a CPU task fastest -> a thread from it
    (T(SC=9, Load=0.5, TC=2, Tran=1, TA=1, SA=1), Decision("thread", "Load", "SC", "SC")),
    # line 23 with the accelerator fastest but the CPU trainer second: threads come from the fastest CPU task
    (T(SC=9, Tran=0.2, TA=0.2, TC=0.5, Load=2, SA=3), Decision("thread", "TC", "SC", "SC")),
    # line 26: CPU trainer, accelerator fastest -> seeds to the accelerator
    (T(TC=9, Tran=0.2, TA=0.5, SC=2, Load=2, SA=2), Decision("work", "TC", "Accel", "TC")),
    # line 28: CPU trainer, accelerator sampler fastest then the accelerator trainer -> the same
    (T(TC=9, SA=0.2, Tran=0.3, TA=0.4, SC=2, Load=2), Decision("work", "TC", "Accel", "TC")),
    # line 31: CPU trainer, a CPU task fastest -> a thread from it
    (T(TC=9, Load=0.5, SC=2, SA=2, Tran=1, TA=1), Decision("thread", "Load", "TC", "TC")),
])
def test_every_branch_of_algorithm_1(times: StageTimes, want: Decision) -> None:
    assert drm_decide(times) == want


def test_a_machine_without_accelerator_stages() -> None:
    cpu = dict(Tran=None, TA=None, SA=None)
    assert drm_decide(T(TC=9, Load=1, SC=2, **cpu)) == Decision("thread", "Load", "TC", "TC")
    assert drm_decide(T(SC=9, Load=3, TC=1, **cpu)) == Decision("thread", "TC", "SC", "SC")
    # no GPU sampler: a sampling bottleneck cannot move work, and the accelerator trainer takes seeds alone
    assert drm_decide(T(SC=9, Load=3, TC=2, SA=None, Tran=0.1, TA=0.1)).kind == "thread"
    assert drm_decide(T(TA=9, SA=None)) == Decision("work", "Accel", "TC", "Accel")


def test_ties_are_broken_in_a_fixed_order() -> None:
    assert drm_decide(T()).bottleneck == "SA"  # every stage equal: the first of STAGES
    assert drm_decide(T(SA=None, Tran=None, TA=None)).bottleneck == "SC"


def test_performance_model_equations_5_to_13_by_hand() -> None:
    from gnnscale.plan.hybrid import (
        BatchShape,
        TrainerModel,
        mteps,
        t_aggregate,
        t_execution,
        t_load,
        t_prop,
        t_sync,
        t_trainer,
        t_trans,
        t_update,
    )

    b = BatchShape(dims=(100, 16, 4), edges=(1000, 200), vertices=(300, 50), input_vertices=900)
    cpu = TrainerModel(bandwidth=1e9, macs_per_s=1e10)
    fpga = TrainerModel(bandwidth=4e9, macs_per_s=1e10, pipelined=True)
    assert t_load([b, b], 1e9) == pytest.approx(2 * 900 * 100 * 4 / 1e9)  # Eq. 7: both trainers' features
    assert t_trans(b, 5e8) == pytest.approx(900 * 100 * 4 / 5e8)  # Eq. 8
    a1, a2 = 1000 * 100 * 4 / 1e9, 200 * 16 * 4 / 1e9  # Eq. 11: 4e-4, 1.28e-5
    u1, u2 = 300 * 100 * 16 / 1e10, 50 * 16 * 4 / 1e10  # Eq. 12: 4.8e-5, 3.2e-7
    assert (t_aggregate(b, 1, cpu), t_aggregate(b, 2, cpu)) == pytest.approx((a1, a2))
    assert (t_update(b, 1, cpu), t_update(b, 2, cpu)) == pytest.approx((u1, u2))
    # Eq. 10 on a CPU (⊕ = +): forward a1+u1 + a2+u2, backward u1 + a2+u2
    assert t_trainer(b, cpu) == pytest.approx((a1 + u1 + a2 + u2) + (u1 + a2 + u2))
    # pipelined (⊕ = max), aggregation at 4x the bandwidth
    a1f, a2f = a1 / 4, a2 / 4
    assert t_trainer(b, fpga) == pytest.approx(max(a1f, u1) + max(a2f, u2) + u1 + max(a2f, u2))
    sync = 2 * (100 * 16 + 16 * 4) * 4 / 5e8  # Eq. 13
    assert t_sync(b.dims, 5e8) == pytest.approx(sync)
    assert t_prop([b, b], [cpu, fpga], 5e8) == pytest.approx(t_trainer(b, cpu) + sync)  # Eq. 9: the slowest
    assert t_execution(1e-3, 2e-3, 5e-4, 1e-4) == 2e-3  # Eq. 6
    assert mteps([b, b], 2e-3) == pytest.approx(2 * 1200 / 2e-3 / 1e6)  # Eq. 5
    with pytest.raises(ValueError, match="needs 2 edge and vertex counts"):
        BatchShape(dims=(100, 16, 4), edges=(1000,), vertices=(300, 50), input_vertices=900)
