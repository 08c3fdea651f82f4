"""Benchmarks (``lockstep bench ...``): each writes a Markdown table and a JSON file to ``--out``."""

from __future__ import annotations

from typing import Any


def cell(value: Any) -> str:
    """One Markdown table cell: thousands separators, four significant digits, n/a for missing."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
