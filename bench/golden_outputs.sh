#!/usr/bin/env bash
# Outputs a refactor must not change: `ebmrag eval packing` (15 cases of each dataset, windows 256 and 1024) and
# `ask --json` on the bundled demo records, with every timing field stripped, hashed into OUTDIR/SHA256.
# Run it on the tree before and after a structure change and diff the two SHA256 files (SRC picks the tree's src/).
#   bash bench/golden_outputs.sh /tmp/before [SRC] [DATA]
set -euo pipefail
out=$1; src=${2:-$PWD/src}; data=${3:-../shared/data}
mkdir -p "$out"
export XDG_CACHE_HOME=$out/cache
run() { PYTHONPATH=$src "${PYTHON:-.venv/bin/python}" -m ebmrag "$@"; }
strip='import json,sys
def s(o):
    if isinstance(o,dict): return {k:s(v) for k,v in o.items() if not any(t in k for t in ("time","timing","ms","seconds"))}
    if isinstance(o,list): return [s(v) for v in o]
    return o
print(json.dumps(s(json.load(sys.stdin)),indent=1,sort_keys=True,ensure_ascii=False))'
for pair in agentclinic:agentclinic medqa:mirage cmb:cmb_clin; do
  run eval packing --dataset "${pair%%:*}" --data-dir "$data/${pair#*:}" --out "$out/pk-${pair%%:*}" --limit 15 \
    --windows 256,1024 > /dev/null 2>&1
  python3 -c "$strip" < "$out/pk-${pair%%:*}/results.json" > "$out/pk-${pair%%:*}.json"
done
question="Which antibiotic is safe for his wound infection, given his allergy and kidney function?"
for patient in demo-colon demo-chest demo-zh; do
  for window in 900 4096; do
    run ask "$question" --patient $patient --window $window --json 2>/dev/null | python3 -c "$strip" \
      > "$out/ask-$patient-$window.json"
  done
done
run ask "这位患者下一步应如何治疗？" --patient demo-zh --json 2>/dev/null | python3 -c "$strip" > "$out/ask-zh-q.json"
run ask "$question" --patient demo-colon --retrieval never --json 2>/dev/null | python3 -c "$strip" > "$out/ask-never.json"
(cd "$out" && sha256sum ./*.json) > "$out/SHA256"
cat "$out/SHA256"
