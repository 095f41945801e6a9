"""The chart readers' code tables (rules/records/*.toml): every declared reader accepts the bundled files (a
mis-edited table stopping start-up is tests/rules/test_rule_book.py)."""

from __future__ import annotations

# importing the readers declares how each reads its rule files
import ebmrag.records.ccda.document
import ebmrag.records.fhir.bundle
import ebmrag.records.fhir.facts  # noqa: F401
from ebmrag.rules import bundled


def test_bundled_code_tables_are_read_by_every_reader() -> None:
    bundled().check()
