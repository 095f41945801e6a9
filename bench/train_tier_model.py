"""Train the bundled tier model (src/ebmrag/evidence/rules/tier_model.npz): the fallback where no tier rule speaks.

Run: python bench/train_tier_model.py --data-root ../shared/data [--out src/ebmrag/evidence/rules/tier_model.npz]

Training texts: AgentClinic MedQA OSCE fields (labelled by field) and CMB-Clin sections (labelled by
section), shown to the model without their section, plus the sentences below, written for ebmrag for
the thin T1 class. Before the final fit on everything, the script reports a held-out estimate: fit on
the even-numbered texts, score rules + model on the odd ones, and on the NEJM cases (never trained on).
The embedding is the packer's default (bundled all-MiniLM-L6-v2 at its own length).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ebmrag.eval.tier_agreement import labelled_texts
from ebmrag.evidence.tiers import BUNDLED_TIER_MODEL, TierClassifier
from ebmrag.models.embeddings import SentenceEmbedder
from ebmrag.models.text_classifier import LinearTextClassifier, fit_linear_classifier
from ebmrag.records.fragment import Tier

WRITTEN_T1 = [
    "Sections from the resected colon show moderately differentiated adenocarcinoma invading the muscularis propria.",
    "Core samples of the breast lesion: invasive ductal carcinoma, grade 2, estrogen receptor positive.",
    "The lymph node aspirate contained sheets of atypical lymphoid cells.",
    "Marrow trephine: hypercellular with 40 % blasts.",
    "Skin punch specimen: interface dermatitis with necrotic keratinocytes.",
    "Renal specimen shows crescents in most glomeruli on light microscopy.",
    "Liver tissue: bridging fibrosis with interface hepatitis.",
    "Thyroid nodule aspirate, Bethesda category VI, papillary carcinoma.",
    "Gastric mucosa with signet ring cells infiltrating the lamina propria.",
    "Cervical cytology: high-grade squamous intraepithelial lesion.",
    "Whole-exome sequencing found a pathogenic variant in the MYH7 gene.",
    "Karyotype 47,XXY.",
    "A heterozygous factor V Leiden variant was detected.",
    "He developed hives and swelling of the lips twenty minutes after an amoxicillin dose.",
    "Her throat felt tight and her skin broke out in welts after the cefuroxime infusion.",
    "Anaphylactic shock after intravenous contrast in 2019, treated with epinephrine.",
    "Stevens-Johnson syndrome after starting carbamazepine two years ago.",
    "Allergic to sulfonamides: widespread blistering rash.",
    "患者输注头孢曲松后出现全身皮疹和喉头水肿。",
    "病理示中分化腺癌，侵及浆膜层。",
    "穿刺细胞学检查见大量异型细胞。",
    "基因检测发现BRCA1致病突变。",
    "免疫组化：CD20阳性，Ki-67约80%。",
    "Frozen section confirmed clear margins around the melanoma.",
]


def training_items(data_root: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(text, tier) for training and for the NEJM check."""
    data = labelled_texts(data_root)
    train = [(text, tier.value) for source in ("agentclinic-medqa", "cmb-clin") for tier, text in data.get(source, [])]
    train += [(text, Tier.T1.value) for text in WRITTEN_T1]
    nejm = [(text, tier.value) for tier, text in data.get("agentclinic-nejm", [])]
    return train, nejm


def agreement(model: LinearTextClassifier | None, items: list[tuple[str, str]]) -> float:
    classifier = TierClassifier(model=model)
    decided = classifier.classify_many([(text, None) for text, _ in items])
    return float(np.mean([d.tier.value == gold for d, (_, gold) in zip(decided, items, strict=True)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--out", type=Path, default=BUNDLED_TIER_MODEL)
    parser.add_argument("--c", type=float, default=2.0)
    args = parser.parse_args()
    embedder = SentenceEmbedder()
    train, nejm = training_items(args.data_root)
    even, odd = train[0::2], train[1::2]
    scratch = args.out.with_suffix(".heldout.npz")
    fit_linear_classifier([t for t, _ in even], [g for _, g in even], embedder, scratch, args.c)
    held = LinearTextClassifier(scratch, embedder)
    report = {"texts": len(train), "held_out_odd": {"rules": agreement(None, odd), "rules+model": agreement(held, odd)},
              "nejm": {"rules": agreement(None, nejm), "rules+model": agreement(held, nejm)}}
    scratch.unlink()
    fit_linear_classifier([t for t, _ in train], [g for _, g in train], embedder, args.out, args.c,
                          {"trained_on": "AgentClinic MedQA fields, CMB-Clin sections, 24 written T1 sentences",
                           "command": "python bench/train_tier_model.py --data-root ../shared/data"})
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
