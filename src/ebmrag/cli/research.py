"""`ebmrag research "QUESTION"`: the research agent; `research export` writes fine-tuning data from its
trajectories; `research score` scores them against gold answers (the reward's parts, research.trajectory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from ebmrag.cli.common import (
    BaseUrlOption,
    ConfigOption,
    JsonOption,
    LlmOption,
    ModelOption,
    console,
    settings_from,
    stderr,
    user_errors,
    write_jsonl,
)
from ebmrag.config import load_settings


class _QuestionFirst(TyperGroup):
    """`research "QUESTION" ...` runs the agent; `research export|score|run ...` are subcommands."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # ctx: typer's vendored click Context
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


research_app = typer.Typer(cls=_QuestionFirst, no_args_is_help=True,
                           help="The medical research agent: tools, a ReAct loop, trajectories.")


@research_app.command("run")
def run(
    question: Annotated[str, typer.Argument(help="The research question.")],
    patient: Annotated[str | None, typer.Option("--patient", help="A record file or bundled demo record; adds "
                                                "the patient_record tool.")] = None,
    kb: Annotated[Path | None, typer.Option("--kb", help="Knowledge base; default: the bundled demo KB.")] = None,
    llm: LlmOption = "openai",
    base_url: BaseUrlOption = None,
    model: ModelOption = None,
    max_steps: Annotated[int | None, typer.Option("--max-steps", help="Model calls before a forced answer.")] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Research a question with the tools, then answer citing only what the tools showed. The run is logged."""
    from ebmrag.compose import build_research_agent, load_patient, open_resources, require_openai, trajectory_folder
    from ebmrag.research.trajectory import TrajectoryLog

    with user_errors():
        settings = settings_from(config, llm=llm, base_url=base_url, model=model)
        resources = open_resources(settings, kb)
        client = require_openai(settings, "research")
        record = load_patient(patient, params=settings.chart) if patient else None
        with stderr.status("loading the knowledge base and the embedding model..."):
            agent = build_research_agent(resources, client, record, max_steps=max_steps)
        with stderr.status("researching (each step is one model call)..."):
            result = agent.run(question, record.patient_id if record else "")
        log_file = TrajectoryLog(trajectory_folder(resources))
        log_file.append(result)
    if as_json:
        typer.echo(json.dumps(result.to_json(), ensure_ascii=False, indent=1))
        return
    console.rule(f"[bold]{result.status}[/] · {len(result.steps)} steps · {result.protocol} protocol")
    console.print(result.answer or "(no answer)", highlight=False, markup=False)
    table = Table("step", "tool", "arguments", "observation", title="trajectory", title_justify="left")
    for step in result.steps:
        table.add_row(str(step.index), step.tool or "answer", escape(step.arguments[:60]),
                      escape(step.observation.splitlines()[0][:80] if step.observation else ""))
    console.print(table)
    for problem in result.problems:
        stderr.print(f"[yellow]note:[/] {escape(problem)}")
    stderr.print(f"logged to {log_file.path}")


@research_app.command("export")
def export(
    format: Annotated[str, typer.Option("--format", help="openai-chat or sharegpt.")],
    out: Annotated[Path, typer.Option(help="JSONL to write (replaced atomically).")],
    trajectories: Annotated[Path | None, typer.Option(help="trajectories.jsonl; default: the configured one.")] = None,
    include_unanswered: Annotated[bool, typer.Option("--include-unanswered", help="Also runs that ended without "
                                                     "an accepted answer.")] = False,
    config: ConfigOption = None,
) -> None:
    """Write fine-tuning data from logged research runs."""
    from ebmrag.compose import Resources, trajectory_folder
    from ebmrag.research.trajectory import FORMATS, export_run, read_runs

    with user_errors():
        if format not in FORMATS:
            raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {format!r}")
        source = trajectories or trajectory_folder(Resources(load_settings(config))) / "trajectories.jsonl"
        written = write_jsonl(out, (export_run(r, format) for r in read_runs(source)
                                    if include_unanswered or r.get("status") == "answered"))
    stderr.print(f"{written} runs -> {out} ({format})")


def _gold_answers(path: Path) -> dict[str, str]:
    """run_id or question -> gold answer; a line without them is named, not skipped."""
    answers: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        key = row.get("run_id") or row.get("question") if isinstance(row, dict) else None
        if not key or not isinstance(row.get("answer"), str):
            raise ValueError(f"{path}:{number}: a gold line needs \"answer\" and \"run_id\" or \"question\"")
        answers[str(key)] = row["answer"]
    return answers


@research_app.command("score")
def score(
    gold: Annotated[Path, typer.Option(help="JSONL of {\"question\" or \"run_id\", \"answer\"}.")],
    trajectories: Annotated[Path | None, typer.Option(help="trajectories.jsonl; default: the configured one.")] = None,
    as_json: JsonOption = False,
    config: ConfigOption = None,
) -> None:
    """Seed 004's reward parts per run: answer correctness, wasted tool calls, the total."""
    from ebmrag.compose import Resources, trajectory_folder
    from ebmrag.research.trajectory import read_runs, score_run

    with user_errors():
        answers = _gold_answers(gold)
        source = trajectories or trajectory_folder(Resources(load_settings(config))) / "trajectories.jsonl"
        scored: list[dict[str, Any]] = []
        for run_line in read_runs(source):
            key = run_line["run_id"] if run_line["run_id"] in answers else run_line["question"]
            if key in answers:
                scored.append({"run_id": run_line["run_id"], **score_run(run_line, answers[key]).to_json()})
    summary = {"runs": len(scored), "mean_total": round(sum(s["total"] for s in scored) / max(len(scored), 1), 4),
               "mean_task": round(sum(s["task"] for s in scored) / max(len(scored), 1), 4), "per_run": scored}
    typer.echo(json.dumps(summary, indent=1) if as_json else json.dumps({k: v for k, v in summary.items()
                                                                          if k != "per_run"}))
