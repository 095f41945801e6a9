"""The Bayesian DDx engine against a hand-computed posterior, the knowledge-file checks, the finding mapper,
and the bundled DDXPlus knowledge base on DDXPlus validation patients."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ebmrag.cli import app
from ebmrag.ddx.engine import DifferentialDiagnoser, Smoothing, complete_findings
from ebmrag.ddx.knowledge import KnowledgeFileError, load_kb, parse_kb

TINY = {
    "format": "ebmrag-ddx-kb/1", "name": "tiny", "attribution": "written for the tests",
    "evidences": {"fever": {"question": "Do you have a fever?"}, "cough": {"question": "Do you have a cough?"},
                  "pain": {"question": "Do you have pain?"},
                  "pain_site": {"question": "Where is the pain?", "kind": "multi", "parent": "pain"}},
    "conditions": {
        "Flu": {"icd10": "J11", "prior": 3, "likelihoods": {"fever": 0.9, "cough": 0.6}},
        "Cold": {"icd10": "J00", "prior": 6, "likelihoods": {"cough": 0.8, "fever": 0.1}},
        "Ovarian cyst": {"icd10": "N83", "prior": 1, "sex": "F", "likelihoods": {"pain": 0.9, "pain_site": 0.9}},
    },
}


def tiny() -> DifferentialDiagnoser:
    return DifferentialDiagnoser(parse_kb(TINY, "tiny"), Smoothing(unlisted=1e-4, listed_floor=1e-3))


def test_posterior_matches_the_formula_with_absent_evidence_and_unknown_ignored() -> None:
    result = tiny().run({"fever": True, "cough": False, "made_up": True})
    s = 1e-4
    flu = 0.3 * 0.9 * (1 - 0.6)
    cold = 0.6 * 0.1 * (1 - 0.8)
    cyst = 0.1 * s * (1 - s)
    by_name = {d.name: d.posterior for d in result.ranked}
    assert by_name["Flu"] == pytest.approx(flu / (flu + cold + cyst), rel=1e-9)
    assert by_name["Cold"] == pytest.approx(cold / (flu + cold + cyst), rel=1e-9)
    assert result.ignored == ("made_up",)
    assert "pain" not in result.used  # not given: unknown, no factor
    assert result.ranked[0].drivers[0].code == "fever" and result.ranked[0].drivers[0].present


def test_context_restricts_by_sex_and_follow_ups_follow_their_parent() -> None:
    engine = tiny()
    findings = complete_findings(engine.kb, {"pain": True}, closed_world=True)
    assert findings == {"pain": True, "pain_site": True, "fever": False, "cough": False}
    def odds(sex: str) -> float:
        post = {d.name: d.posterior for d in engine.run(findings, sex=sex).ranked}
        return post["Ovarian cyst"] / post["Flu"]
    assert odds("M") / odds("F") == pytest.approx(1e-3, rel=1e-6)  # context_mismatch, applied through the prior
    structured = complete_findings(engine.kb, {"pain": True}, closed_world=True, infer_follow_ups=False)
    assert structured["pain_site"] is False


def test_differential_is_tempered_but_ranked_like_the_posterior() -> None:
    engine = DifferentialDiagnoser(parse_kb(TINY, "tiny"), Smoothing(temperature=4.0, min_posterior=0.01))
    result = engine.run({"fever": True, "cough": True})
    assert [d.name for d in result.ranked] == sorted((d.name for d in result.ranked),
                                                     key=lambda n: -next(x.posterior for x in result.ranked
                                                                         if x.name == n))
    assert sum(d.differential for d in result.ranked) == pytest.approx(1.0)
    assert len(result.listed) >= 2  # tempering spreads the near-one-hot posterior into a differential


@pytest.mark.parametrize(("patch", "message"), [
    ({"format": "other"}, "not a condition knowledge base"),
    ({"conditions": {"X": {"prior": 0, "likelihoods": {}}}}, "prior must be a positive number"),
    ({"conditions": {"X": {"prior": 1, "likelihoods": {"nope": 0.5}}}}, "unknown evidence 'nope'"),
    ({"conditions": {"X": {"prior": 1, "likelihoods": {"fever": 1.5}}}}, "must be in [0, 1]"),
    ({"evidences": {"a": {"question": "Q?", "parent": "zz"}}}, "follows up unknown evidence"),
])
def test_bad_knowledge_files_name_the_entry(patch: dict[str, object], message: str) -> None:
    with pytest.raises(KnowledgeFileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_kb({**TINY, **patch}, "k.json")


def test_bundled_kb_is_ddxplus_with_attribution(tmp_path: Path) -> None:
    kb = load_kb()
    assert len(kb.conditions) == 49 and len(kb.evidences) == 223
    assert "CC-BY" in kb.attribution
    assert kb.condition_named("pneumothorax spontané") is kb.conditions["Spontaneous pneumothorax"]
    kb.save(tmp_path / "copy.json")
    assert load_kb(tmp_path / "copy.json") == kb
    (tmp_path / "broken.json").write_text("{", encoding="utf-8")
    with pytest.raises(KnowledgeFileError, match="not JSON"):
        load_kb(tmp_path / "broken.json")


@pytest.mark.data
def test_structured_ddxplus_validation_top1(shared_data: Path) -> None:
    result = CliRunner().invoke(app, ["ddx", "eval", "--patients",
                                      str(shared_data / "ddxplus" / "patients_val588_v0_shared.csv"), "--json"])
    assert result.exit_code == 0, result.output
    scores = json.loads(result.stdout)
    assert scores["patients"] == 377 and scores["top1"] >= 0.99 and scores["top5"] >= 0.995
    assert 0 < scores["ddx_f1"] < 1


@pytest.mark.model
def test_free_text_findings_respect_negation_and_lists(embedder, extractor) -> None:  # type: ignore[no-untyped-def]
    from ebmrag.ddx.findings import FindingMapper

    kb = load_kb()
    mapped = {m.code: m.present for m in FindingMapper(kb, embedder, extractor=extractor).run(
        ["I have had a fever and a cough with yellow sputum.", "No chest pain at rest.", "I smoke.", "fatigue_extreme"]
    ) if m.code in ("fievre", "toux", "expecto", "angor_repos", "f17.210", "fatigue_extreme")}
    assert mapped.get("fievre") is True and mapped.get("toux") is True and mapped.get("f17.210") is True
    assert mapped.get("angor_repos") is False
    assert "fatigue_extreme" not in kb.evidences or mapped.get("fatigue_extreme") is True


def test_cli_ddx_json_and_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    kb_file = tmp_path / "tiny.json"
    kb_file.write_text(json.dumps(TINY), encoding="utf-8")
    config = tmp_path / "c.toml"
    config.write_text(f'[research]\nddx_kb = "{kb_file}"\n', encoding="utf-8")
    ok = runner.invoke(app, ["ddx", "--finding", "fever", "--finding", "cough", "--json", "--config", str(config)])
    assert ok.exit_code == 0, ok.output
    document = json.loads(ok.stdout)
    assert document["differential"][0]["name"] == "Flu"
    assert math.isclose(sum(d["differential"] for d in document["differential"]), 1.0, abs_tol=0.05)
    bad = runner.invoke(app, ["ddx", "--finding", "fever", "--sex", "X", "--config", str(config)])
    assert bad.exit_code == 2 and "sex must be" in bad.output
    missing = runner.invoke(app, ["ddx", "eval", "--patients", str(tmp_path / "none.csv")])
    assert missing.exit_code == 2 and "none.csv" in missing.output
