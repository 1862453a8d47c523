"""Byte sizes as shown: a least size to give is rounded up, so that the figure shown, given back, is enough."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gnnscale.units import format_bytes, format_bytes_up, parse_budget, parse_bytes


@given(st.integers(min_value=1, max_value=1 << 50))
def test_a_least_size_shown_is_enough_when_given_back(n: int) -> None:
    shown = format_bytes_up(n)
    assert parse_bytes(shown) >= n and parse_budget(shown.replace(" ", "")) >= n
    assert parse_bytes(shown) <= n + max(1, n // 9)  # one shown digit above, no more
    assert shown.split()[1] == format_bytes(n).split()[1] or shown.startswith("1.0 ")


def test_rounding_up_where_rounding_to_nearest_goes_down() -> None:
    n = int(1.94 * (1 << 20))
    assert format_bytes(n) == "1.9 MiB" and format_bytes_up(n) == "2.0 MiB"
