"""The models and stores every component shares, built once from the settings (`Resources`).

A component never builds a model from a path string: the root builds each once here and hands the same
instance to every component that uses it. When the packer would load the model the knowledge base was built
with, the knowledge base's instance is shared, so a cold `ask` embeds the record's fragments and the retrieval
queries in one batch (docs/results/shared_embedder.md measured what the knowledge base's 128-token profile
changes for the packer before this was adopted).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from ebmrag.answer.gate import RuleLabeller, SentenceLabeller
from ebmrag.answer.gate_model import ClassifierLabeller
from ebmrag.config import Settings
from ebmrag.evidence.adr import adr_model
from ebmrag.evidence.entities import EntityCompressor, default_extractor
from ebmrag.evidence.questions import QuestionClassifier, default_question_classifier
from ebmrag.evidence.recogniser import BUNDLED_RECOGNISER, CriticalRecogniser
from ebmrag.evidence.tiers import BUNDLED_TIER_MODEL, TierClassifier
from ebmrag.index.backend import KnowledgeStore, open_knowledge_base
from ebmrag.index.kb import require_readable
from ebmrag.kvcache import KeyValueCache
from ebmrag.llm.local import LlamaCppChatClient
from ebmrag.llm.openai import OpenAIChatClient
from ebmrag.models.embeddings import SentenceEmbedder, default_cache_dir
from ebmrag.models.text_classifier import load_text_classifier
from ebmrag.models.tokens import make_token_counter
from ebmrag.protocols import ChatClient, TokenCounter, checkpoint
from ebmrag.records.fragment import Fragment
from ebmrag.rules import bundled
from ebmrag.text.sentences import split_sentences

log = logging.getLogger(__name__)


class Resources:
    """Embedder, token counter, tier and question classifiers, compressor, chat client, knowledge base and the
    on-disk caches under `cache_dir`, for one process. Cheap to build: the embedding model loads in `warm_up`
    (or on first use), the chat client and the knowledge base when first asked for."""

    def __init__(self, settings: Settings, knowledge_base: KnowledgeStore | None = None,
                 chat_client: ChatClient | None = None, *, demo_kb: bool = False) -> None:
        """`chat_client`: one built already (a model loaded in this process, a test's fake); otherwise [llm]'s is
        built on first use. `demo_kb`: the knowledge base is the bundled demo one, a cache of the bundled corpus
        that nothing but its builder writes (`demo.ensure_demo_kb`)."""
        self.rules = bundled()
        self.rules.check()  # every rule file and every declared reader of one, now: a bad file stops start-up
        adr_model()  # the bundled ADR model too (evidence.adr reads it where rules find no link)
        m = settings.models
        self.settings = settings
        self.cache_dir = cache_dir_of(settings)
        self.knowledge_base = knowledge_base
        self.demo_kb = demo_kb and knowledge_base is not None
        shared = knowledge_base is not None and (m.embedding_model or "") == (knowledge_base.config.embedding_model
                                                                             or "")
        self.embedder: SentenceEmbedder = knowledge_base.embedder if shared and knowledge_base else \
            SentenceEmbedder(m.embedding_model or None, cache_dir=self.cache_dir, precision=m.embedding_precision,
                             runtime=m.embedding_runtime, threads=m.embedding_threads)
        self.token_counter: TokenCounter = make_token_counter(m.tokenizer)
        derived = self.cache_dir / "derived.sqlite"  # tier decisions and state B, keyed by their rule file's content
        tier_model = BUNDLED_TIER_MODEL if m.tier_model == "bundled" else m.tier_model
        self.tier_classifier = TierClassifier(m.tier_rules or None,
                                              load_text_classifier(tier_model, self.embedder) if tier_model else None,
                                              store=KeyValueCache(derived, "tier_rules"),
                                              recogniser=load_recogniser(m.recogniser, m.embedding_threads))
        self.questions = QuestionClassifier(m.question_rules) if m.question_rules else default_question_classifier()
        self.extractor = default_extractor()
        self.compressor = EntityCompressor(self.extractor, store=KeyValueCache(derived, "compressions"))
        gate_model = settings.answer.gate_model
        self.gate_labeller: SentenceLabeller = (
            ClassifierLabeller(gate_model, self.embedder) if gate_model
            else RuleLabeller(self.tier_classifier, self.extractor, store=KeyValueCache(derived, "gate_labels")))
        self._client = chat_client
        self._client_built = chat_client is not None

    @classmethod
    def open(cls, settings: Settings, kb: Path | None, chat_client: ChatClient | None = None, *,
             demo_kb: bool = False) -> Resources:
        """With the knowledge base at `kb` (the configured backend; None: no knowledge base)."""
        return cls(settings, open_kb(settings, kb) if kb is not None else None, chat_client, demo_kb=demo_kb)

    @property
    def shares_embedder(self) -> bool:
        return self.knowledge_base is not None and self.embedder is self.knowledge_base.embedder

    @property
    def chat_client(self) -> ChatClient | None:
        """The answering model [llm] describes: an OpenAI-compatible endpoint, a local GGUF file, or None (the
        offline brief). Built on first use; a missing setting is a one-line error naming the key."""
        if not self._client_built:
            self._client = chat_client(self.settings, self.cache_dir)
            self._client_built = True
        return self._client

    def warm_up(self) -> None:
        """Load the embedding model now (a service at start-up, a CLI behind its spinner)."""
        self.embedder.warm_up()

    def prepare(self, fragments: Sequence[Fragment], step: int = 16) -> None:
        """What an ask computes for these fragments whatever the question, into the caches (serve/prepare.py): tier
        decisions, the gate's labelled sentences, compressed states and their vectors, then the texts' vectors
        (last: a cached text vector marks a prepared fragment). `step` texts per embedding call, a checkpoint
        between calls: a host can pause the work for a request within one small forward pass."""
        decisions = self.tier_classifier.classify_many([(f.text, f.section) for f in fragments])
        self.gate_labeller.label_fragments(fragments)
        tiered = [f.with_decision(d) for f, d in zip(fragments, decisions, strict=True)]
        compressible = [f.text for f in tiered if f.tier.compressible]
        states = [c.text for c in self.compressor.compress_many(compressible) if c.text]
        for texts in (states, [f.text for f in fragments]):
            for start in range(0, len(texts), step):
                checkpoint()
                self.embedder.embed(texts[start : start + step])

    def prepared(self, fragments: Sequence[Fragment]) -> list[bool]:
        """Per fragment: whether it is prepared (its text has a vector; `prepare` computes that last)."""
        texts = [f.text for f in fragments]
        if self.embedder.cached(texts) == len(set(texts)):  # one lookup for a prepared chart
            return [True] * len(texts)
        return [bool(self.embedder.cached([t])) for t in texts]

    def forget(self, fragments: Sequence[Fragment]) -> int:
        """Erasure through one call: the vectors of the fragments' texts and of their compressed states (in the
        knowledge base's embedder too when it is another one: the gate's sentences search with it), their tier
        decisions, the gate's labels and compressed states, and any cached model reply that quotes one of them.
        Returns the cache entries removed."""
        texts = [f.text for f in fragments]
        states = [c.text for c in self.compressor.compress_many(texts) if c.text]
        sentences = [s.text for text in texts for s in split_sentences(text)]  # the gate and the brief embed these
        forgotten = self.embedder.forget(texts + states + sentences)
        if self.knowledge_base is not None and not self.shares_embedder:  # the record's sentences searched it
            forgotten += self.knowledge_base.embedder.forget(texts + sentences)
        forgotten += self.tier_classifier.forget([(f.text, f.section) for f in fragments])
        forgotten += self.compressor.forget(texts)
        if isinstance(self.gate_labeller, RuleLabeller):
            forgotten += self.gate_labeller.forget(fragments)
        client = self._client if self._client_built else None
        cache = getattr(client, "cache", None)
        if cache is not None:
            forgotten += cache.forget_quoting(texts)
        return forgotten


def load_recogniser(setting: str, threads: int = 0) -> CriticalRecogniser | None:
    """[models] recogniser: "bundled" (the package's, where the ONNX runtime is installed: `ebmrag[embed]`), a
    folder of one's own (its errors stop start-up), or "" for rules only. `threads`: ONNX Runtime's intra-op
    threads, as the embedder's ([models] embedding_threads; 0: one per core)."""
    if not setting:
        return None
    if setting != "bundled":
        return CriticalRecogniser(Path(setting), threads)
    try:
        import onnxruntime  # type: ignore[import-untyped]  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError:
        log.warning("the critical-fact recogniser needs ONNX Runtime (pip install 'ebmrag[embed]'); texts the rules "
                    "are unsure of are kept as possible critical facts without it")
        return None
    return CriticalRecogniser(BUNDLED_RECOGNISER, threads)


def cache_dir_of(settings: Settings) -> Path:
    """[models] cache_dir, or $XDG_CACHE_HOME/ebmrag."""
    return Path(settings.models.cache_dir) if settings.models.cache_dir else default_cache_dir()


def open_kb(settings: Settings, kb: Path) -> KnowledgeStore:
    """The knowledge base at `kb` on the configured backend ([kb] build settings apply when it is created)."""
    return open_knowledge_base(settings.kb, settings.storage, kb, cache_dir_of(settings))


def check_kb(settings: Settings, kb: Path) -> None:
    """Fail now, in one line naming what to run, unless `kb` holds a knowledge base this ebmrag reads as it is (no
    knowledge base yet, another format, not a knowledge base): before a command loads a model, or a service takes
    its first request. A Milvus collection is checked when it is opened."""
    if settings.storage.backend == "embedded":
        require_readable(kb)


def chat_client(settings: Settings, cache_dir: Path) -> ChatClient | None:
    """[llm] -> the client; None for the extractive backend."""
    s = settings.llm
    if s.backend == "extractive":
        return None
    if s.backend == "local":
        if not s.model_path:
            raise ValueError("--llm local needs --model-path FILE.gguf (or [llm] model_path)")
        return LlamaCppChatClient(s.model_path, s.context_tokens)
    return openai_client(settings, cache_dir)


def openai_client(settings: Settings, cache_dir: Path) -> OpenAIChatClient:
    s = settings.llm
    missing = [name for name, value in (("base_url", s.base_url), ("model", s.model)) if not value]
    if missing:
        raise ValueError(f'the openai backend needs --base-url and --model ([llm] base_url and model); missing: '
                         f'{", ".join(missing)}')
    return OpenAIChatClient(s.base_url, s.model, s.api_key or None, s.timeout, s.max_retries, cache_dir=cache_dir)
