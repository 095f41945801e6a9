"""Evaluation commands: `eval packing` (one dataset), `eval packing-suite` (every experiment), `eval mirage`
(multiple-choice accuracy with a model), `eval gate` (the retrieval gate on real cases), `eval retrieval`
(a knowledge base on a public benchmark) and `eval tiers` (the tier classifier against typed fields)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from ebmrag.cli.common import (
    BaseUrlOption,
    ConfigOption,
    JsonOption,
    KbOption,
    LlmOption,
    ModelOption,
    ModelPathOption,
    progress_bar,
    progress_callback,
    settings_from,
    stderr,
    user_errors,
    write_report,
)
from ebmrag.cli.kb import report_table
from ebmrag.compose import (
    Resources,
    build_reranker,
    build_retriever,
    build_rewriter,
    build_tiering,
    open_kb,
    require_openai,
)
from ebmrag.config import Settings, load_settings
from ebmrag.eval.cases import DATASETS
from ebmrag.eval.diagnosis import IcdIndex
from ebmrag.eval.llm_eval import diagnosis_f1, mirage_accuracy, packing_accuracy, rows_json
from ebmrag.eval.noise import NoiseConfig
from ebmrag.eval.packing_report import dataset_dir
from ebmrag.eval.packing_suite import NEUTRAL, Suite, rows_table
from ebmrag.index.sync import ingest_paths
from ebmrag.llm.openai import OpenAIChatClient
from ebmrag.packing.packer import STRATEGIES, make_packer
from ebmrag.packing.utility import CandidateBuilder

eval_app = typer.Typer(help="Measure ebmrag on public data.", no_args_is_help=True)

NoiseRatio = Annotated[int, typer.Option(help="Noise fragments per signal fragment (the paper: 12).")]
RecentShare = Annotated[float, typer.Option(help="Share of the noise dated on the encounter day (paper: 0).")]
Seed = Annotated[int, typer.Option(help="Seed of the noise generator.")]


def make_suite(settings: Settings, noise: NoiseConfig) -> Suite:
    """Measures with neutral utility parameters; each experiment applies its own when it scores."""
    r = Resources(settings)
    return Suite(CandidateBuilder(r.embedder, r.token_counter, NEUTRAL, compressor=r.compressor), build_tiering(r),
                 r.extractor, r.token_counter, noise)


def _write_llm(out: Path, rows: list[dict[str, object]], client: OpenAIChatClient) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "llm_results.json").write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "llm_usage.json").write_text(json.dumps({"model": client.model, **client.usage.to_json()}, indent=1)
                                        + "\n", encoding="utf-8")
    stderr.print(f"LLM spend: {client.usage.to_json()} -> {out / 'llm_results.json'}")


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--{name} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"--{name} needs positive integers, got {text!r}")
    return values


@eval_app.command("packing")
def eval_packing(
    dataset: Annotated[str, typer.Option(help=f"One of {', '.join(DATASETS)}.")],
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Folder with the dataset's files.")],
    out: Annotated[Path, typer.Option(help="Folder for results.json and results.md.")],
    windows: Annotated[str, typer.Option(help="Token windows, comma-separated.")] = "256,512,1024,2048",
    strategies: Annotated[str, typer.Option(help="Packing strategies, comma-separated.")] = ",".join(STRATEGIES),
    limit: Annotated[int, typer.Option(help="Use the first N cases (0 = all).")] = 0,
    k_min: Annotated[int, typer.Option(help="Minimum fragments per tier for the EBM packers.")] = 1,
    noise_ratio: NoiseRatio = 12,
    recent_share: RecentShare = 0.0,
    seed: Seed = 0,
    half: Annotated[str, typer.Option(help="all, or a fixed hash half of the cases: tune | check (the noise is "
                                      "drawn from every case either way).")] = "all",
    llm: LlmOption = None,
    model: ModelOption = None,
    base_url: BaseUrlOption = None,
    icd10_dir: Annotated[Path | None, typer.Option(help="ICD-10 tables for diagnosis F1 (icd10*.tsv).")] = None,
    config: ConfigOption = None,
) -> None:
    """RRCE, entity RRCE and its ceiling, T1 retention, utility ratio and time per pack on real cases.

    With --llm openai: MedQA accuracy and APR per strategy and window, or diagnosis F1 (AgentClinic, CMB).
    """
    from ebmrag.eval.packing_report import run_packing

    with user_errors():
        settings = settings_from(config, llm=llm, base_url=base_url, model=model)
        names = [s.strip() for s in strategies.split(",") if s.strip()]
        unknown = sorted(set(names) - set(STRATEGIES))
        if unknown or not names:
            raise ValueError(f"unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}")
        suite = make_suite(settings, NoiseConfig(ratio=noise_ratio, recent_share=recent_share, seed=seed))
        params = settings.packing.utility
        client = require_openai(settings, "eval packing") if settings.llm.backend != "extractive" \
            else None
        index = None
        if client and dataset != "medqa":
            if icd10_dir is None:
                raise ValueError("diagnosis F1 needs --icd10-dir (a folder with icd10*.tsv tables)")
            index = IcdIndex.from_dir(icd10_dir)
        window_list = _ints(windows, "windows")
        with progress_bar() as bar:
            rows, prepared = run_packing(suite, dataset, data_dir, window_list, names, out, limit, k_min, params,
                                         progress_callback(bar), half)
        typer.echo(rows_table("results", f"{dataset}: packing results", rows).markdown())
        stderr.print(f"wrote {out / 'results.json'}")
        if client:
            packers = [make_packer(n, suite.token_counter, k_min) for n in names]
            if index is None:
                llm_rows = rows_json(packing_accuracy(client, prepared, packers, window_list, params))
            else:
                llm_rows = rows_json(diagnosis_f1(client, prepared, packers, window_list, params, index))
            _write_llm(out, llm_rows, client)


@eval_app.command("mirage")
def eval_mirage(
    benchmark: Annotated[Path, typer.Option(help="MIRAGE benchmark JSON (benchmark*.json).")],
    out: Annotated[Path, typer.Option(help="Folder for llm_results.json and llm_usage.json.")],
    llm: LlmOption = "openai",
    model: ModelOption = None,
    base_url: BaseUrlOption = None,
    subsets: Annotated[str, typer.Option(help="Comma-separated subsets.")] = "medqa,medmcqa,pubmedqa,bioasq,mmlu",
    kb: Annotated[Path | None, typer.Option("--kb", help="Also answer with the top-k chunks of this KB.")] = None,
    k: Annotated[int, typer.Option("--k", help="Chunks given as context with --kb.")] = 5,
    limit: Annotated[int, typer.Option(help="First N questions per subset (0 = all).")] = 0,
    config: ConfigOption = None,
) -> None:
    """MIRAGE multiple-choice accuracy of a model, with and without retrieval from a knowledge base."""

    with user_errors():
        settings = settings_from(config, llm=llm or "openai", base_url=base_url, model=model)
        resources = Resources.open(settings, kb)
        client = require_openai(settings, "eval mirage")
        retriever = build_retriever(resources) if kb else None
        names = [s.strip() for s in subsets.split(",") if s.strip()]
        rows = rows_json(mirage_accuracy(client, benchmark, names, limit, retriever, k))
        _write_llm(out, rows, client)
    typer.echo(json.dumps(rows, indent=1))


@eval_app.command("packing-suite")
def eval_packing_suite(
    data_root: Annotated[Path, typer.Option("--data-root", help="Folder holding the MIRAGE, AgentClinic and "
                                            "CMB-Clin files (found by pattern, in subfolders too).")],
    out: Annotated[Path, typer.Option(help="Results folder.")] = Path("docs/results/packing"),
    limit: Annotated[int, typer.Option(help="Use the first N cases of each dataset (0 = all).")] = 0,
    sweep_cases: Annotated[int, typer.Option(help="Cases per dataset in the noise sweep.")] = 50,
    seed: Seed = 0,
    config: ConfigOption = None,
) -> None:
    """All EBM-Pack experiments (windows, noise, k_min, tier weights, ε × λ, greedy vs exact) with plots."""
    from ebmrag.eval.packing_report import run_suite

    with user_errors():
        suite = make_suite(load_settings(config), NoiseConfig(seed=seed))
        with progress_bar() as bar:
            seconds = run_suite(suite, data_root, out, limit, sweep_cases, progress_callback(bar))
    timing = ", ".join(f"{step} {value:.0f} s" for step, value in seconds.items())
    stderr.print(f"wrote {out}: {timing}")


@eval_app.command("gate")
def eval_gate(
    data_root: Annotated[Path, typer.Option("--data-root", help="Folder holding AgentClinic / CMB-Clin files.")],
    out: Annotated[Path | None, typer.Option(help="Write the markdown report here.")] = None,
    config: ConfigOption = None,
) -> None:
    """Retrieval-gate decisions and sentence labels on full records and history-only cuts."""
    from ebmrag.compose import build_gate
    from ebmrag.eval.gate_report import HISTORY_SECTIONS, gate_report

    with user_errors():
        folders = {d: f for d in HISTORY_SECTIONS if (f := dataset_dir(data_root, d)) is not None}
        if not folders:
            raise ValueError(f"no AgentClinic or CMB-Clin files under {data_root}")
        report = gate_report(build_gate(Resources(load_settings(config))), folders)
    write_report(report, out)


@eval_app.command("retrieval")
def eval_retrieval(
    dataset: Annotated[str, typer.Option(help="liveqa, pubmedqa or medquad.")],
    data_dir: Annotated[Path, typer.Option("--data-dir", help="Folder with the questions / qrels files.")],
    kb: KbOption,
    corpus: Annotated[list[Path] | None, typer.Option("--corpus", help="Corpus files to ingest into a new KB.")] = None,
    limit: Annotated[int, typer.Option(help="Evaluate a deterministic sample of this many queries (0 = all).")] = 0,
    ablation: Annotated[bool, typer.Option(help="Also score the fusion variants.")] = False,
    split: Annotated[str, typer.Option(help="all, or a fixed hash half: tune | check.")] = "all",
    out: Annotated[Path | None, typer.Option(help="Append the markdown table to this file.")] = None,
    llm: LlmOption = None,
    base_url: BaseUrlOption = None,
    model: ModelOption = None,
    model_path: ModelPathOption = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Recall@10, MRR and nDCG@10 of BM25, dense and hybrid retrieval on a public benchmark (with [retrieval]
    query_variants / hyde and a model, also "hybrid+rewrite")."""
    from ebmrag.eval.retrieval import evaluate_retrieval, load_queries, markdown_table, select_split

    with user_errors():
        settings = settings_from(config, llm=llm, base_url=base_url, model=model, model_path=model_path)
        knowledge_base = open_kb(settings, kb)
        resources = Resources(settings, knowledge_base)
        if not knowledge_base.exists:
            if not corpus:
                raise ValueError(f"{kb} does not exist yet: give the corpus files with --corpus")
            with progress_bar() as bar:
                report = ingest_paths(knowledge_base, corpus, progress=progress_callback(bar))
            stderr.print(report_table(report))
        queries = select_split(load_queries(dataset, data_dir, corpus or [], limit), split)
        r = settings.retrieval
        rewriter = build_rewriter(resources)
        with stderr.status(f"retrieving for {len(queries)} queries..."):
            result = evaluate_retrieval(knowledge_base, dataset, queries, r.fusion, (r.bm25_weight, r.dense_weight),
                                        ablation, r.focus_weight, build_reranker(r),
                                        rewriter.run if rewriter else None)
    table = markdown_table(result)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a", encoding="utf-8") as handle:
            handle.write(table + "\n")
    typer.echo(json.dumps(result.to_json(), indent=2) if as_json else table)


@eval_app.command("generation")
def eval_generation(
    questions: Annotated[Path, typer.Option(help="JSON lines: {id, question, patient (file or demo name), "
                                                 "reference?, window?}.")],
    kb: Annotated[Path | None, typer.Option("--kb", help="Knowledge base (default: the bundled demo one).")] = None,
    llm: LlmOption = None,
    base_url: BaseUrlOption = None,
    model: ModelOption = None,
    model_path: ModelPathOption = None,
    window: Annotated[int | None, typer.Option(help="Use this window for every question (a model needs more room "
                                                    "than the offline brief).")] = None,
    judge: Annotated[bool, typer.Option(help="Judge with the configured model (off: offline approximations "
                                             "only, even when a model answers).")] = True,
    out: Annotated[Path | None, typer.Option(help="Write the markdown table here.")] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Faithfulness, answer relevancy, context relevancy and context recall of `ask` answers (model-judged when a
    model is configured, else offline approximations; each score names its method)."""
    from ebmrag.compose import build_engine_from, open_resources
    from ebmrag.eval.generation import GenerationJudge, evaluate_generation, load_questions, markdown, summary

    with user_errors():
        items = load_questions(questions)
        if window is not None:
            items = [replace(q, window=window) for q in items]
        settings = settings_from(config, llm=llm, base_url=base_url, model=model, model_path=model_path)
        resources = open_resources(settings, kb, retrieval=settings.answer.retrieval != "never")
        engine = build_engine_from(resources)
        scorer = GenerationJudge(engine, resources.chat_client if judge else None, embedder=resources.embedder)
        with progress_bar() as bar:
            task = bar.add_task("asking and judging", total=len(items))
            rows = evaluate_generation(engine, scorer, items, lambda done: bar.update(task, completed=done))
    table = markdown(rows)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(table, encoding="utf-8")
    document = {"summary": summary(rows), "questions": [r.to_json() for r in rows]}
    typer.echo(json.dumps(document, ensure_ascii=False, indent=2) if as_json else table)


@eval_app.command("compression")
def eval_compression(
    data_root: Annotated[Path, typer.Option("--data-root", help="Folder holding MIRAGE, AgentClinic, CMB-Clin files.")],
    out: Annotated[Path | None, typer.Option(help="Write the markdown report here.")] = None,
    as_json: JsonOption = False,
) -> None:
    """List the entities the entity-preserving compression (state B) drops from critical fragments."""
    from ebmrag.eval.compression_check import check_compression, compression_markdown

    with user_errors():
        check = check_compression(data_root, Resources(Settings()).compressor)
    if as_json:
        typer.echo(json.dumps(check.to_json(), ensure_ascii=False, indent=1))
        return
    write_report(compression_markdown(check), out)


@eval_app.command("tiers")
def eval_tiers(
    data_dir: Annotated[Path | None, typer.Option("--data-dir", help="Folder with agentclinic_*.jsonl files (with "
                                                  "--text-only: AgentClinic, NEJM and CMB-Clin files, searched "
                                                  "below).")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the markdown report here.")] = None,
    text_only: Annotated[bool, typer.Option("--text-only", help="Hide sections: tier from the text alone, "
                                            "per-tier precision and recall.")] = False,
    labelled: Annotated[list[Path] | None, typer.Option(
        "--labelled", help="--text-only: a JSONL file of labelled texts ({id, text, lang, tier, kind}; the "
        "text_corpora and ADE shapes too) or a folder of *.jsonl; repeatable.")] = None,
    half: Annotated[str, typer.Option(help="--text-only: all, or the fixed hash half of the cases and "
                                      "documents: tune | check.")] = "all",
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Agreement of the tier classifier with labels that do not come from it (typed fields, sections, corpora)."""
    from ebmrag.eval.labelled_tiers import measure_labelled, tiers_command, tiers_json, tiers_markdown
    from ebmrag.eval.tier_agreement import agreement_report, check_half, measure_agreement, measure_text_only

    with user_errors():
        if not text_only:
            if labelled or half != "all":
                raise ValueError("--labelled and --half need --text-only")
            if data_dir is None:
                raise ValueError("give the AgentClinic folder with --data-dir")
            report = agreement_report(measure_agreement(data_dir))
        else:
            if data_dir is None and not labelled:
                raise ValueError("give --data-dir, --labelled or both")
            check_half(half)
            command = tiers_command(data_dir, labelled or [], half, out)
            classifier = Resources(load_settings(config)).tier_classifier  # rules + the configured tier model
            with progress_bar() as bar:
                progress = progress_callback(bar)
                scored = measure_labelled(labelled, classifier, half, progress) if labelled else None  # reads first
                measured = measure_text_only(data_dir, classifier, half, progress) if data_dir else None
            if as_json:
                typer.echo(json.dumps(tiers_json(command, half, measured, scored), ensure_ascii=False, indent=1))
                return
            report = tiers_markdown(command, half, measured, scored)
    write_report(report, out)
