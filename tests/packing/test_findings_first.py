"""No filler line is packed while a T1/T2 finding that fits is dropped: a property over random candidate sets,
and the same end to end on generated free-text charts (real tier rules, real embedder, `ebmrag pack --json`)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.packing.exact import ExactPacker
from ebmrag.packing.types import Candidate
from ebmrag.records.fragment import Tier
from tests.packing.strategies import candidate_sets

FINDINGS = (Tier.T1, Tier.T2)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(candidate_sets(max_size=9, max_tokens=50), st.integers(min_value=10, max_value=160))
def test_no_t4_fragment_is_packed_while_a_finding_that_fits_is_dropped(candidates: list[Candidate],
                                                                        window: int) -> None:
    result = ExactPacker(k_min=0).pack(candidates, window)
    room = window - result.tokens_used
    by_id = {c.fragment.id: c for c in candidates}
    packed_other = [p for p in result.packed if p.tier is Tier.T4 and not by_id[p.fragment_id].critical]
    for dropped in result.dropped:
        if dropped.tier not in FINDINGS:
            continue
        cheapest = min(o.tokens for o in by_id[dropped.fragment_id].options)
        for other in packed_other:
            assert cheapest > room + other.tokens, (dropped, other, room)
    for packed in result.packed:
        if packed.reason.value == "finding":
            assert packed.tier in FINDINGS and packed.detail
    assert all(d.detail for d in result.dropped)


FILLER = ["Patient settled overnight.", "Relatives phoned for an update.", "Slept well and ate breakfast.",
          "Chaplain visited at the family's request.", "Bed moved nearer the window.", "Asked for extra pillows.",
          "Watched television in the day room.", "Discussed parking arrangements with the ward clerk."]
FACTS = [
    ("adr-story", "Years ago a course of clarithromycin left her with blistered lips and skin coming away in sheets; "
                  "she spent nine days on the burns unit."),
    ("adr-zh", "患者诉数年前肌注青霉素后即感胸闷、呼吸困难，随后血压下降，经抢救后好转。"),
    ("k-zh", "今晨血钾6.3mmol/L，复查中。"),
    ("cr", "Creatinine 212 umol/L on the last panel."),
]


def _chart(seed: int, tmp_path: Path) -> Path:
    rng = random.Random(seed)
    now = datetime(2026, 5, 1, 8, 0, tzinfo=UTC)
    fragments = [{"id": fid, "text": text, "timestamp": (now - timedelta(days=rng.randint(0, 2000))).isoformat()}
                 for fid, text in FACTS]
    fragments += [{"id": f"filler-{i}", "text": rng.choice(FILLER) + f" Day {i}.",
                   "timestamp": (now - timedelta(hours=rng.randint(0, 48))).isoformat()} for i in range(30)]
    rng.shuffle(fragments)
    path = tmp_path / f"chart-{seed}.json"
    path.write_text(json.dumps({"patient_id": f"gen-{seed}", "fragments": fragments}, ensure_ascii=False))
    return path


def test_generated_free_text_charts_keep_every_critical_fact_at_256(tmp_path: Path) -> None:
    runner = CliRunner()
    for seed in range(3):
        out = runner.invoke(app, ["pack", str(_chart(seed, tmp_path)), "--query",
                                  "Which antibiotic can she have for her pneumonia?", "--window", "256", "--json"])
        assert out.exit_code == 0, out.output
        result = json.loads(out.stdout)
        packed = {p["fragment_id"]: p for p in result["packed"]}
        assert {fid for fid, _ in FACTS} <= set(packed), (seed, result["dropped"])
        assert packed["adr-story"]["tier"] == "T1" and "clarithromycin" in packed["adr-story"]["finding"]
        assert packed["adr-zh"]["tier"] == "T1" and packed["k-zh"]["tier"] == "T2"
