from __future__ import annotations

import pytest

from ebmrag.errors import ConfigError, ModelUnavailableError
from ebmrag.models.tokens import HuggingFaceTokenCounter, make_token_counter, truncate_words


def test_bundled_counter_counts_without_special_tokens_or_truncation() -> None:
    counter = make_token_counter("bundled")
    assert counter.count("creatinine") >= 1
    long_text = "word " * 600
    assert counter.count(long_text) == 600, "no truncation at 128"
    assert counter.count_many(["a b", "c"]) == [counter.count("a b"), counter.count("c")]


def test_counts_add_up_across_newlines() -> None:
    """The packer sums line costs; the context joins lines with newlines: the two must agree."""
    counter = HuggingFaceTokenCounter()
    lines = ["[a|T1] Penicillin anaphylaxis 2014.", "[b|T2] Creatinine 2.8 mg/dL.", "[c|T4] 上腹痛三个月。"]
    assert counter.count("\n".join(lines)) == sum(counter.count_many(lines))


def test_user_tokenizer_path(tmp_path: object) -> None:
    from ebmrag.models.tokens import bundled_model_dir

    counter = make_token_counter(f"hf:{bundled_model_dir() / 'tokenizer.json'}")
    assert counter.count("hello world") == 2


@pytest.mark.parametrize("spec", ["gpt4", "hf:", "tiktoken:"])
def test_bad_spec(spec: str) -> None:
    with pytest.raises(ConfigError, match="unknown tokenizer"):
        make_token_counter(spec)


def test_missing_local_tokenizer() -> None:
    with pytest.raises(ModelUnavailableError, match="not found"):
        make_token_counter("hf:/nonexistent/tokenizer.json")


def test_truncate_words() -> None:
    assert truncate_words("a b c d", 0.5) == "a b"
    assert truncate_words("a b c d", 0.1) == ""
