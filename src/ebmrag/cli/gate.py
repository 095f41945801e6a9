"""`ebmrag gate annotate` (masking labels from a model) and `ebmrag gate train` (the A/B/C classifier)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ebmrag.cli.common import (
    BaseUrlOption,
    ConfigOption,
    LlmOption,
    ModelOption,
    console,
    progress_bar,
    settings_from,
    user_errors,
)
from ebmrag.compose import Resources, build_retriever, require_openai
from ebmrag.config import load_settings
from ebmrag.text.sentences import split_sentences

gate_app = typer.Typer(help="Train the retrieval gate's sentence classifier.", no_args_is_help=True)


@gate_app.command("annotate")
def annotate(
    dataset: Annotated[str, typer.Option(help="Cases with a gold diagnosis: agentclinic or cmb.")],
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Folder of the dataset.")],
    out: Annotated[Path, typer.Option(help="JSONL of labelled sentences (appended case by case).")],
    kb: Annotated[Path | None, typer.Option("--kb", help="Knowledge base for strategy 2 (B labels).")] = None,
    limit: Annotated[int, typer.Option(help="At most this many cases (0 = all).")] = 0,
    llm: LlmOption = "openai",
    base_url: BaseUrlOption = None,
    model: ModelOption = None,
    config: ConfigOption = None,
) -> None:
    """Label every sentence A/B/C by masking it and asking the model whether the diagnosis survives."""
    from ebmrag.answer.gate_model import MaskingAnnotator
    from ebmrag.eval.cases import load_cases

    with user_errors():
        settings = settings_from(config, llm=llm, base_url=base_url, model=model, retrieval={"mode": "bm25"})
        resources = Resources.open(settings, kb)
        client = require_openai(settings, "annotation")
        retriever = build_retriever(resources) if kb else None
        annotator = MaskingAnnotator(client, retriever)
        cases = [c for c in load_cases(dataset, data_dir, limit) if c.answer]
        counts = {"A": 0, "B": 0, "C": 0}
        out.parent.mkdir(parents=True, exist_ok=True)
        with progress_bar() as bar, out.open("a", encoding="utf-8") as handle:
            task = bar.add_task("annotating cases", total=len(cases))
            for case in cases:
                sentences = [s.text for f in case.record.fragments for s in split_sentences(f.text)]
                for row in annotator.annotate(case.case_id, sentences, case.answer):
                    handle.write(json.dumps(row.to_json(), ensure_ascii=False) + "\n")
                    counts[row.label.value] += 1
                bar.advance(task)
    console.print(f"{len(cases)} cases -> {out}: {counts}; model spend {client.usage.to_json()}")


@gate_app.command("train")
def train(
    annotations: Annotated[Path, typer.Argument(help="JSONL from `ebmrag gate annotate`.")],
    out: Annotated[Path, typer.Option(help="Where to save the classifier (.npz).")],
    config: ConfigOption = None,
) -> None:
    """Fit the A/B/C classifier on sentence embeddings; prints held-out accuracy. Use it with [answer] gate_model."""
    from ebmrag.answer.gate_model import read_annotations, train_classifier

    with user_errors():
        report = train_classifier(read_annotations(annotations), Resources(load_settings(config)).embedder, out)
    console.print(f"{report.examples} sentences, {report.held_out} held out: accuracy {report.accuracy:.3f}")
    for label, scores in report.per_label.items():
        console.print(f"  {label}: {scores}")
    console.print(f"saved {out}; set [answer] gate_model = \"{out}\" to use it")
