"""FHIR Bulk Data exports: NDJSON files (one resource per line, one resource type per file) -> one record
per patient.

`$export` writes `Patient.ndjson`, `Observation.ndjson`, ... for many patients at once. Each clinical
resource joins the patient it names; shared resources (Medication, Organization) are offered to every
patient's chart so references to them resolve; a clinical resource that names no patient of the export
(in an export of several patients) is reported, never guessed into someone's record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from ebmrag.errors import RecordError
from ebmrag.records.dates import Today
from ebmrag.records.fhir.bundle import ADMINISTRATIVE, DEFAULT_STALE_AFTER, record_from_entries, subject_link
from ebmrag.records.fhir.index import Entry, ndjson_entries, reference_of, type_id
from ebmrag.records.fragment import PatientRecord

NDJSON_SUFFIXES = (".ndjson", ".jsonl")


def ndjson_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in NDJSON_SUFFIXES) if path.is_dir() else [path]
    if not files:
        raise RecordError(str(path), "is a folder without .ndjson files (a Bulk Data export writes one per type)")
    return files


def records_from_ndjson(path: Path, *, stale_after: timedelta = DEFAULT_STALE_AFTER,
                        today: Today | None = None) -> list[PatientRecord]:
    problems: list[str] = []
    entries: list[Entry] = []
    for file in ndjson_files(path):
        try:
            lines = file.read_text(encoding="utf-8-sig").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise RecordError(str(file), f"could not be read as UTF-8 text ({type(exc).__name__})") from None
        entries += ndjson_entries(lines, file.name, problems)
    return _per_patient(entries, str(path), problems, stale_after, today)


def records_from_ndjson_text(text: str, origin: str, *, stale_after: timedelta = DEFAULT_STALE_AFTER,
                             today: Today | None = None) -> list[PatientRecord]:
    """An NDJSON body (a service upload, one file's content)."""
    problems: list[str] = []
    entries = list(ndjson_entries(text.splitlines(), origin, problems))
    return _per_patient(entries, origin, problems, stale_after, today)


def _per_patient(entries: Sequence[Entry], origin: str, problems: list[str],
                 stale_after: timedelta, today: Today | None = None) -> list[PatientRecord]:
    groups: dict[str, list[Entry]] = {}
    for entry in entries:
        if entry.resource.get("resourceType") == "Patient" and isinstance(entry.resource.get("id"), str):
            groups.setdefault(f"Patient/{entry.resource['id']}", []).append(entry)
    shared: list[Entry] = []
    orphans: Counter[str] = Counter()
    for entry in entries:
        if entry.resource.get("resourceType") == "Patient":
            continue
        named = type_id(reference_of(subject_link(entry.resource)))
        if named in groups:
            groups[named].append(entry)
        elif not named and entry.resource.get("resourceType") in ADMINISTRATIVE:
            shared.append(entry)
        elif not named and len(groups) == 1:
            next(iter(groups.values())).append(entry)
        else:
            orphans[str(entry.resource.get("resourceType"))] += 1
    if not groups:
        raise RecordError(origin, "the export holds no Patient resource: no record can be made")
    notes = problems + [f"{kind} x{n}: names no patient of this export; not read"
                        for kind, n in sorted(orphans.items())]
    today = today or Today.wall_clock()  # one present for every patient of the export
    return [record_from_entries([*members, *shared], f"{origin}#{key}", notes, stale_after=stale_after, today=today)
            for key, members in groups.items()]
