"""The chart readers' code tables (rules/records/*.toml): every declared reader accepts the bundled files, and a
mis-edited table stops start-up naming the file and the entry at fault."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

# importing the readers declares how each reads its rule files
import ebmrag.records.ccda.document
import ebmrag.records.fhir.bundle
import ebmrag.records.fhir.facts  # noqa: F401
from ebmrag.errors import ConfigError
from ebmrag.rules import FOLDER, RuleBook, bundled


def test_bundled_code_tables_are_read_by_every_reader() -> None:
    bundled().check()


@pytest.mark.parametrize(("name", "old", "new", "message"), [
    ("records/ccda.toml", 'category = "medication", type = "intolerance"', 'category = "drug", type = "intolerance"',
     "'59037007': category 'drug' is not one of"),
    ("records/ccda.toml", 'medication_ended = ["aborted"', 'medication_ended = ["stopped"',
     "medication_ended names a status"),
    ("records/sections.toml", 'kind = "vital-signs"', 'kind = "vitals"', "[loinc.'8716-3'] needs a `display`"),
    ("records/absent.toml", 'food = { code = "429625007"', 'food = { code = "999"', "[allergy.ccda] writes 999"),
    ("records/drug_facts.toml", 'not_pregnant = { code = "60001007"', 'not_pregnant = { code = "77386006"',
     "does not list"),
    ("records/code_systems.toml", 'oids = ["2.16.840.1.113883.6.1"]', 'oids = ["2.16.840.1.113883.6.96"]',
     "is listed under both"),
    ("records/fhir.toml", 'f = "female"', 'F = "female"', "keys are lower-cased"),
])
def test_a_mis_edited_table_names_its_file_and_entry(tmp_path: Path, name: str, old: str, new: str,
                                                     message: str) -> None:
    folder = tmp_path / "rules"
    shutil.copytree(FOLDER, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    path = folder / name
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        RuleBook(folder).check()
    assert str(path.resolve()) in str(raised.value) and message in str(raised.value)
