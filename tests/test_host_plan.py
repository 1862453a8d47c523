"""The host-memory planner (issue #29, item 4): how a --host-memory budget is split, and refused."""

from __future__ import annotations

import pytest

from gnnscale.errors import ConfigError
from gnnscale.plan.host import VERTEX_ARRAY_BYTES, plan_host, read_buffer_bytes
from gnnscale.store.disk import BUFFER_BYTES
from gnnscale.units import parse_budget

MB = 1 << 20


def test_every_byte_of_the_budget_is_spent_once() -> None:
    p = plan_host(64 * MB, num_nodes=1000, parameters=10_000, row_bytes=800, working_bytes=3 * MB, cache=True)
    assert p.fixed == {"model": 160_000, "vertex arrays": 1000 * VERTEX_ARRAY_BYTES, "read buffer": BUFFER_BYTES,
                       "working set": 3 * MB}
    assert p.fixed_bytes + p.cache_bytes == p.budget
    assert p.spill_bytes == 0 and not p.spills


def test_activations_fill_ram_first_and_the_rest_spills() -> None:
    kw = {"num_nodes": 1000, "parameters": 10_000, "row_bytes": 800, "readers": 2}
    fits = plan_host(64 * MB, activation_bytes=10 * MB, **kw)
    assert fits.ram_activation_bytes == 10 * MB and fits.spill_bytes == 0 and fits.cache_bytes == 0
    big = plan_host(64 * MB, activation_bytes=100 * MB, **kw)
    assert big.ram_activation_bytes == 64 * MB - big.fixed_bytes  # the budget, not a share of it
    assert big.spill_bytes == 100 * MB - big.ram_activation_bytes and big.spills
    assert big.fixed["read buffer"] == 2 * big.buffer_bytes  # one buffer per reader


def test_a_budget_below_the_fixed_parts_is_one_line_naming_them() -> None:
    with pytest.raises(ConfigError) as e:
        plan_host(1 * MB, num_nodes=100_000, parameters=10_000, row_bytes=800)
    msg = str(e.value)
    assert "\n" not in msg and "--host-memory" in msg
    assert "vertex arrays" in msg and "read buffer" in msg and "give at least" in msg


@pytest.mark.parametrize("budget,row,expect", [(256 << 10, 800, 32 << 10), (1 * MB, 800, MB // 8), (4000, 800, 800),
                                               (16 * MB, 800, 2 * MB), (1 << 34, 800, BUFFER_BYTES),
                                               (1 * MB, 1 << 20, 1 << 20)])
def test_read_buffer_follows_the_budget_and_holds_a_row(budget: int, row: int, expect: int) -> None:
    assert read_buffer_bytes(budget, row) == expect


def test_describe_names_cache_and_spill() -> None:
    p = plan_host(64 * MB, num_nodes=10, parameters=10, row_bytes=8, activation_bytes=100 * MB)
    line = p.describe()
    assert "spilled" in line and "\n" not in line
    assert p.summary()["host_spill_plan_bytes"] == p.spill_bytes


@pytest.mark.parametrize("readers", [1, 2, 7, 8, 16])
@pytest.mark.parametrize(("nodes", "row_bytes"), [(81_306, 512), (1000, 800), (50_000, 3 * MB)])
def test_the_least_budget_advised_is_enough(readers: int, nodes: int, row_bytes: int) -> None:
    """Issue #44 item 19: the figure a refusal gives, as printed (rounded up), passes; the read buffer grows with
    the budget, so the need at the refused budget is not it."""
    kw = {"num_nodes": nodes, "parameters": 10_000, "row_bytes": row_bytes, "readers": readers}
    with pytest.raises(ConfigError) as refused:
        plan_host(nodes, **kw)  # a byte a vertex: surely too small
    advice = str(refused.value).split("give at least ")[1]
    p = plan_host(parse_budget(advice.replace(" ", "")), **kw)
    assert p.fixed_bytes <= p.budget
