"""MedQA accuracy of `research` (the agent with its tools) against `ask` (retrieve, pack, staged answer) on the same
questions. Needs a model: any OpenAI-compatible endpoint; not run in CI (no model runs here).

    python bench/research_medqa.py --data-root ../shared/data --base-url http://127.0.0.1:8000/v1 --model M \
        --kb /tmp/kb-liveqa --limit 100 --out docs/results/research.md

Each MIRAGE MedQA item is given to both paths with its options and "answer with one letter": `ask` reads the
vignette as a one-fragment patient record; `research` gets vignette and options as its question (and the same
record through patient_record). The first standalone option letter of each answer is scored. Model replies are
cached, so a rerun costs nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from ebmrag.compose import build_engine, build_research_agent, open_resources, require_openai
from ebmrag.config import Settings, with_overrides
from ebmrag.eval.llm_eval import parse_choice
from ebmrag.records.fragment import Fragment, PatientRecord
from ebmrag.research.agent import ResearchAgent
from ebmrag.research.memory import ObservationMemory
from ebmrag.research.tools import PatientRecordTool
from report import emit, machine  # bench/ is on sys.path when a script here runs


def items(data_root: Path, limit: int) -> list[tuple[str, dict[str, Any]]]:
    data = json.loads((data_root / "mirage" / "benchmark_shared.json").read_text(encoding="utf-8"))
    return list(data["medqa"].items())[:limit]


def prompt(item: dict[str, Any]) -> str:
    options = "\n".join(f"{k}. {v}" for k, v in sorted(item["options"].items()))
    return f"{item['question']}\nOptions:\n{options}\nAnswer with the letter of the best option first."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--kb", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--max-steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    settings = with_overrides(Settings(), answer={"retrieval": "always"},
                              llm={"backend": "openai", "base_url": args.base_url, "model": args.model})
    engine = build_engine(settings, args.kb)
    resources = open_resources(settings, args.kb)  # the agent's own models and knowledge base (not the engine's)
    client = require_openai(settings, "research")
    base = build_research_agent(resources, client, max_steps=args.max_steps)  # loads the model once
    r = settings.research
    correct = {"ask": 0, "research": 0}
    seconds = {"ask": 0.0, "research": 0.0}
    chosen = items(args.data_root, args.limit)
    for key, item in chosen:
        record = PatientRecord(f"medqa-{key}", (Fragment("vignette", f"medqa-{key}", item["question"]),))
        started = time.perf_counter()
        answer = engine.ask(prompt(item), record).answer
        seconds["ask"] += time.perf_counter() - started
        correct["ask"] += parse_choice(answer, list(item["options"])) == item["answer"]
        tools = [*base.tools.values(), PatientRecordTool(base.memory.packer, base.memory.tiering.run(record))]
        memory = ObservationMemory(base.memory.packer, base.memory.tiering, r.window, r.output_reserve,
                                   token_counter=resources.token_counter)
        agent = ResearchAgent(client, tools, memory, args.max_steps, r.protocol)
        started = time.perf_counter()
        result = agent.run(prompt(item), record.patient_id)
        seconds["research"] += time.perf_counter() - started
        correct["research"] += parse_choice(result.answer, list(item["options"])) == item["answer"]
    n = max(len(chosen), 1)
    lines = [machine(), f"Model: {args.model} at {args.base_url}; {len(chosen)} MIRAGE MedQA items", "",
             "| path | accuracy | seconds per item |", "|---|---|---|"]
    lines += [f"| {p} | {100 * correct[p] / n:.1f} % | {seconds[p] / n:.1f} |" for p in ("ask", "research")]
    emit(args.out, "research vs ask on MedQA", lines)


if __name__ == "__main__":
    main()
