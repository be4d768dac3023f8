"""The one-time migrations of stored provenance records (attnbook/migrate.py): what each accepts
as "no number changed" and what it refuses. Their acceptance of the real tables rests on the
stored-slice test, which recomputes a slice of every migrated table."""

from __future__ import annotations

from attnbook.migrate import SIZE_TABLES, without_size_tables

BEFORE = b'''"""A model."""
__all__ = ["Config", "PROFILES", "f"]
from .sim import SIM_PROFILES, g


class Config:
    n: int = 3


PROFILES = {"quick": Config(), "full": Config()}


def f(x):
    """Twice x."""
    return 2 * x
'''


def test_a_module_that_only_lost_its_size_tables_is_the_same_code():
    after = (BEFORE.replace(b', "PROFILES"', b"").replace(b"SIM_PROFILES, ", b"")
             .replace(b'PROFILES = {"quick": Config(), "full": Config()}\n', b"")
             .replace(b'"""Twice x."""', b'"""Two times x (docstrings do not count)."""'))
    assert without_size_tables(BEFORE) == without_size_tables(after)


def test_any_other_change_is_refused():
    assert without_size_tables(BEFORE) != without_size_tables(BEFORE.replace(b"2 * x", b"3 * x"))
    assert without_size_tables(BEFORE) != without_size_tables(BEFORE.replace(b"n: int = 3", b"n: int = 4"))
    # a table of another name is not a size table
    assert "SIZES" not in SIZE_TABLES
    other = BEFORE.replace(b"PROFILES = {", b"SIZES = {")
    assert without_size_tables(other) != without_size_tables(other.replace(b'SIZES = {"quick": Config(), '
                                                                           b'"full": Config()}\n', b""))

