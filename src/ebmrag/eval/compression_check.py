"""What state B drops: every critical (gold T1/T2) fragment of the shared cases compressed, and each entity of
the original that the compressed text no longer holds listed by kind, with examples.

The compressor keeps the clauses holding an entity, so what it drops is either an entity kind the
lexicon does not know (the reason qualifiers were added) or an entity inside a clause it cut. Dates
are left out: they are counted but never kept by design (they are what lowers F(B)). A lab panel's normal
results are cut and counted by design (issue 46: "(6 other results normal)"); their entities are listed as
summarised, apart from what is dropped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ebmrag.eval.cases import DATASETS, load_cases
from ebmrag.eval.packing_report import dataset_dir
from ebmrag.evidence.entities import EntityCompressor, EntityKind
from ebmrag.evidence.result_flags import NORMAL, result_readings


@dataclass
class CompressionCheck:
    fragments: int = 0
    compressed: int = 0  # fragments whose state B differs from the text
    entities: int = 0
    dropped: Counter[str] = field(default_factory=Counter)  # by entity kind
    summarised: Counter[str] = field(default_factory=Counter)  # inside a normal result a panel counts instead
    examples: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, entity, fragment start)

    def to_json(self) -> dict[str, object]:
        return {"fragments": self.fragments, "compressed": self.compressed, "entities": self.entities,
                "dropped": dict(self.dropped), "summarised": dict(self.summarised),
                "examples": [list(e) for e in self.examples[:20]]}


def check_compression(data_root: Path, compressor: EntityCompressor) -> CompressionCheck:
    """`compressor`: the composition root's (compose.Resources.compressor), whose state B the packer packs."""
    extractor = compressor.extractor
    check = CompressionCheck()
    for dataset in DATASETS:
        folder = dataset_dir(data_root, dataset)
        if folder is None:
            continue
        for case in load_cases(dataset, folder):
            texts = {f.id: f.text for f in case.record.fragments}
            for fid in case.critical_ids:
                text = texts[fid]
                state_b = compressor.compress(text).text
                check.fragments += 1
                check.compressed += state_b != text
                kept = {e.key for e in extractor.extract(state_b)}
                readings = result_readings(text)
                panel = len(readings) >= extractor.panel.min_results  # its normal results are counted, not listed
                normal = [(r.result.mention.start, r.end) for r in readings if panel and r.result.flag == NORMAL]
                for entity in extractor.extract(text):
                    if entity.kind is EntityKind.DATE:
                        continue
                    check.entities += 1
                    if entity.key in kept:
                        continue
                    if any(start <= entity.start and entity.end <= end for start, end in normal):
                        check.summarised[entity.kind.value] += 1
                    else:
                        check.dropped[entity.kind.value] += 1
                        check.examples.append((entity.kind.value, entity.text, text[:100]))
    return check


def compression_markdown(check: CompressionCheck) -> str:
    lost = sum(check.dropped.values())
    lines = ["# What compression drops from critical fragments", "",
             "Command: `ebmrag eval compression --data-root ../shared/data "
             "--out docs/results/compression_check.md`", "",
             f"{check.fragments} critical fragments (gold T1/T2 of MedQA, AgentClinic, CMB-Clin), {check.compressed} "
             f"with a shorter state B; {check.entities} entities (dates excluded), {lost} not found in state B "
             f"({100 * lost / max(check.entities, 1):.2f} %); {sum(check.summarised.values())} more inside normal "
             "results that a panel's state B counts instead of listing.", "",
             "| entity kind | dropped |", "|---|---|",
             *(f"| {kind} | {n} |" for kind, n in check.dropped.most_common()), "",
             "Examples (kind, entity, fragment start):", "",
             *(f"- {kind}: `{entity}` in \"{text}\"" for kind, entity, text in check.examples[:20])]
    return "\n".join(lines) + "\n"
