"""The one loader of the rule files (ebmrag.rules): a reader may declare several files and receive them in order,
and a damaged file (a chart reader's code table, the drug vocabulary, the negation cues, the result vocabulary)
stops `check()` (start-up) naming the file, the copy's and not the bundled one, and the entry at fault."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

# importing the readers declares how each reads its rule files
import ebmrag.cds.facts
import ebmrag.evidence.results
import ebmrag.records.ccda.document
import ebmrag.records.fhir.bundle
import ebmrag.records.fhir.facts
from ebmrag import rules
from ebmrag.errors import ConfigError
from ebmrag.rules import FOLDER, RuleBook, RuleFile, bundled, rule_file
from ebmrag.vocab.drugs import vocabulary
from ebmrag.vocab.lexicon import terms
from ebmrag.vocab.negation import negation


def copy_of_rules(tmp_path: Path) -> Path:
    folder = tmp_path / "rules"
    shutil.copytree(FOLDER, folder, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return folder


def test_a_reader_of_several_files_receives_them_in_order_and_is_built_once(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    monkeypatch.setattr(rules, "_READERS", {})  # declared here only: other tests' check() must not run these
    calls: list[Any] = []

    @rule_file("records/absent.toml", "negation.toml")
    def both(absent: Any, cues: Any) -> tuple[Any, Any]:
        calls.append((absent, cues))
        return absent, cues

    @rule_file("negation.toml", "records/absent.toml")
    def reversed_order(cues: Any, absent: Any) -> tuple[Any, Any]:
        return cues, absent

    @rule_file("negation.toml", as_files=True)
    def whole(file: RuleFile) -> RuleFile:
        return file

    book = RuleBook(copy_of_rules(tmp_path))
    assert both(book) == (book.read("records/absent.toml"), book.read("negation.toml"))
    assert both(book) is both(book) and len(calls) == 1
    assert reversed_order(book) == (book.read("negation.toml"), book.read("records/absent.toml"))
    file = whole(book)
    assert file.path == book.path("negation.toml") and file.table is book.read("negation.toml")
    assert file.source == (book.folder / "negation.toml").read_text(encoding="utf-8")
    assert set(rules._READERS) == {("records/absent.toml", "negation.toml"), ("negation.toml", "records/absent.toml"),
                                   ("negation.toml",)}
    book.check()


def test_a_builder_of_several_files_that_fails_names_every_file(tmp_path: Path) -> None:
    book = RuleBook(copy_of_rules(tmp_path))

    def missing(absent: Any, cues: Any) -> Any:
        return cues["no such table"]

    with pytest.raises(ConfigError) as raised:
        book.built(("records/absent.toml", "negation.toml"), missing)
    assert str(book.path("records/absent.toml")) in str(raised.value)
    assert str(book.path("negation.toml")) in str(raised.value) and "KeyError" in str(raised.value)


def test_the_vocabularies_are_built_once_per_book() -> None:
    assert vocabulary() is vocabulary() and terms() is terms() and negation() is negation()
    assert ebmrag.evidence.results.load_vocabulary() is ebmrag.evidence.results.load_vocabulary(bundled())


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
    ("drugs/drug_terms.toml", '"麻醉" = { general = "anaesthesia" }',
     '"麻醉" = { general = "anaesthesia" }\n"某药" = { ingredient = "notadrugatall" }',
     "'某药' names ingredient 'notadrugatall'"),
    ("drugs/drug_terms.toml", '"麻醉" = { general = "anaesthesia" }', '"麻醉" = "anaesthesia"',
     "[chinese] '麻醉' must be one of"),
    ("negation.toml", "after = [", "later = [", "[english] after must be a list"),
    ("drugs/drug_classes.toml", "version = 1", "version = 2", "version must be 1"),
    ("evidence/critical_values.toml", 'unit = "mmol/L"\nlow = 2.5', 'unit = "mg/dL"\nlow = 2.5',
     "[potassium]: unit 'mg/dL'"),
])
def test_a_damaged_rule_file_stops_check_naming_it(tmp_path: Path, name: str, old: str, new: str,
                                                         message: str) -> None:
    folder = copy_of_rules(tmp_path)
    path = folder / name
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        RuleBook(folder).check()
    assert str(path.resolve()) in str(raised.value) and message in str(raised.value)


def test_the_fingerprints_stored_results_are_keyed_on_are_unchanged() -> None:
    """The result vocabulary's fingerprint digests the two files' texts as it did before they were read through
    the book: "results", the analytes' text and the critical values' text."""
    from ebmrag.evidence.result_tables import vocabulary_fingerprint
    from ebmrag.kvcache import digest

    expected = digest("results", bundled().source("evidence/analytes.toml"),
                      bundled().source("evidence/critical_values.toml"))
    assert ebmrag.evidence.results.load_vocabulary().fingerprint == vocabulary_fingerprint() == expected
    assert negation().source == bundled().source("negation.toml")
