"""Erasing a patient, and making the erasure outlast the pulls begun before it.

An erasure removes every row of the patient's data in one tenant-scoped transaction and numbers itself: each
tenant's erasures are counted in commit order (`erasure_seq`) and the last number of each erased patient id is
kept (`erasures`, no chart data). A pull or export reads the tenant's mark when it begins (`erasure_mark`) and
its write is refused if the patient was erased since (`_check_not_erased`, called by `put_pulled`), in any
process.
"""

from __future__ import annotations

from typing import Any

from ebmrag.errors import EbmragError
from ebmrag.records.fragment import Fragment
from ebmrag.store.charts import fragment_from_json
from ebmrag.store.database import SqlStore, now


class PatientErasedError(EbmragError):
    """The patient was erased after this pull (or export) began: what it fetched is not stored (`put_pulled`)."""

    code = "patient-erased"


class Erasures(SqlStore):
    """The `erasure_seq` and `erasures` tables, and the erasure of a patient's rows: a part of PatientStore."""

    def delete_patient(self, tenant: str, patient: str) -> list[Fragment] | None:
        """Erase the patient; returns the erased fragments (the caller forgets what caches hold of them), or
        None when there was no such patient. Either way the erasure is numbered (`erasure_mark`): a pull of this
        patient begun before it stores nothing, in any process (even a first pull, of a patient not stored yet)."""
        with self.transaction(tenant) as cur:
            self._lock_patient(cur, tenant, patient)  # after a pull's write of this patient, or before it
            self._tombstone(cur, tenant, patient)
            rows = self._execute(cur, "SELECT body FROM fragments WHERE tenant = ? AND patient = ?",
                                 (tenant, patient)).fetchall()
            gone = self._execute(cur, "DELETE FROM patients WHERE tenant = ? AND patient = ?", (tenant, patient))
            if not gone.rowcount:
                return None
            self._execute(cur, "DELETE FROM fragments WHERE tenant = ? AND patient = ?", (tenant, patient))
            self._execute(cur, "DELETE FROM idempotency WHERE tenant = ? AND patient = ?", (tenant, patient))
            self._execute(cur, "DELETE FROM pending WHERE tenant = ? AND patient = ?", (tenant, patient))
            self._execute(cur, "DELETE FROM ehr_resources WHERE tenant = ? AND patient = ?", (tenant, patient))
            self._execute(cur, "DELETE FROM ehr_sync WHERE tenant = ? AND patient = ?", (tenant, patient))
        self.after_erasure()
        return [fragment_from_json(r[0], patient) for r in rows]

    def _tombstone(self, cur: Any, tenant: str, patient: str) -> None:
        """The tenant's next erasure number, kept as the patient's last. The counter's row stays locked until this
        transaction commits, so the numbers follow commit order: an erasure that commits after `erasure_mark` was
        read always has a higher number than the mark."""
        self._execute(cur, "INSERT INTO erasure_seq VALUES (?, 0) ON CONFLICT (tenant) DO NOTHING", (tenant,))
        self._execute(cur, "UPDATE erasure_seq SET seq = seq + 1 WHERE tenant = ?", (tenant,))
        seq = self._execute(cur, "SELECT seq FROM erasure_seq WHERE tenant = ?", (tenant,)).fetchone()[0]
        self._execute(cur, "DELETE FROM erasures WHERE tenant = ? AND patient = ?", (tenant, patient))
        self._execute(cur, "INSERT INTO erasures VALUES (?, ?, ?, ?)", (tenant, patient, seq, now()))

    def erasure_mark(self, tenant: str) -> int:
        """The number of the tenant's last committed erasure: read when a pull or an export begins, and handed to
        `put_pulled`, which refuses a patient erased after it."""
        with self.transaction(tenant) as cur:
            row = self._execute(cur, "SELECT seq FROM erasure_seq WHERE tenant = ?", (tenant,)).fetchone()
        return int(row[0]) if row else 0

    def _check_not_erased(self, cur: Any, tenant: str, patient: str, mark: int | None) -> None:
        if mark is None:
            return
        row = self._execute(cur, "SELECT seq FROM erasures WHERE tenant = ? AND patient = ?",
                            (tenant, patient)).fetchone()
        if row and int(row[0]) > mark:
            raise PatientErasedError("the patient was erased while this pull ran; nothing it fetched was stored "
                                     "(pull again to store the chart anew)")
