from __future__ import annotations

import pytest

from ebmrag.text.language import UnsupportedLanguageError, detect_language


@pytest.mark.parametrize(("text", "language"), [
    ("Which antibiotic is safe?", "en"), ("Warfarin dose?", "en"), ("eGFR 28: metformin?", "en"),
    ("患者HER2阴性，下一步治疗？", "zh"), ("CEA 12.6 ng/mL 意义?", "zh"),
])
def test_supported_languages(text: str, language: str) -> None:
    assert detect_language(text) == language


@pytest.mark.parametrize(("text", "named"), [
    ("Какой антибиотик безопасен?", "Cyrillic"), ("ما هو العلاج؟", "Arabic"),
    ("Quel antibiotique est sûr pour une infection de la plaie?", "other than English"), ("12 / 40 ?", "no words"),
])
def test_other_languages_are_refused_by_name(text: str, named: str) -> None:
    with pytest.raises(UnsupportedLanguageError, match=named):
        detect_language(text)
