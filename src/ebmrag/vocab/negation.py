"""Negation cues (rules/negation.toml), compiled once for every reader of negation, and the grammar with which
an allergy label is read as denied, excluded or taken back.

The entity compressor, the ADR recogniser, the CDS allergy statements and the differential's finding mapper
each kept a list of their own, and the lists had drifted apart ("denies" here, "never" there, "排除" in one of
three); one file, read here, gives them the same cues. How far a cue reaches (to the end of a sentence, 45
characters back from a reaction, a whole clause) stays each reader's decision, with two exceptions every reader
shares: a pseudo-negation ("not confirmed", "不除外", "不耐受") is no cue at all, and an allergy is read with its
scope (`Negation.taken_back`), because a cue matched anywhere took "阿莫西林过敏（未确认）" back as if it said
"not allergic": an unconfirmed allergy is still an allergy.

The allergy reading follows how clinicians write (Chinese and English alike): a negator governs what follows it
in its clause (否认…过敏史, 无…过敏史, "no known drug allergies"; "无发热，青霉素过敏" keeps the allergy, a comma
ending the clause), a post-negation the words just before it (过敏史已排除, "allergy ruled out"), an answer the
heading it follows ("过敏史：无", "Allergies: none"); a de-labelling ("de-labelled", 证实为非过敏, a negative drug
challenge, a skin test followed by a course tolerated) takes back the allergy of its clause, or the one named last
before it ("既往自述头孢过敏，…证实非真性过敏"); "removed" or "wrong" only an allergy just before it or with the record
named ("过敏史已撤销", "removed from her allergy list", never "latex allergy, so the gloves were removed"); and doubt
or a plan (未确认, 待查, "possible", "referred for de-labelling") takes nothing back. A drug tolerated speaks of an
allergy only in the allergy's own entry: in free text it may be another drug ("allergic to penicillin, tolerates
cephalexin"). The file is declared with the rules loader (ebmrag.rules), so `RuleBook.check()` compiles it at
start-up and a test passes a book of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ebmrag.rules import RuleFile, rule_file
from ebmrag.vocab._files import language_list, versioned

NEGATION = "negation.toml"  # in the rules folder
_GRAMMAR = ("pseudo", "uncertain", "delabel", "removed", "record", "challenge", "skin_test", "negative", "tolerated",
            "allergy", "label", "breaks")
_LISTS = {"english": ("before", "after", "patient", "predicate", *_GRAMMAR),
          "chinese": ("before", "after", "predicate", *_GRAMMAR)}
_SENTENCE_END = re.compile(r"(?<!\d)\.(?!\d)|[!?。！？;；\n]")
_CLAUSE_END = re.compile(r"(?<!\d),|,(?!\d)|，")
_HEAD_END = re.compile(r"[,，;；:：(（–—]|\s-|(?<!\d)\.(?!\d)")  # an entry's head: the substance it names
_LIST_JOIN = re.compile(r"\s*(and|or|nor)\b", re.IGNORECASE)
# what may stand between an allergy and "removed" for the removal to be of it: "allergy label has now been removed"
_AUXILIARY = re.compile(r"(\s*(was|were|is|are|has|have|had|been|being|now|since|then|later|subsequently|already|"
                        r"已经|已|予以|予|被|均|现|史))*\s*", re.IGNORECASE)
_BARE_ANSWER = re.compile(r"[\s.]*(known|reported|documented|by history|史)?[\s.]*[)）]", re.IGNORECASE)
_ANSWER_GAP = 20  # characters between an allergy heading and its colon or bracket ("Allergies to medications:")
_LIST_ITEM_WORDS = 4  # "No drug, food, or latex allergies": a comma list's items are short
Span = tuple[int, int]


@dataclass(frozen=True)
class _Grammar:
    """The compiled lists the allergy reading uses beside the cues (each guarded against the pseudo-negations)."""

    before: re.Pattern[str]
    after: re.Pattern[str]
    uncertain: re.Pattern[str]
    delabel: re.Pattern[str]
    removed: re.Pattern[str]
    record: re.Pattern[str]
    challenge: re.Pattern[str]
    skin_test: re.Pattern[str]
    negative: re.Pattern[str]
    tolerated: re.Pattern[str]
    allergy: re.Pattern[str]
    label: re.Pattern[str]
    breaks: re.Pattern[str]
    predicate: re.Pattern[str]


@dataclass(frozen=True)
class Negation:
    """`cue`: any cue of the file (English as whole words, Chinese anywhere; never inside a pseudo-negation);
    `patient`: the first-person cues alone ("I don't", "nope"); `leading`: a cue (before or patient) that opens a
    text or clause, for `match`. `source` is the file's text, for the fingerprints of results computed with it."""

    cue: re.Pattern[str]
    patient: re.Pattern[str]
    leading: re.Pattern[str]
    source: str
    grammar: _Grammar

    def allergy_taken_back(self, text: str, entry: bool = False, also: Sequence[Span] = ()) -> str:
        """The words that take back every allergy the text names ('' when one stands, or when it names none).
        `entry`: the text is an allergy entry's own words ("Penicillin: tolerated amoxicillin course 2023"), whose
        head names the allergy without saying so, and where a drug tolerated speaks of that allergy. `also`: more
        spans that must be taken back too (the ADR recogniser's reactions: "anaphylaxis to peanuts")."""
        found = self.taken_back(text, [*self.allergy_mentions(text, entry), *also], entry)
        return "" if not found or not all(found) else found[0]

    def allergy_mentions(self, text: str, entry: bool = False) -> list[Span]:
        """Where the text names an allergy ("allergic", "过敏", "intolerance") or its label; in an entry that names
        none, the last character of its head ("Penicillin" in "Penicillin: tolerated amoxicillin course 2023")."""
        mentions = sorted(m.span() for key in ("allergy", "label") for m in getattr(self.grammar, key).finditer(text))
        if not mentions and entry:
            head = _HEAD_END.search(text)
            end = len((text[:head.start()] if head else text).rstrip())
            mentions = [(end - 1, end)] if end else []
        return mentions

    def taken_back(self, text: str, mentions: Sequence[Span], entry: bool = False,
                   preceding: bool = True) -> list[str]:
        """Per mention (a span of the text), the words that deny, exclude or take back what it names, or ''.
        `preceding`: also the negators before a mention (the ADR recogniser reads those in a window of its own,
        tuned on its corpora, and asks here for the rest: "过敏史已排除", "过敏史：无", a de-labelling)."""
        reading = _Reading(text, self.grammar)
        said = self.delabelled(text, mentions, entry, reading)
        return [said[i] or reading.negated(span, preceding) for i, span in enumerate(mentions)]

    def delabelled(self, text: str, mentions: Sequence[Span], entry: bool = False,
                   reading: _Reading | None = None) -> list[str]:
        """Per mention, the de-labelling that takes it back ('' when none): a label removed or refuted, a drug
        challenge passed, a skin test followed by the drug tolerated (with `entry`, the drug tolerated alone)."""
        reading = reading or _Reading(text, self.grammar)
        out = [""] * len(mentions)
        for anchor, words in reading.delabellings():
            for i in reading.targets(anchor, mentions, reading.inside(anchor, mentions)):
                out[i] = out[i] or words
        for cue in reading.found("removed"):
            for i in reading.removed(cue, mentions, entry):
                out[i] = out[i] or cue.group()
        for cue in reading.found("tolerated") if entry else ():
            for i in reading.inside(cue.span(), mentions) if not reading.doubted(cue.span()) else ():
                out[i] = out[i] or cue.group()
        return out


class _Reading:
    """One text cut into sentences and clauses, with the grammar's matches; answers which words govern a span."""

    def __init__(self, text: str, grammar: _Grammar) -> None:
        self.text, self.grammar = text, grammar
        ends = sorted({m.start() for m in _SENTENCE_END.finditer(text)} | {m.start() for m in
                                                                              grammar.breaks.finditer(text)})
        self.sentence_ends = [*ends, len(text)]
        self.clause_ends = sorted({*self.sentence_ends, *(m.start() for m in _CLAUSE_END.finditer(text))})
        self.uncertain = [m.span() for m in grammar.uncertain.finditer(text)]
        self._found: dict[str, list[re.Match[str]]] = {}

    def found(self, key: str, start: int = 0, end: int | None = None) -> list[re.Match[str]]:
        """The grammar's `key` matches starting in [start, end): matched on the whole text once, so that a
        pseudo-negation running past a clause still masks its cue."""
        if key not in self._found:
            self._found[key] = list(getattr(self.grammar, key).finditer(self.text))
        stop = len(self.text) + 1 if end is None else end
        return [m for m in self._found[key] if start <= m.start() < stop]

    # ------------------------------------------------------------------ places
    def sentence(self, at: int) -> Span:
        end = next(e for e in self.sentence_ends if e >= at)
        return max((e + 1 for e in self.sentence_ends if e < at), default=0), end

    def clause(self, at: int) -> Span:
        end = next(e for e in self.clause_ends if e >= at)
        return max((e + 1 for e in self.clause_ends if e < at), default=0), end

    def doubted(self, cue: Span) -> bool:
        """Doubt or a plan before the cue in its clause, or around it ("possible", "referred for", "未确认")."""
        start, _ = self.clause(cue[0])
        return any(start <= u0 < cue[0] or (u0 < cue[1] and cue[0] < u1) for u0, u1 in self.uncertain)

    # ------------------------------------------------------------------ negators
    def negated(self, mention: Span, preceding: bool = True) -> str:
        """A negator before the mention in its clause, a post-negation just after it, or an answer to it."""
        text = self.text
        for cue in self.found("before", 0, mention[1]) if preceding else ():
            if cue.start() <= mention[0] < self.reach(cue) and not self.doubted(cue.span()):
                return cue.group()
        for cue in self.found("after", mention[1], self.clause(mention[0])[1]):
            gap = text[mention[1]:cue.start()]
            if _short(gap) and not self.doubted(cue.span()):
                return cue.group()
        return self.answered(mention)

    def reach(self, cue: re.Match[str]) -> int:
        """Where a negator's scope ends: its clause, carried over an English comma list ("no drug, food, or latex
        allergies"), and within the brackets it stands in ("penicillin (no rash)")."""
        start, sentence_end = self.sentence(cue.start())
        end = self.clause(cue.end())[1]
        if cue.group().isascii():
            end = self.listed(end, sentence_end)
        # "无明显诱因出现皮疹", "not tolerated due to allergy": a new predicate or a cause ends it, unless the cue
        # negates that predicate itself ("未出现", "no reported")
        governed = cue.end() + len(self.text[cue.end():end]) - len(self.text[cue.end():end].lstrip())
        end = min([end, *(m.start() for m in self.found("predicate", governed + 1, end))])
        opened = max(self.text.rfind("(", start, cue.start()), self.text.rfind("（", start, cue.start()))
        closed = max(self.text.rfind(")", start, cue.start()), self.text.rfind("）", start, cue.start()))
        if opened > closed:
            shut = [i for i in (self.text.find(")", cue.end()), self.text.find("）", cue.end())) if i >= 0]
            end = min([end, *shut])
        return end

    def listed(self, end: int, sentence_end: int) -> int:
        """The end of a comma list that starts at `end`: short items up to one that opens with and/or/nor."""
        at = end
        while at < sentence_end:
            following = self.clause(at + 1)[1]
            item = self.text[at + 1:following]
            if _LIST_JOIN.match(item) and len(item.split()) <= _LIST_ITEM_WORDS + 1:
                return following
            if len(item.split()) > _LIST_ITEM_WORDS:
                break
            at = following
        return end

    def answered(self, mention: Span) -> str:
        """'Allergies: none', '过敏史：无', '青霉素（否认）': a negator opening the answer to a heading."""
        text = self.text
        window = text[mention[1]:mention[1] + _ANSWER_GAP + 1]
        mark = re.search(r"[:：(（]", window)
        if mark is None or _SENTENCE_END.search(window[:mark.start()]) or _CLAUSE_END.search(window[:mark.start()]):
            return ""
        at = mention[1] + mark.end()
        at += len(text[at:]) - len(text[at:].lstrip())
        cue = self.grammar.before.match(text, at)
        if cue is None or self.doubted(cue.span()):
            return ""
        if mark.group() in "(（" and not _BARE_ANSWER.match(text, cue.end()):
            return ""  # "penicillin allergy (no rash)" says something of the reaction, not of the allergy
        return cue.group()

    # ------------------------------------------------------------------ de-labelling
    def delabellings(self) -> Iterator[tuple[Span, str]]:
        """(anchor, words) for each de-labelling the text states (a label refuted, a drug challenge with a
        negative outcome in its clause, a skin test with the drug tolerated in its sentence), doubt and plans
        left out."""
        for cue in self.found("delabel"):
            if not self.doubted(cue.span()):
                yield cue.span(), cue.group()
        for test in self.found("challenge"):
            clause = self.clause(test.start())
            for outcome in (*self.found("negative", *clause), *self.found("tolerated", *clause)):
                if not self.doubted(test.span()) and not self.doubted(outcome.span()):
                    yield _later(test, outcome), f"{test.group()} {outcome.group()}"
        for test in self.found("skin_test"):
            for outcome in self.found("tolerated", *self.sentence(test.start())):
                if not self.doubted(test.span()) and not self.doubted(outcome.span()):
                    yield _later(test, outcome), f"{test.group()} {outcome.group()}"

    def inside(self, anchor: Span, mentions: Sequence[Span]) -> list[int]:
        clause = self.clause(anchor[0])
        return [i for i, (start, _) in enumerate(mentions) if clause[0] <= start <= clause[1]]

    def targets(self, anchor: Span, mentions: Sequence[Span], chosen: list[int]) -> list[int]:
        """The chosen mentions of the cue's clause, and, when none of them names the allergy before the cue (only
        its label, "the label was removed", or what the cue says of it, "证实非真性过敏"), the allergy named last
        before the clause in its sentence ("既往自述头孢过敏，…证实非真性过敏"; "penicillin allergy, de-labelled")."""
        labels = {m.span() for m in self.found("label")}
        if any(mentions[i][0] < anchor[0] and mentions[i] not in labels for i in chosen):
            return chosen
        sentence, clause = self.sentence(anchor[0]), self.clause(anchor[0])
        before = [i for i, (start, _) in enumerate(mentions) if sentence[0] <= start < clause[0]]
        return chosen + before[-1:]

    def removed(self, cue: re.Match[str], mentions: Sequence[Span], entry: bool) -> list[int]:
        """What "removed" or "wrong" takes back: the allergy or label just before it ("allergy label has been
        removed", "过敏史已撤销"), or every one of its clause when the clause names the record or the label; never
        a reaction ("recurrent disease was removed" is surgery), unless the text is the allergy's own entry."""
        if self.doubted(cue.span()):
            return []
        named = [m.span() for key in ("allergy", "label") for m in self.found(key)]
        inside = [i for i in self.inside(cue.span(), mentions)
                  if entry or any(a < mentions[i][1] and mentions[i][0] < b for a, b in named)]
        clause = self.clause(cue.start())
        if self.found("record", *clause) or self.found("label", *clause):
            chosen = inside
        else:
            chosen = [i for i in inside if mentions[i][1] <= cue.start()
                      and _AUXILIARY.fullmatch(self.text, mentions[i][1], cue.start())]
        return self.targets(cue.span(), mentions, chosen) if chosen else []


def _later(first: re.Match[str], second: re.Match[str]) -> Span:
    return max(first.span(), second.span())


def _short(gap: str) -> bool:
    """A post-negation reaches the words just before it: three English words, or six Chinese characters."""
    return len(re.findall(r"[A-Za-z]+", gap)) <= 3 and len(re.findall(r"[\u4e00-\u9fff]", gap)) <= 6 \
        and not _CLAUSE_END.search(gap)


@rule_file(NEGATION, as_files=True)
def negation(file: RuleFile) -> Negation:
    """The cues of rules/negation.toml, compiled once per book (default: the bundled one)."""
    raw = versioned(file, "negation cues")
    where = f"negation cues {file.path}"
    lists = {(language, key): language_list(raw, language, key, where) for language, keys in _LISTS.items()
             for key in keys}
    pseudo = [*lists["english", "pseudo"], *lists["chinese", "pseudo"]]

    def both(key: str) -> re.Pattern[str]:
        return _pattern([*lists["english", key], *lists["chinese", key]], pseudo)

    every = [cue for (_, key), cues in lists.items() if key in ("before", "after", "patient") for cue in cues]
    opening = [*lists["english", "before"], *lists["english", "patient"], *lists["chinese", "before"]]
    grammar = _Grammar(**{key: both(key) for key in ("before", "after", "predicate", *_GRAMMAR) if key != "pseudo"})
    return Negation(_pattern(every, pseudo), _pattern(lists["english", "patient"], pseudo), re.compile(
        rf"\s*(?:{_pattern(opening, pseudo).pattern})", re.IGNORECASE), file.source, grammar)


def _pattern(cues: list[str], pseudo: Sequence[str] = ()) -> re.Pattern[str]:
    """English cues as whole words (not inside a hyphenated word: "no-reflow"), Chinese ones anywhere; the
    longest first, so that "no evidence of" wins over "no"; none where it is part of a pseudo-negation."""
    ordered = sorted(set(cues), key=len, reverse=True)
    english = "|".join(_guarded(c, pseudo) for c in ordered if c.isascii())
    chinese = "|".join(_guarded(c, pseudo) for c in ordered if not c.isascii())
    parts = ([rf"(?<![\w-])(?:{english})(?![\w-])"] if english else []) + ([f"(?:{chinese})"] if chinese else [])
    return re.compile("|".join(parts), re.IGNORECASE)


def _guarded(cue: str, pseudo: Sequence[str]) -> str:
    """The cue's pattern, failing where the text around it spells a pseudo-negation that holds it: for "not" in
    "not confirmed", a lookahead that the text does not read "not confirmed" there (with what precedes the cue in
    the phrase checked behind it: "did " before "not tolerate")."""
    guards = []
    for phrase in pseudo:
        for at in _occurrences(cue, phrase):
            before, rest = phrase[:at], phrase[at:]
            behind = f"(?<={re.escape(before)})" if before else ""
            guards.append(f"(?!{behind}{_words(rest)})")
    return "".join(guards) + _words(cue)


def _occurrences(cue: str, phrase: str) -> list[int]:
    """Where the cue stands in the phrase: as a whole word in English, anywhere in Chinese."""
    if cue.isascii() != phrase.isascii():
        return []
    if not cue.isascii():
        return [m.start() for m in re.finditer(re.escape(cue), phrase)]
    return [m.start() for m in re.finditer(rf"(?<![\w-]){re.escape(cue)}(?![\w-])", phrase, re.IGNORECASE)]


def _words(text: str) -> str:
    return re.escape(text).replace(r"\ ", r"\s+")
