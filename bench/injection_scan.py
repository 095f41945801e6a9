"""False positives of the instruction grammar (text/injection.toml) on real clinical and patient-facing text.

Run: python bench/injection_scan.py --data-root ../shared/data [--show 20]

Every sentence of every string of the shared text corpora (text_corpora/, ade_corpus/), MedQuAD's answers and the
AgentClinic cases is split as the packer splits it and tested with `is_instruction`. None of this text was written
to steer a model (the AgentClinic actor briefs address a human actor), so every flagged sentence is a false
positive: its text would be left out of tiering and the brief. Prints the counts per file and the first flagged
sentences; exits 1 when more than `--limit` are flagged.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ebmrag.text.injection import is_instruction
from ebmrag.text.sentences import split_sentences

log = logging.getLogger("injection_scan")
FOLDERS = ("text_corpora", "ade_corpus", "medquad", "agentclinic")


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


def scan(path: Path) -> tuple[int, list[str]]:
    """(sentences read, sentences flagged) of one JSONL file; strings under 20 characters (ids, labels) skipped."""
    total, flagged = 0, []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            for text in strings(json.loads(line)):
                if len(text) < 20:
                    continue
                for sentence in split_sentences(text):
                    total += 1
                    if is_instruction(sentence.text):
                        flagged.append(sentence.text.strip())
    return total, flagged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--show", type=int, default=20, help="flagged sentences to print")
    parser.add_argument("--limit", type=int, default=0, help="flagged sentences allowed before exit 1")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    files = sorted(p for folder in FOLDERS for p in (args.data_root / folder).glob("*.jsonl"))
    if not files:
        log.error("no JSONL files under %s (%s)", args.data_root, ", ".join(FOLDERS))
        return 2
    counts: Counter[str] = Counter()
    flagged: list[str] = []
    for path in files:
        total, found = scan(path)
        counts["sentences"] += total
        flagged += found
        log.info("%-45s %9d sentences %5d flagged", path.name, total, len(found))
    log.info("all: %d sentences, %d flagged", counts["sentences"], len(flagged))
    for sentence in flagged[:args.show]:
        log.info("  %s", sentence[:160])
    return 1 if len(flagged) > args.limit else 0


if __name__ == "__main__":
    sys.exit(main())
