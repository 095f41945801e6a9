"""The main job: a clinical question about one patient in, a cited answer and its full trace out.

    tiering (tier decisions and findings) -> gate (completeness, A/B sentences)
    -> [retrieve: chunk-to-document vote -> LLM relevance filter] -> prompt budget -> assembler (dedup,
    per-source cap, sentence cut) -> EBM-Pack over the tiered patient fragments + evidence chunks -> ordering
    -> staged LLM answer or extractive brief -> grounding

A thin pipeline: each step is a component called through its public `run()`, and typed values flow
between them (nothing rendered is parsed back). The composition root builds it (`compose.build_engine`)
and hands it every part and model it uses. Retrieval follows the gate unless `retrieval` says always /
never: a record complete enough to answer from is not diluted with outside text (ICA-RAG). Patient
isolation holds by construction: one `PatientRecord` per call, and the knowledge base holds no
patient data.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from ebmrag.answer.gate import Action, GateDecision, Label, RetrievalGate
from ebmrag.answer.params import AnswerParams
from ebmrag.answer.relevance import RelevanceFilter, RelevanceVerdict
from ebmrag.answer.result import AskResult, RetrievalTrace
from ebmrag.errors import RecordError
from ebmrag.evidence.questions import QuestionClassifier, QuestionType
from ebmrag.evidence.tiering import Tiering
from ebmrag.evidence.tiers import TierClassifier
from ebmrag.generate.assembler import AssembledContext, ContextAssembler
from ebmrag.generate.budget import PromptBudget, extractive_budget, staged_budget
from ebmrag.generate.context import ContextItem, Numbering, context_items, evidence_key, number_context, render_context
from ebmrag.generate.extractive import Citation, cite, extractive_brief
from ebmrag.generate.grounding import GroundingChecker
from ebmrag.generate.injection import fence_for_model, instruction_sentences
from ebmrag.generate.redact import Redactor, redactor_for, should_redact
from ebmrag.generate.staged import StagedAnswerer, StageTrace, cited_numbers
from ebmrag.index.types import SearchHit
from ebmrag.llm.openai import OpenAIChatClient
from ebmrag.llm.prompts import PromptStage, load_prompts, with_warning
from ebmrag.observe.instruments import stage
from ebmrag.packing.packer import ContextPacker
from ebmrag.packing.types import PackResult, validate_window
from ebmrag.protocols import ChatClient, TokenCounter, checkpoint
from ebmrag.records.fragment import PatientRecord
from ebmrag.retrieve.query_rewrite import QueryRewriter, Rewrite
from ebmrag.retrieve.vote import DocumentVoter
from ebmrag.text.language import detect_language
from ebmrag.text.sentences import split_sentences


class Answer(NamedTuple):
    text: str
    citations: tuple[Citation, ...]
    claims: tuple[str, ...]  # the sentences the grounding check reads: no warning, no headings
    stages: tuple[StageTrace, ...] = ()
    fault: str = ""
    redacted: tuple[tuple[str, int], ...] = ()  # kinds and counts of identifiers kept from the model


class Engine:
    """Pipeline: question + patient record -> `AskResult`. Built by the composition root (`compose.build_engine`),
    which hands it every part it uses; `params` are its [answer] settings, validated there."""

    def __init__(self, params: AnswerParams | None = None, *, tiering: Tiering, packer: ContextPacker,
                 gate: RetrievalGate, grounding: GroundingChecker, token_counter: TokenCounter,
                 questions: QuestionClassifier, tier_classifier: TierClassifier, voter: DocumentVoter | None = None,
                 client: ChatClient | None = None, rewriter: QueryRewriter | None = None,
                 relevance: RelevanceFilter | None = None, configuration: dict[str, Any] | None = None) -> None:
        """`tiering`: the step that gives the record's fragments their tier decisions, before the gate; the
        packer packs the tiered record. `tier_classifier`: the rules the extractive brief reads knowledge sentences
        with. `rewriter` (query expansion / HyDE, `[retrieval] query_variants`, `hyde`): its rewordings and passage
        vote beside the question and the record's sentences. `configuration`: the settings tables the root
        built this engine from, which `to_dict` returns (and `compose.engine_from_dict` reads back)."""
        self.settings = answer = params or AnswerParams()
        if answer.retrieval == "always" and voter is None:
            raise ValueError("retrieval 'always' needs a knowledge base")
        if answer.relevance_filter and relevance is None:
            raise ValueError("the relevance filter needs an LLM ([llm] backend)")
        self.tiering, self.packer, self.voter, self.client, self.rewriter = tiering, packer, voter, client, rewriter
        self.gate, self.grounding, self.relevance = gate, grounding, relevance
        self.token_counter, self.questions, self.tier_classifier = token_counter, questions, tier_classifier
        self.configuration = configuration
        self.prompts_path = Path(answer.prompts) if answer.prompts else None
        self._prompt_sets: dict[str, dict[str, PromptStage]] = {}
        if self.prompts_path:
            load_prompts(path=self.prompts_path)  # fail at start-up, not mid-consultation

    def with_retrieval(self, retrieval: str) -> Engine:
        """The same parts under another retrieval mode (an HTTP ask may set it): nothing is rebuilt or lost."""
        params = replace(self.settings, retrieval=retrieval)
        return Engine(params, tiering=self.tiering, packer=self.packer, gate=self.gate, grounding=self.grounding,
                      token_counter=self.token_counter, questions=self.questions,
                      tier_classifier=self.tier_classifier, voter=self.voter, client=self.client,
                      rewriter=self.rewriter, relevance=self.relevance, configuration=self.configuration)

    @property
    def _local_model(self) -> bool:
        """The answering model runs in this process (`llm.local`): nothing it reads leaves the machine."""
        return bool(getattr(self.client, "in_process", False))

    @property
    def shares_embedder(self) -> bool:
        """One model instance for the packer, the gate, grounding and the knowledge base."""
        return self.voter is not None and self.voter.embedder is self.grounding.embedder

    def warm_up(self) -> None:
        self.packer.warm_up()

    def to_dict(self) -> dict[str, Any]:
        """The settings this engine was built from (the API key stays in the environment) and the parts'
        own descriptions; `compose.engine_from_dict` rebuilds it from the settings."""
        return {"settings": self.configuration, "tiering": self.tiering.to_dict(), "packer": self.packer.to_dict(),
                "voter": self.voter.to_dict() if self.voter else None,
                "llm": self.client.to_dict() if isinstance(self.client, OpenAIChatClient) else None,
                "gate": self.gate.to_dict(), "shared_embedder": self.shares_embedder,
                "rewriter": self.rewriter.to_dict() if self.rewriter else None, **asdict(self.settings)}

    def prepare(self, patient: PatientRecord) -> None:
        """Embed a record ahead of the first question (when a chart is opened): fragment texts, their
        compressed states and the gate's query sentences go into the embedding caches, so `ask`
        spends its time on the question only. Optional; `ask` gives the same result without it."""
        record = self.tiering.run(patient)
        queries = list(self._queries("", self.gate.run(record))[1:]) if self._may_retrieve else []
        self.packer.prepare(record, queries if self.shares_embedder else ())
        if self.voter is not None and queries and not self.shares_embedder:
            self.voter.prepare(queries)

    @property
    def _may_retrieve(self) -> bool:
        return self.voter is not None and self.settings.retrieval != "never"

    def ask(self, question: str, record: PatientRecord, prompt_window: int | None = None,
            history: str = "", as_of: datetime | None = None,
            on_stage: Callable[[StageTrace], None] | None = None) -> AskResult:
        """Answer one question about one patient's record (load it at the edge: `compose.load_patient`).
        `prompt_window` is the whole prompt budget of the answering model (default [answer] window); the
        context gets what the prompt's fixed parts leave. Bad input raises a ValueError naming the problem."""
        timings: dict[str, float] = {}
        question = question.strip() if isinstance(question, str) else ""
        if not question:
            raise ValueError("the question is empty")
        if not isinstance(record, PatientRecord):
            raise TypeError("ask takes a PatientRecord; load files and demo names with compose.load_patient")
        language = detect_language(question)
        if not record.fragments:
            raise RecordError(record.origin, f"patient {record.patient_id!r} has no fragments: nothing to answer from")
        asked = self.questions.classify(question)  # typed once, for the gate and the packer
        redactor = self._redactor(record)
        with _timed(timings, "gate"):  # the tiering step's time is the gate's (the stages traced: observe)
            record = self.tiering.run(record)
            decision = self.gate.run(record, question, asked)
        with _timed(timings, "retrieval"):
            retrieval = self._retrieve(question, decision, record, redactor, language)
        prompts = self._prompts(language) if self.client else None
        prompt_window = prompt_window if prompt_window is not None else self.settings.window
        validate_window(prompt_window)
        budget = self._budget(prompt_window, question, decision.warning, history, prompts)
        with _timed(timings, "packing"):
            assembled = self._assemble(retrieval, budget.context)
            numbering = number_context(record, assembled.selected if assembled else ())
            pack = self._pack(numbering, record, question, budget.context, as_of, asked)
            items = tuple(context_items(numbering, pack))
            context = render_context(items, self.settings.ordering)
        with _timed(timings, "answer"):
            answer = self._answer(question, items, context, decision.warning, prompts, history, redactor, on_stage)
        with _timed(timings, "grounding"):
            checked = self.grounding.run(answer.claims, [i.body for i in items])
            unsupported = tuple(s for s in checked if not s.supported)
        backend = "extractive" if self.client is None else "local" if self._local_model else "openai"
        return AskResult(question, record.patient_id, language, backend, decision,
                         answer.text, answer.citations, unsupported, budget, retrieval, assembled, numbering, pack,
                         items, context, answer.stages, answer.fault, timings,
                         tuple(instruction_sentences(items)), dict(answer.redacted), answer.claims)

    def _retrieve(self, question: str, decision: GateDecision, record: PatientRecord,
                  redactor: Redactor | None, language: str) -> RetrievalTrace:
        if self.voter is None or not self._may_retrieve:
            return RetrievalTrace(False, "retrieval is off (no knowledge base or retrieval = never)")
        if self.settings.retrieval == "auto" and decision.action is Action.ANSWER:
            return RetrievalTrace(False, f"the gate answers directly ({decision.reason})")
        queries = self._queries(question, decision)
        rewrite = self._rewrite(question, redactor, language) if self.rewriter else None
        voting = queries if rewrite is None else tuple(dict.fromkeys(
            [question, *rewrite.variants, *([rewrite.hypothesis] if rewrite.hypothesis else []), *queries[1:]]))
        if self.shares_embedder and self.packer.measures_all(record):  # one model call for queries and fragments
            self.packer.prepare(record, voting)  # (a record the packer pre-filters is mostly never embedded)
        documents = self.voter.run(voting, similarity_to=question)
        verdicts: tuple[RelevanceVerdict, ...] = ()
        if self.relevance:  # the filter's prompt carries the question and record sentences: redacted like the answer's
            shown = [redactor.apply(q) for q in queries] if redactor is not None else list(queries)
            verdicts = tuple(self.relevance.run(shown[0], shown[1:], documents)[1])
        reason = "retrieval = always" if self.settings.retrieval == "always" else \
            f"gate: {decision.action.value} ({decision.reason})"
        if rewrite is not None and rewrite.fault:
            reason += f"; {rewrite.fault} (the question searched as written)"
        return RetrievalTrace(True, reason, voting, tuple(documents), verdicts)

    def _rewrite(self, question: str, redactor: Redactor | None, language: str) -> Rewrite:
        """Query expansion / HyDE on the question as the model may see it (identifiers redacted like the answer's
        prompt); the rewordings come back restored, since they only search the local knowledge base."""
        assert self.rewriter is not None
        if redactor is None:
            return self.rewriter.run(question, language)
        done = self.rewriter.run(redactor.apply(question), language)
        return Rewrite(tuple(redactor.restore(v) for v in done.variants), redactor.restore(done.hypothesis),
                       done.fault)

    def _queries(self, question: str, decision: GateDecision) -> tuple[str, ...]:
        """The question, then A sentences, then B sentences, at most `max_queries` in all."""
        key = sorted((s for s in decision.sentences if s.label is not Label.C), key=lambda s: s.label.value)
        return tuple(dict.fromkeys([question, *(s.text for s in key)]))[: self.settings.max_queries]

    def _prompts(self, language: str) -> dict[str, PromptStage]:
        """Read once per language, not on every question."""
        if language not in self._prompt_sets:
            self._prompt_sets[language] = load_prompts(language, self.prompts_path)
        return self._prompt_sets[language]

    def _budget(self, window: int, question: str, warning: str, history: str,
                prompts: dict[str, PromptStage] | None) -> PromptBudget:
        counter = self.token_counter
        if prompts is None:
            return extractive_budget(window, counter, question, warning)
        return staged_budget(window, counter, prompts, question, warning, history)

    def _assemble(self, retrieval: RetrievalTrace, budget: int) -> AssembledContext | None:
        """Evidence may fill at most `evidence_share` of the context; the packer then weighs it against the record."""
        if not retrieval.performed:
            return None
        ranked = [chunk for document in retrieval.kept for chunk in document.chunks]
        # Document votes already ranked these; the assembler sorts by score, so the score is that rank.
        hits: list[SearchHit] = [replace(hit, score=float(len(ranked) - i)) for i, hit in enumerate(ranked)]
        share = max(1, int(budget * self.settings.evidence_share))
        return ContextAssembler(self.token_counter, share).run(hits)

    def _pack(self, numbering: Numbering, record: PatientRecord, question: str, budget: int,
              as_of: datetime | None, asked: QuestionType) -> PackResult:
        """Patient fragments are embedded (and cached); evidence chunks are scored with the similarity the
        vote read from the KB's stored vectors instead of being embedded again."""
        known = {evidence_key(c.hit.chunk_id): c.hit.similarity for c in numbering.chunks
                 if c.hit.similarity is not None}
        return self.packer.run(record, question, budget, as_of, numbering.evidence, known, numbering.headers, asked)

    def _answer(self, question: str, items: tuple[ContextItem, ...], context: str, warning: str,
                prompts: dict[str, PromptStage] | None, history: str, redactor: Redactor | None,
                on_stage: Callable[[StageTrace], None] | None = None) -> Answer:
        if self.client is None or prompts is None:
            return self._brief(question, items, warning)
        full_question = f"{history}\n\n{question}" if history else question
        deadline = time.monotonic() + self.settings.model_seconds
        if redactor is not None:  # the model sees placeholders; the user reads the restored answer
            full_question, context = redactor.apply(full_question), redactor.apply(context)
        context = fence_for_model(context)[0]  # data, not instructions (generate.injection)
        staged = StagedAnswerer(self.client, prompts, on_stage).run(full_question, context, {i.n for i in items},
                                                                    warning, deadline)
        redacted = tuple(redactor.summary().items()) if redactor is not None else ()
        if redactor is not None and staged.answer is not None:
            staged = replace(staged, answer=redactor.restore(staged.answer))
        if staged.answer is None:
            brief = self._brief(question, items, warning)
            note = (f"The model's answer could not be used ({staged.fault}); this is the offline evidence brief "
                    "built from the same context.")
            return brief._replace(text=f"{note}\n\n{brief.text}", stages=staged.stages, fault=staged.fault,
                                  redacted=redacted)
        by_number = {i.n: i for i in items}
        citations = tuple(cite(by_number[n]) for n in sorted(set(cited_numbers(staged.answer))))
        claims = tuple(s.text for s in split_sentences(staged.answer))
        return Answer(with_warning(warning, staged.answer), citations, claims, staged.stages, staged.fault,
                      redacted)

    def _redactor(self, record: PatientRecord) -> Redactor | None:
        if self._local_model and self.settings.redact == "auto":
            return None  # a local model in this process: nothing leaves the machine
        base_url = str(getattr(self.client, "base_url", ""))
        hosts = [h.strip() for h in self.settings.local_hosts.split(",") if h.strip()]
        if not should_redact(self.settings.redact, base_url, hosts):
            return None
        return redactor_for(record.identifiers, record.latest_timestamp)

    def _brief(self, question: str, items: tuple[ContextItem, ...], warning: str) -> Answer:
        brief = extractive_brief(question, items, self.tier_classifier, warning, self.settings.brief_sentences,
                                 self.settings.brief_evidence_sentences)
        return Answer(brief.text, brief.citations, brief.claims)


@contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Time a stage (for the trace, and as a span and a histogram: observe.instruments); its start is a checkpoint
    (a prepared chart's stages compute little in loops that have one)."""
    checkpoint()
    start = time.perf_counter()
    try:
        with stage(name):
            yield
    finally:
        timings[name] = (time.perf_counter() - start) * 1000
