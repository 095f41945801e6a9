"""Coverage of a folder of charts (issue 47): how many populated clinical elements reached no fragment, and which
elements only the generic line says (the renderers to improve next).

Run: python bench/chart_coverage.py FOLDER [FOLDER ...] [--top 10]

Every file of each folder is read with `load_record` (FHIR JSON or XML, C-CDA, NDJSON). A chart the reader refuses
with a reason (two patients, not a chart) is listed with it; any other exception is a defect and makes the command
exit 1, as does any unrendered clinical element.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections import Counter
from pathlib import Path

from ebmrag.errors import EbmragError
from ebmrag.records.loaders import load_record

log = logging.getLogger("chart_coverage")


def folder_coverage(folder: Path, top: int) -> bool:
    """Logs the folder's totals; True when every chart read said every clinical element."""
    generic, unrendered, refused, crashed, read = Counter[str](), Counter[str](), [], [], 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".md")):
        try:
            coverage = load_record(path).coverage
        except EbmragError as exc:
            refused.append(f"{path.name}: {str(exc)[:160]}")
            continue
        except Exception as exc:  # a traceback on a chart is the defect this command looks for
            crashed.append(f"{path.name}: {type(exc).__name__}: {exc}")
            continue
        read += 1
        generic.update(dict(coverage.generic))
        unrendered.update(dict(coverage.unrendered))
    log.info("%s: %d charts read, %d refused, %d crashed; elements said only by a generic line: %d; unrendered: %d",
             folder, read, len(refused), len(crashed), sum(generic.values()), sum(unrendered.values()))
    for element, count in unrendered.most_common():
        log.info("  unrendered %s: %d", element, count)
    for element, count in generic.most_common(top):
        log.info("  generic %s: %d", element, count)
    for line in refused + crashed:
        log.info("  %s", line)
    return not crashed and not unrendered


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=10, help="how many generic paths to list per folder")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("ebmrag").setLevel(logging.WARNING)
    results = [folder_coverage(folder, args.top) for folder in args.folders]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
