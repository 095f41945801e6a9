"""Whether a laboratory result, and a text that reports results, is critical, abnormal or normal.

A result within its reference range is not a finding that deserves the current encounter's packing level, and a
compressed lab panel need only keep what is abnormal (issue 46); both need the judgement a report already writes
beside a value, read in the order a clinician would trust it:

1. critical when `evidence.results` finds the value beyond a critical limit, or the report flags it so (HH, LL, AA,
   "critical", 危急值);
2. abnormal when a flag is written beside it (the HL7 v3 ObservationInterpretation codes of
   `rules/records/interpretation.toml` and their meanings, arrows, "*", 偏高/偏低: `rules/evidence/result_flags.toml`)
   or the value lies outside the reference range written beside it ("3.5-5.0", "(135–145)", "参考值 3.5-5.5");
   normal when a written flag (N) or range holds it. Written evidence of abnormality wins over written normality;
3. only when nothing is written: the analyte's adult reference interval (`reference` in analytes.toml), compared in
   the canonical unit; a value whose unit is ambiguous, or an analyte without an interval, stays unknown ("").

A text (`result_flag`) is cut into clauses. It is critical when one result is, abnormal when one result is or a
clause states abnormality in words that the shared negation cues do not take back ("potassium elevated", but not
"no abnormality", which states normality). It is normal only when it reports results or normality and every
clause that says anything is normal: a clause that names a symptom, a plan or a diagnosis, a result read but not
judged, or a value not read at all makes it "" (unknown), the safe answer for a reader that sets normal text aside.
Both judgements are memoised: the tier rules ask for every fragment.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from typing import Any

from ebmrag.errors import ConfigError
from ebmrag.evidence.results import ResultMention, load_vocabulary
from ebmrag.kvcache import digest
from ebmrag.rules import RuleFile, rule_file
from ebmrag.vocab.negation import negation

CRITICAL, ABNORMAL, NORMAL = "critical", "abnormal", "normal"
FLAGS, INTERPRETATION = "evidence/result_flags.toml", "records/interpretation.toml"  # in the rules folder
HIGH, LOW = "high", "low"


@dataclass(frozen=True)
class FlaggedResult:
    mention: ResultMention
    flag: str  # CRITICAL | ABNORMAL | NORMAL | "" (unknown: no range, no flag, no interval that applies)
    why: str  # "above its reference range 3.5-5.0", "flagged H", "potassium 6.8 mmol/L ≥ 6.0 (critical high)"


@dataclass(frozen=True)
class ResultReading:
    """A flagged result with what a compressed panel needs to keep it whole: where its flag and range end, which
    side of the range it lies on, and whether the text writes a flag (else a kept value needs a mark)."""

    result: FlaggedResult
    end: int  # end of the value, its unit and what is written beside it (flags, reference range)
    side: str  # HIGH, LOW or "" (inside, or unknown)
    written: bool  # a flag is written beside the value


@dataclass(frozen=True)
class FlagGrammar:
    """The compiled rules: flags and ranges beside a value, and statements in words."""

    flag: re.Pattern[str]  # one flag, anchored where it is tried
    flag_class: Mapping[str, str]  # a code as written, a word lower-cased -> CRITICAL | ABNORMAL | NORMAL
    range: re.Pattern[str]  # one reference range, anchored where it is tried
    bracketed_flag: re.Pattern[str]  # "(H)" between an analyte's name and its value
    statement: re.Pattern[str]
    statement_class: Mapping[str, str]  # a statement word -> "abnormal" | "directional" | "normal"
    framing: re.Pattern[str]
    subject_words: int
    subject_characters: int
    fingerprint: str  # digest of both files: stored compressions made with other flags are stale


_NUMBER = r"\d+(?:[.,]\d+)*(?![.,]?\d)"  # never backtracks into a shorter number
_OPEN, _CLOSE = r"[(（\[【]", r"[)）\]】]"
_DASH = r"(?:[-–—~～〜至到]|to)"
_SEPARATOR = re.compile(r"[ \t|]*")
_REMARK_END = re.compile(r"[)）\]】\n]")
_SENTENCE_END = re.compile(r"(?<!\d)\.(?!\d)|[!?。！？;；\n]")  # as vocab.negation reads a scope's end
_CLAUSE_END = re.compile(r"(?<!\d),|,(?!\d)|[;，；。！？!?\n]|\.(?!\d)")
_DATE = re.compile(r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d{1,2}/\d{1,2}(?:/\d{2,4})?|\d{1,2}:\d{2}|"
                   r"\d{4}年(?:\d{1,2}月)?(?:\d{1,2}日)?|\d{1,2}月\d{1,2}日")
_CONTENT = re.compile(r"[A-Za-z]+|\d+(?:[.,]\d+)*|[\u3400-\u9fff]")
_COMPARATOR = re.compile(r"([<>≤≥≦≧])=?\s*\d")  # in a mention, only before its value


@rule_file(INTERPRETATION, FLAGS, as_files=True)
def flag_grammar(interpretation: RuleFile, flags: RuleFile) -> FlagGrammar:
    """The HL7 codes and their meanings (interpretation.toml) with this file's flags, ranges and statements,
    compiled once per book (default: the bundled one)."""
    codes, words = _flag_vocabulary(interpretation, flags)
    classes = {**{_key(w): c for w, c in words.items()}, **codes}
    alternatives = _exact(codes) + "|" + _words(words)
    # a flag followed by a lone number is the next analyte's name ("N 78%"), not a flag ("H 3.5-5.0" is one); a
    # flag may open a bracketed remark ("(high; 1.1 before surgery)")
    flag = re.compile(rf"(?:{_OPEN}\s*(?P<inside>{alternatives})\s*{_CLOSE}|(?P<bare>{alternatives})"
                      rf"|{_OPEN}\s*(?P<opening>{alternatives})\s*(?=[;,，；]))"
                      rf"(?!\s*[:=]?\s*{_NUMBER}(?!\s*{_DASH}\s*\d))")
    table = flags.table
    prefixes = _words(_strings(flags, "[reference] prefixes", table["reference"]["prefixes"]))
    def core(n: int) -> str:  # each alternative below names its groups apart: low0, high0, upper0, lower0, ...
        return (rf"(?:(?P<low{n}>{_NUMBER})\s*{_DASH}\s*(?P<high{n}>{_NUMBER})|[<≤≦]=?\s*(?P<upper{n}>{_NUMBER})"
                rf"|[>≥≧]=?\s*(?P<lower{n}>{_NUMBER}))")

    ends = rf"(?=[ \t|]*(?:$|[,;，；。、\n|]|\.(?!\d)|{_OPEN}|(?:{alternatives})))"
    range_ = re.compile(rf"{_OPEN}\s*(?:(?:{prefixes})\s*[:：=]?\s*)?{core(0)}[^()（）\[\]【】\n]{{0,16}}?{_CLOSE}"
                        rf"|(?:{prefixes})\s*[:：=]?\s*{_OPEN}?\s*{core(1)}\s*{_CLOSE}?"
                        rf"|{core(2)}{ends}")
    statements = table["statements"]
    lists = {kind: _strings(flags, f"[statements] {kind}", statements[kind])
             for kind in ("abnormal", "directional", "normal", "framing")}
    statement_class = {_key(w): kind for kind in ("directional", "normal", "abnormal")
                       for w in lists[kind]}
    subject = (statements["subject_words"], statements["subject_characters"])
    if not all(isinstance(n, int) and n >= 0 for n in subject):
        raise ConfigError(f"{flags.path}: [statements] subject_words and subject_characters must be whole numbers")
    return FlagGrammar(
        flag, classes, range_, re.compile(rf"{_OPEN}\s*(?:{alternatives})\s*{_CLOSE}"),
        re.compile(_words(statement_class)), statement_class, re.compile(_words(lists["framing"])), *subject,
        digest("result flags", interpretation.source, flags.source))


def _flag_vocabulary(interpretation: RuleFile, flags: RuleFile) -> tuple[dict[str, str], dict[str, str]]:
    """(codes, words) -> class: HL7 codes and meanings from interpretation.toml, flags from result_flags.toml."""
    meaning = interpretation.table["words"]
    coded = interpretation.table["flags"]
    codes: dict[str, str] = {}
    for kind, listed in ((NORMAL, _strings(flags, "[flags] normal_codes", flags.table["flags"]["normal_codes"])),
                         (ABNORMAL, coded["abnormal"]), (CRITICAL, coded["critical"])):
        for code in listed:
            if kind == NORMAL and code not in meaning:
                raise ConfigError(f"{flags.path}: [flags] normal_codes: {code!r} is not a code of "
                                  f"{interpretation.path}")
            codes[code] = kind
    words = {meaning[code]: kind for code, kind in codes.items() if code in meaning}
    for kind in (NORMAL, ABNORMAL, CRITICAL):
        words |= {w: kind for w in _strings(flags, f"[flags] {kind}", flags.table["flags"][kind])}
    return codes, words


def _strings(file: RuleFile, where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(f"{file.path}: {where}: must be a list of non-empty strings, got {value!r}")
    return value


def _exact(codes: Iterable[str]) -> str:
    """Codes as written (case counts: "L" is low, "l" is not a flag), never inside a word or before a digit."""
    ordered = sorted(set(codes), key=len, reverse=True)
    return "|".join(rf"(?<![A-Za-z0-9]){re.escape(c)}(?![A-Za-z0-9])" if c[-1].isalnum() else
                    rf"{re.escape(c)}(?!\s*\d)" for c in ordered)


def _words(words: Iterable[str]) -> str:
    """English case-insensitively at word boundaries; Chinese and symbols anywhere, a single Chinese character
    only where it does not run on into another; longest first."""
    ordered = sorted(set(words), key=len, reverse=True)
    latin = "|".join(_spaced(w) for w in ordered if w.isascii() and w[0].isalnum())
    other = [re.escape(w) + ("(?![\u3400-\u9fff])" if len(w) == 1 and "\u3400" <= w <= "\u9fff" else "")
             for w in ordered if not (w.isascii() and w[0].isalnum())]
    return "|".join(([rf"(?<![\w-])(?i:{latin})(?![\w-])"] if latin else []) + other) or "(?!)"


def _spaced(word: str) -> str:
    return re.escape(word).replace(r"\ ", r"\s+")


# ------------------------------------------------------------------------------------------------ per result
def flagged_results(text: str) -> list[FlaggedResult]:
    """Every laboratory result of `text`, in order, with its flag and the reason for it."""
    return [reading.result for reading in _readings(text)]


def result_readings(text: str) -> list[ResultReading]:
    """`flagged_results` with the extent of each result's flags and range (for the compressed panel)."""
    return list(_readings(text))


@lru_cache(maxsize=8192)
def _readings(text: str) -> tuple[ResultReading, ...]:
    mentions = load_vocabulary().mentions(text)
    if not mentions:
        return ()
    grammar, analytes = flag_grammar(), load_vocabulary().analytes
    stops = [m.start for m in mentions[1:]] + [len(text)]
    return tuple(_read(text, mention, stop, grammar, analytes[mention.analyte].reference)
                 for mention, stop in zip(mentions, stops, strict=True))


def _read(text: str, mention: ResultMention, stop: int, grammar: FlagGrammar,
          reference: tuple[float, float] | None) -> ResultReading:
    """The written flags and ranges beside the mention (up to the next result), then the judgement."""
    flags, ranges, end = _beside(text, mention, stop, grammar)
    inner = grammar.bracketed_flag.search(text, mention.start, mention.end)
    if inner:
        flags.insert(0, inner.group().strip("()（）[]【】 "))
    classes = [grammar.flag_class.get(f) or grammar.flag_class.get(_key(f), "") for f in flags]
    comparator = _comparator(text[mention.start:mention.end])
    if mention.critical:
        side = HIGH if mention.critical.endswith("high)") else LOW
        return ResultReading(FlaggedResult(mention, CRITICAL, mention.critical), end, side, bool(flags))
    if CRITICAL in classes:
        written = flags[classes.index(CRITICAL)]
        return ResultReading(FlaggedResult(mention, CRITICAL, f"flagged {written}"), end, "", True)
    placed = [(_place(mention.value, comparator, low, high), shown) for low, high, shown in ranges]
    outside = [(side, shown) for side, shown in placed if side in (HIGH, LOW)]
    if ABNORMAL in classes:
        side = outside[0][0] if outside else ""
        return ResultReading(FlaggedResult(mention, ABNORMAL, f"flagged {flags[classes.index(ABNORMAL)]}"), end,
                             side, True)
    if outside:
        side, shown = outside[0]
        return ResultReading(FlaggedResult(mention, ABNORMAL, f"{_WHERE[side]} its reference range {shown}"), end,
                             side, bool(flags))
    if NORMAL in classes:
        return ResultReading(FlaggedResult(mention, NORMAL, f"flagged {flags[classes.index(NORMAL)]}"), end, "",
                             True)
    if any(side == "inside" for side, _ in placed):
        shown = next(shown for side, shown in placed if side == "inside")
        return ResultReading(FlaggedResult(mention, NORMAL, f"within its reference range {shown}"), end, "", False)
    return ResultReading(_by_interval(mention, comparator, reference), end, _side(mention, comparator, reference),
                         False)


def _beside(text: str, mention: ResultMention, stop: int, grammar: FlagGrammar
            ) -> tuple[list[str], list[tuple[float | None, float | None, str]], int]:
    """The flags and reference ranges written right after the value, in any order ("(0.6-1.2) H", "H*",
    "↑ 参考值 3.5-5.5"), and where they end."""
    flags: list[str] = []
    ranges: list[tuple[float | None, float | None, str]] = []
    at = end = mention.end
    for _ in range(4):
        at = _SEPARATOR.match(text, at, stop).end()  # type: ignore[union-attr]
        found = grammar.range.match(text, at, stop)
        if found and (bounds := _bounds(found)) is not None:
            ranges.append(bounds)
        elif (found := grammar.flag.match(text, at, stop)) is not None and found["opening"]:
            remark = _REMARK_END.search(text, found.end(), stop)  # the remark belongs to the result: to its bracket
            if remark is not None and remark.group() in ")）]】":
                flags.append(found["opening"].strip())
                end = remark.end()
            break
        elif found is not None and found.group():
            flags.append((found["inside"] or found["bare"]).strip())
        else:
            break
        at = end = found.end()
    return flags, ranges, end


def _bounds(found: re.Match[str]) -> tuple[float | None, float | None, str] | None:
    """(low, high, as shown) of a matched range; None for a range whose bounds are not numbers or not in order."""
    for n in range(3):
        low, high, upper, lower = (found[f"{key}{n}"] for key in ("low", "high", "upper", "lower"))
        if low is not None and high is not None:
            lo, hi = _number(low), _number(high)
            return (lo, hi, f"{low}-{high}") if lo is not None and hi is not None and lo < hi else None
        if upper is not None:
            return (None, _number(upper), f"<{upper}")
        if lower is not None:
            return (_number(lower), None, f">{lower}")
    return None


_WHERE = {HIGH: "above", LOW: "below"}


def _comparator(span: str) -> str:
    """'<' or '>' when the value is written as a bound ("troponin <14", "eGFR >90"), else ''."""
    found = _COMPARATOR.search(span)
    return "" if found is None else ("<" if found[1] in "<≤≦" else ">")


def _place(value: float, comparator: str, low: float | None, high: float | None) -> str:
    """HIGH, LOW, "inside" or "" (a bound that straddles the range): a value "<5" lies anywhere in [0, 5]."""
    least, most = (0.0, value) if comparator == "<" else (value, float("inf")) if comparator == ">" else (value, value)
    if high is not None and (least > high or (comparator == ">" and least >= high)):
        return HIGH
    if low is not None and (most < low or (comparator == "<" and most <= low)):
        return LOW
    if (low is None or least >= low) and (high is None or most <= high):
        return "inside"
    return ""


def _by_interval(mention: ResultMention, comparator: str, reference: tuple[float, float] | None) -> FlaggedResult:
    if reference is None:
        return FlaggedResult(mention, "", f"no reference range or flag written, and {mention.analyte} has no "
                                          "adult reference interval")
    if mention.canonical_value is None:
        return FlaggedResult(mention, "", "no reference range or flag written, and the unit is unknown")
    unit = load_vocabulary().analytes[mention.analyte].unit
    shown = f"{reference[0]:g}-{reference[1]:g}" + (f" {unit}" if unit else "")
    side = _place(mention.canonical_value, comparator, *reference)
    if side in (HIGH, LOW):
        return FlaggedResult(mention, ABNORMAL, f"{_WHERE[side]} the adult reference interval {shown}")
    if side == "inside":
        return FlaggedResult(mention, NORMAL, f"within the adult reference interval {shown}")
    return FlaggedResult(mention, "", f"a bound that straddles the adult reference interval {shown}")


def _side(mention: ResultMention, comparator: str, reference: tuple[float, float] | None) -> str:
    if reference is None or mention.canonical_value is None:
        return ""
    side = _place(mention.canonical_value, comparator, *reference)
    return side if side in (HIGH, LOW) else ""


_THOUSANDS = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def _number(text: str) -> float | None:
    """'3.5', '3,5' (decimal comma), '150,000'; None for '1.2.3'."""
    if "," in text:
        text = text.replace(",", "") if _THOUSANDS.fullmatch(text) else text.replace(",", ".", 1)
    try:
        return float(text)
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------ per text
@lru_cache(maxsize=65536)
def result_flag(text: str) -> str:
    """The text's summary flag: CRITICAL, ABNORMAL, NORMAL, or "" (no results, or not every clause normal)."""
    readings = _readings(text)
    flags = {r.result.flag for r in readings}
    if CRITICAL in flags or ABNORMAL in flags:
        return CRITICAL if CRITICAL in flags else ABNORMAL
    grammar = flag_grammar()
    statements = [m for m in grammar.statement.finditer(text)
                  if not any(r.result.mention.start <= m.start() < r.end for r in readings)]
    if not readings and not statements:
        return ""
    clauses = _clauses(text)
    judged = [i for i, m in enumerate(statements) if grammar.statement_class[_key(m.group())] != "normal"]
    names = load_vocabulary().names(text) if judged else []
    negated = _negated(text, statements, judged, readings, names)
    about = [start for start, _ in names] + [r.result.mention.start for r in readings]
    for i in judged:
        if i not in negated and (grammar.statement_class[_key(statements[i].group())] == "abnormal"
                                 or _same_clause(clauses, statements[i].start(), about)):
            return ABNORMAL
    if "" in flags:
        return ""  # a result read but not judged: its text is not known to be normal
    return _all_normal(text, clauses, readings, statements, negated, grammar)


def _clauses(text: str) -> list[tuple[int, int]]:
    """Clauses end at punctuation (not a decimal point or a thousands comma) and where the negation grammar
    starts a new statement ("but", "however", 但)."""
    cuts = sorted({0, len(text), *(m.end() for m in _CLAUSE_END.finditer(text)),
                   *(m.start() for m in negation().grammar.breaks.finditer(text))})
    return [(a, b) for a, b in pairwise(cuts) if text[a:b].strip()]


def _same_clause(clauses: list[tuple[int, int]], at: int, others: list[int]) -> bool:
    """A direction word ("low", 下降) judges a result only in a clause that names an analyte."""
    start, end = next(((a, b) for a, b in clauses if a <= at < b), (at, at + 1))
    return any(start <= other < end for other in others)


def _negated(text: str, statements: list[re.Match[str]], judged: list[int], readings: tuple[ResultReading, ...],
             names: list[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """Statement index -> the span from its negation cue to it, for each judgement of abnormality the shared
    negation grammar takes back ("no abnormality", "未见异常", "abnormality excluded"). Analyte names and results
    are masked first: 无 in 无机磷 (inorganic phosphate) negates nothing."""
    if not judged:
        return {}
    masked = list(text)
    for start, end in [*names, *((r.result.mention.start, r.end) for r in readings)]:
        masked[start:end] = "_" * (end - start)
    plain, cues, spans = "".join(masked), negation(), {}
    ends = [m.start() for m in _SENTENCE_END.finditer(plain)] + [len(plain)]
    by_sentence: dict[int, list[int]] = {}
    for i in judged:  # a negation never reaches past its sentence: read each sentence alone (long notes)
        by_sentence.setdefault(bisect_right(ends, statements[i].start() - 1), []).append(i)
    for n, members in by_sentence.items():
        offset = ends[n - 1] + 1 if n else 0
        sentence = plain[offset:ends[n]]
        taken = cues.taken_back(sentence, [(statements[i].start() - offset, statements[i].end() - offset)
                                           for i in members])
        for i, words in zip(members, taken, strict=True):
            if words:
                spans[i] = _cue_span(sentence, offset, statements[i].span(), cues.cue)
    return spans


def _cue_span(sentence: str, offset: int, statement: tuple[int, int], cue: re.Pattern[str]) -> tuple[int, int]:
    """From the nearest cue before the statement to its end (or from it to a cue after: "abnormality excluded")."""
    start, end = statement[0] - offset, statement[1] - offset
    before = list(cue.finditer(sentence, 0, start))
    after = cue.search(sentence, end)
    span = (before[-1].start(), end) if before else (start, after.end() if after else end)
    return span[0] + offset, span[1] + offset


def _key(word: str) -> str:
    return re.sub(r"\s+", " ", word.lower()) if word.isascii() else word


def _all_normal(text: str, clauses: list[tuple[int, int]], readings: tuple[ResultReading, ...],
                statements: list[re.Match[str]], negated: dict[int, tuple[int, int]], grammar: FlagGrammar) -> str:
    """NORMAL when every clause reports normal results or normality, or says nothing (a heading, a date); the
    first clause that says something else makes the text ""."""
    items = sorted([(r.result.mention.start, r.end) for r in readings]
                   + [negated[i] if i in negated else m.span() for i, m in enumerate(statements)
                      if i in negated or grammar.statement_class[_key(m.group())] == "normal"])
    blank = _DATE.sub(_spaces, text)
    blank = grammar.framing.sub(_spaces, blank)
    said = False
    for start, end in clauses:
        inside = [(max(a, start), min(b, end)) for a, b in items if a < end and start < b]
        verdict = _clause(blank, start, end, inside, grammar)
        if not verdict:
            return ""
        said = said or verdict == NORMAL
    return NORMAL if said else ""


def _spaces(found: re.Match[str]) -> str:
    return " " * len(found.group())


def _clause(blank: str, start: int, end: int, items: list[tuple[int, int]], grammar: FlagGrammar) -> str:
    """NORMAL when what the clause says beside its results and statements is a short subject before them (and
    framing, blanked already); "neutral" when it says nothing; "" otherwise."""
    kept = list(blank[start:end])
    for a, b in items:
        kept[a - start:b - start] = " " * (b - a)
    rest = "".join(kept)
    if not items:
        return "neutral" if not _CONTENT.search(rest) else ""
    first = items[0][0] - start
    if _CONTENT.search(rest, first):
        return ""
    subject = _CONTENT.findall(rest, 0, first)
    chinese = sum(1 for t in subject if "\u3400" <= t[0] <= "\u9fff")
    return NORMAL if len(subject) - chinese <= grammar.subject_words and chinese <= grammar.subject_characters \
        else ""


def flags_fingerprint() -> str:
    """What a stored result of these judgements (a compressed panel) depends on, beside the result vocabulary."""
    return flag_grammar().fingerprint
