from __future__ import annotations

from pathlib import Path

import pytest

from ebmrag.index.kb import KnowledgeBase
from ebmrag.ingest.documents import Document
from ebmrag.retrieve.focus import FocusExtractor
from ebmrag.retrieve.params import RetrievalParams
from ebmrag.retrieve.search import HybridRetriever
from tests.engines import rrf_params

TITLES = ["Sciatica", "Low back pain", "Back pain", "Gout", "Celiac disease", "Pain", "Zolmitriptan"]


def test_longest_title_wins_and_nested_titles_are_not_foci() -> None:
    focus = FocusExtractor(TITLES).extract("Re: my LOW BACK PAIN. What treatments help with low back pain?")
    assert focus.titles == ("low back pain",)
    assert "treatment" in focus.question_types
    assert focus.query.startswith("low back pain treatment")


def test_several_foci_in_question_order_capped() -> None:
    extractor = FocusExtractor(TITLES, max_titles=2)
    focus = extractor.extract("I have celiac disease; does zolmitriptan contain gluten? Also gout.")
    assert focus.titles == ("celiac disease", "zolmitriptan")
    assert "considerations" in focus.question_types


def test_no_title_means_no_focus_query() -> None:
    focus = FocusExtractor(TITLES).extract("what are the symptoms of a sprained ankle")
    assert focus.titles == () and focus.query == ""
    assert focus.question_types == ("symptoms", "information")


def test_generic_titles_are_topics_not_foci_in_a_large_base() -> None:
    def share(title: str) -> float:
        return 0.2 if title == "pain" else 0.0001

    question = "what treats the pain of gout"
    assert FocusExtractor(TITLES, share, rows=100_000).extract(question).titles == ("gout",)
    assert FocusExtractor(TITLES, share, rows=100).extract(question).titles == ("pain", "gout")  # 20 rows: rare


def test_a_misspelt_long_name_is_read_as_the_title_it_is_close_to() -> None:
    extractor = FocusExtractor([*TITLES, "Antiphospholipid syndrome"])
    assert extractor.extract("antiphosoholipid syndrome, is it inherited?").titles == ("antiphospholipid syndrome",)
    assert extractor.extract("my goat has gout").titles == ("gout",)  # short words are never corrected


def test_bad_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="max_titles"):
        FocusExtractor(TITLES, max_titles=0)
    with pytest.raises(ValueError, match="max_share"):
        FocusExtractor(TITLES, max_share=0)


SECTIONS = {
    "Sciatica": {"symptoms": "Pain radiates from the lower back down the leg along the nerve, with tingling.",
                 "treatment": "Most episodes settle with staying active, heat and simple analgesics; surgery is "
                              "considered when weakness progresses."},
    "Gout": {"treatment": "Acute attacks are treated with colchicine or anti-inflammatory drugs; urate lowering "
                          "therapy prevents recurrence."},
    "Caring for a family member": {"information": "Caregivers of relatives with long illnesses often feel tired, "
                                                  "worried and alone; respite services help families."},
}


@pytest.mark.model
def test_focus_routes_lift_the_named_condition(tmp_path: Path, embedder) -> None:  # type: ignore[no-untyped-def]
    docs = [Document(title.lower().replace(" ", "-"), "\n\n".join(f"{s.title()}\n{t}" for s, t in parts.items()),
                     "guides", "md", title=title) for title, parts in SECTIONS.items()]
    kb = KnowledgeBase(tmp_path / "kb", embedder=embedder)
    kb.apply(docs)
    question = ("help please. my family is worried and I am tired of this, my husband has had sciatica for months "
                "and I am caring for him alone, what can be done to treat it")
    plain = HybridRetriever(kb, RetrievalParams(fusion="score", bm25_weight=0.3, dense_weight=0.7))
    focused = HybridRetriever(kb, RetrievalParams(fusion="score", bm25_weight=0.3, dense_weight=0.7,
                                                       focus_weight=0.5))
    assert focused.focus_query(question).startswith("sciatica")
    top = focused.run(question, k=3)
    assert top[0].doc_id == "sciatica"
    assert plain.to_dict()["params"]["focus_weight"] == 0.0 and focused.to_dict()["params"]["focus_weight"] == 0.5
    with pytest.raises(ValueError, match="focus_weight"):
        HybridRetriever(kb, rrf_params(focus_weight=1.0))
