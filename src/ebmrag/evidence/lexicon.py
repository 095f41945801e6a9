"""Drug and drug-class mentions from an offline lexicon (rules/drugs.txt plus the classes below).

Tier rules that need to know whether a text names a drug ("hives and throat swelling after taking
cefuroxime") ask this lexicon rather than a regex: 27,000 names do not fit a readable pattern, and a
set lookup per word costs microseconds. Classes and Chinese names are listed here because a chart says
"after an antibiotic" or "头孢类" as often as it names the molecule.
"""

from __future__ import annotations

import itertools
import re
from functools import cache
from pathlib import Path

from ebmrag.errors import ConfigError

DEFAULT_DRUGS_PATH = Path(__file__).parent / "rules" / "drugs.txt"
DRUG_CLASSES = (
    "antibiotic", "antibiotics", "penicillin", "penicillins", "cephalosporin", "cephalosporins", "carbapenem",
    "carbapenems", "sulfa", "sulfonamide", "sulfonamides", "sulfa drugs", "macrolide", "macrolides", "quinolone",
    "fluoroquinolone", "fluoroquinolones", "tetracycline", "tetracyclines", "aminoglycoside", "aminoglycosides",
    "nsaid", "nsaids", "opioid", "opioids", "anticonvulsant", "anticonvulsants", "statin", "statins",
    "ace inhibitor", "ace inhibitors", "contrast", "contrast dye", "iodinated contrast", "iodine", "latex",
    "vaccine", "anesthetic", "anaesthetic", "medication", "medicine", "drug", "injection", "infusion", "shot",
)
CHINESE = ("青霉素", "头孢", "磺胺", "阿莫西林", "抗生素", "抗菌药", "霉素", "沙星", "造影剂", "碘", "阿司匹林",
           "布洛芬", "药物", "输液", "注射", "疫苗", "麻醉")
_TOKEN = re.compile(r"[a-z][a-z-]+")


def drug_names() -> frozenset[str]:
    """The bundled lexicon's names (lower case)."""
    return _names()


@cache
def _names(path: Path = DEFAULT_DRUGS_PATH) -> frozenset[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"drug lexicon {path} could not be read: {exc}") from exc
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


def drug_mentions(text: str) -> list[str]:
    """The drug names and classes a text mentions, in order (Chinese by substring)."""
    lowered = text.lower()
    names, classes = _names(), frozenset(DRUG_CLASSES)
    words = _TOKEN.findall(lowered)
    parts = [part for word in words if "-" in word for part in word.split("-")]  # "metoclopramide-induced"
    found = [w for w in words + parts if w in names or w in classes]
    found += [f"{a} {b}" for a, b in itertools.pairwise(words) if f"{a} {b}" in classes]
    found += [term for term in CHINESE if term in text]
    return found
