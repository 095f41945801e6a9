"""Charts pulled from FHIR servers (`ehr/pull.py`, `ehr/bulk.py`), as the patient store keeps them: the raw
resources of each source, the source's sync point and the fragment ids its chart gave.

A pull is one tenant-scoped transaction that writes the resources, the sync point and the chart together,
under the patient's writer lock, after checking that the patient was not erased since the pull began
(`store/erasures.py`). A store patient holds one pulled source at most.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ebmrag.errors import EbmragError
from ebmrag.records.fragment import PatientRecord
from ebmrag.store.charts import PatientCharts, fragment_to_json
from ebmrag.store.database import now
from ebmrag.store.erasures import Erasures


class ChartSourceConflictError(EbmragError):
    """A pull would put a second person's chart under one store id: the store patient holds a chart pulled from
    another source (another FHIR server or patient id), or, for a Bulk Data export, a chart from anywhere else.
    Nothing was written; the message names no patient."""

    code = "chart-source-conflict"


@dataclass(frozen=True)
class PulledResource:
    """One raw FHIR resource as a pull keeps it: by (type, id), with the version it had."""

    resource_type: str
    resource_id: str
    version: str  # meta.versionId, else meta.lastUpdated, else ""
    body: str  # the resource's JSON


@dataclass(frozen=True)
class PulledState:
    """Where a source's last pull of a patient left off."""

    since: str  # the `_since` instant of the next refresh
    pulled: str  # when it was stored
    fragments: tuple[str, ...]  # the fragment ids its chart gave: a later pull replaces these, and only these


@dataclass(frozen=True)
class PulledWrite:
    """What one pull changed in the patient's fragments (and how many raw resources it wrote)."""

    added: int
    changed: int
    removed: int
    unchanged: int
    resources: int


class PulledCharts(PatientCharts, Erasures):
    """The `ehr_resources` and `ehr_sync` tables: a part of PatientStore. A pull writes the patient and its
    fragments as an upload does (PatientCharts) and honours erasures (Erasures)."""

    def pulled_state(self, tenant: str, patient: str, source: str) -> PulledState | None:
        with self.transaction(tenant) as cur:
            row = self._execute(cur, "SELECT since, pulled, fragments FROM ehr_sync WHERE tenant = ? AND patient = ? "
                                     "AND source = ?", (tenant, patient, source)).fetchone()
        return PulledState(row[0], row[1], tuple(json.loads(row[2]))) if row else None

    def pulled_resources(self, tenant: str, patient: str, source: str) -> list[str]:
        """The kept resources' JSON, in (type, id) order."""
        with self.transaction(tenant) as cur:
            rows = self._execute(cur, "SELECT body FROM ehr_resources WHERE tenant = ? AND patient = ? AND source = ? "
                                      "ORDER BY resource_type, resource_id", (tenant, patient, source)).fetchall()
        return [str(r[0]) for r in rows]

    def pulled_sources(self, tenant: str, patient: str) -> list[str]:
        """The sources the patient's pulled charts came from (one at most, since `put_pulled` keeps it so)."""
        with self.transaction(tenant) as cur:
            rows = self._execute(cur, "SELECT source FROM ehr_sync WHERE tenant = ? AND patient = ? ORDER BY source",
                                 (tenant, patient)).fetchall()
        return [str(r[0]) for r in rows]

    def put_pulled(self, tenant: str, patient: str, source: str, record: PatientRecord,
                   resources: Sequence[PulledResource], since: str, replace_all: bool, *,
                   replace_source: bool = False, require_free: bool = False,
                   erased_after: int | None = None) -> PulledWrite:
        """One pull stored whole or not at all: the raw resources (`replace_all`: they are all the source holds
        now; else they are what changed), the sync point, and the chart. The chart replaces the fragments this
        source's last pull gave; fragments from elsewhere (an upload, a result feed) stay, and a fragment whose
        text did not change is not rewritten, so the preparation after the write computes only what is new. The
        pulled fragments come first, in the chart's order (a refreshed chart packs as a fresh read of it would).

        A store patient holds one pulled source at most: a pull from another source is a
        ChartSourceConflictError unless `replace_source`, which erases the other source's resources, sync state
        and fragments in this transaction. `require_free` (a Bulk Data export, which names no store id itself):
        the patient must not exist yet, or hold this source already. `erased_after`: the `erasure_mark` read when
        the pull began; a patient erased since is a PatientErasedError, nothing written (an erasure outlasts the
        pulls begun before it, whichever process runs them)."""
        with self.transaction(tenant) as cur:
            self._lock_patient(cur, tenant, patient)
            self._check_not_erased(cur, tenant, patient, erased_after)
            erased = self._bind_source(cur, tenant, patient, source, replace_source, require_free)
            if replace_all:
                self._execute(cur, "DELETE FROM ehr_resources WHERE tenant = ? AND patient = ? AND source = ?",
                              (tenant, patient, source))
            for resource in resources:
                self._execute(cur, "DELETE FROM ehr_resources WHERE tenant = ? AND patient = ? AND source = ? AND "
                                   "resource_type = ? AND resource_id = ?",
                              (tenant, patient, source, resource.resource_type, resource.resource_id))
                self._execute(cur, "INSERT INTO ehr_resources VALUES (?, ?, ?, ?, ?, ?, ?)",
                              (tenant, patient, source, resource.resource_type, resource.resource_id,
                               resource.version, resource.body))
            row = self._execute(cur, "SELECT fragments FROM ehr_sync WHERE tenant = ? AND patient = ? AND source = ?",
                                (tenant, patient, source)).fetchone()
            before = set(json.loads(row[0])) if row else set()
            counts = self._replace_pulled_fragments(cur, tenant, patient, record, before)
            self._execute(cur, "DELETE FROM ehr_sync WHERE tenant = ? AND patient = ? AND source = ?",
                          (tenant, patient, source))
            self._execute(cur, "INSERT INTO ehr_sync VALUES (?, ?, ?, ?, ?, ?)",
                          (tenant, patient, source, since, now(), json.dumps([f.id for f in record.fragments])))
        added, changed, removed, unchanged = counts
        return PulledWrite(added, changed, removed + erased, unchanged, len(resources))

    def _bind_source(self, cur: Any, tenant: str, patient: str, source: str, replace_source: bool,
                     require_free: bool) -> int:
        """Check (and with `replace_source` clear) the patient's other pulled sources; returns how many of their
        fragments were erased."""
        rows = self._execute(cur, "SELECT source, fragments FROM ehr_sync WHERE tenant = ? AND patient = ?",
                             (tenant, patient)).fetchall()
        others = [(str(r[0]), json.loads(r[1])) for r in rows if str(r[0]) != source]
        if require_free and len(others) == len(rows) and self._execute(
                cur, "SELECT 1 FROM patients WHERE tenant = ? AND patient = ?", (tenant, patient)).fetchone():
            raise ChartSourceConflictError("the patient id already holds a chart from elsewhere (an upload or "
                                           "another source); not stored")
        if others and not replace_source:
            raise ChartSourceConflictError("the patient already holds a chart pulled from another source (another "
                                           "FHIR server or patient id); nothing stored (replace erases that chart "
                                           "and stores this one)")
        erased = 0
        for other, fragment_ids in others:
            for fragment_id in fragment_ids:
                erased += self._execute(cur, "DELETE FROM fragments WHERE tenant = ? AND patient = ? AND "
                                             "fragment_id = ?", (tenant, patient, fragment_id)).rowcount
            for table in ("ehr_resources", "ehr_sync"):
                self._execute(cur, f"DELETE FROM {table} WHERE tenant = ? AND patient = ? AND source = ?",
                              (tenant, patient, other))
        return erased

    def _replace_pulled_fragments(self, cur: Any, tenant: str, patient: str, record: PatientRecord,
                                  before: set[str]) -> tuple[int, int, int, int]:
        """(added, changed, removed, unchanged): rows written only where the fragment is new or its body differs."""
        stored: dict[str, str] = {}
        ids = [f.id for f in record.fragments] + sorted(before)
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            rows = self._execute(cur, f"SELECT fragment_id, body FROM fragments WHERE tenant = ? AND patient = ? AND "
                                      f"fragment_id IN ({','.join('?' * len(chunk))})",
                                 (tenant, patient, *chunk)).fetchall()
            stored.update({str(r[0]): str(r[1]) for r in rows})
        gone = sorted(i for i in before if i in stored and i not in {f.id for f in record.fragments})
        for fragment_id in gone:
            self._execute(cur, "DELETE FROM fragments WHERE tenant = ? AND patient = ? AND fragment_id = ?",
                          (tenant, patient, fragment_id))
        self._write_patient(cur, tenant, patient, record)
        fresh, changed, unchanged = [], 0, 0
        for fragment in record.fragments:
            body = fragment_to_json(fragment)
            if fragment.id not in stored:
                fresh.append(fragment)
            elif stored[fragment.id] != body:
                changed += 1
                self._execute(cur, "UPDATE fragments SET body = ? WHERE tenant = ? AND patient = ? AND "
                                   "fragment_id = ?", (body, tenant, patient, fragment.id))
            else:
                unchanged += 1
        last = self._execute(cur, "SELECT MAX(position) FROM fragments WHERE tenant = ? AND patient = ?",
                             (tenant, patient)).fetchone()[0]
        self._insert(cur, tenant, patient, fresh, (last if last is not None else -1) + 1)
        for fragment in fresh:  # an announced result that arrives is no longer pending
            self._execute(cur, "DELETE FROM pending WHERE tenant = ? AND patient = ? AND fragment_id = ?",
                          (tenant, patient, fragment.id))
        self._reorder(cur, tenant, patient, [f.id for f in record.fragments])
        return len(fresh), changed, len(gone), unchanged

    def _reorder(self, cur: Any, tenant: str, patient: str, first: Sequence[str]) -> None:
        """Positions as a fresh read of the chart would give them: `first` (the pulled chart, in its order), then
        the other fragments in their order; only rows whose position moves are written."""
        rows = self._execute(cur, "SELECT fragment_id, position FROM fragments WHERE tenant = ? AND patient = ? "
                                  "ORDER BY position", (tenant, patient)).fetchall()
        leading = set(first)
        wanted = [*first, *(str(r[0]) for r in rows if str(r[0]) not in leading)]
        now_at = {str(r[0]): int(r[1]) for r in rows}
        for position, fragment_id in enumerate(wanted):
            if now_at.get(fragment_id) != position:
                self._execute(cur, "UPDATE fragments SET position = ? WHERE tenant = ? AND patient = ? AND "
                                   "fragment_id = ?", (position, tenant, patient, fragment_id))
