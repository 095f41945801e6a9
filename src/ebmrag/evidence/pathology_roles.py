"""The roles of a pathology finding as written: specimen, diagnosis, grade, stage, margins, biomarker status.

The fields follow the College of American Pathologists' cancer protocols and the Chinese report's 病理诊断, 分化,
分期, 切缘 and 免疫组化 (rules/evidence/facts.toml says where each grammar comes from). The diagnosis is what the
report concludes ("consistent with X", "符合X") or what a report's field or an examination's verb states
("Findings: X", "biopsy shows X", "病理示X"), a phrase headed by a morphology term first; else the first noun
phrase headed by one ("invasive ductal carcinoma", "中分化腺癌"), with the negation that governs it ("no evidence
of malignancy", "未见癌"). A finding under a plan or a condition ("if pathology confirms", "pending") is none.
Every role is a span of the text, so the fact line (evidence.facts) repeats the report's own words.
"""

from __future__ import annotations

import re

from ebmrag.evidence.fact_grammar import CJK, Span, clause_end, grammar, overlap, sentence
from ebmrag.vocab.negation import negation

Found = tuple[int, Span, Span | None]  # (0 a conclusion | 1 a field or verb, the phrase, a bracketed site)
_LEAD_IN = re.compile(  # between a trigger and its finding: marks, a numbering, a report number, a bracketed site
    r"[\s\"“”'‘’:：,，、]+|\.(?=[(（])|\d{1,2}[、.](?!\d)\s*"
    r"|[(（](?:(?P<site>[\u4e00-\u9fff][^()（）]{0,15}?)|[\w.\-/ ]{1,24})[)）]")
_CHINESE_END = re.compile(r"[，。；、,;:：\s\"“”\\]")
_CHINESE_BREAK = re.compile(r"[，。；、,;:：\s\"“”\\()（）+]|\d")  # what a Chinese phrase does not run back over
_BRACKET = re.compile(r"[(（][^()（）]{1,12}[)）]")
_OPENING = re.compile(r"\s*([A-Za-z][A-Za-z ,'-]{2,40}?)\s*:\s*")  # "Cervical Lymph Node: Findings: ..."


def pathology_roles(text: str) -> list[tuple[str, Span]]:
    """(role, span) of the pathology finding the text states: specimen, diagnosis, then grade, stage, margins and
    biomarker status in the text's order; [] when no diagnosis can be read."""
    found = _diagnosis(text)
    if found is None:
        return []
    diagnosis, site = found
    roles = [("specimen", s) for s in ([site] if site else _specimen(text, diagnosis))]
    roles.append(("diagnosis", diagnosis))
    taken = [diagnosis]
    for role, pattern in grammar().roles:
        for match in pattern.finditer(text):
            span = (match.start(), match.start() + len(match.group().rstrip()))
            if _nested(span, diagnosis) or not any(overlap(span, t) and not _nested(t, span) for t in taken):
                roles.append((role, span))
                taken.append(span)
    return roles


def _nested(a: Span, b: Span) -> bool:
    """One span holds the other: a grade inside its diagnosis, a margin around "未见癌"."""
    return (b[0] <= a[0] and a[1] <= b[1]) or (a[0] <= b[0] and b[1] <= a[1])


def _diagnosis(text: str) -> tuple[Span, Span | None] | None:
    g = grammar()
    stated: list[Found] = []
    for rank, pattern, examined in ((0, g.conclusion, False), (1, g.fields, False), (1, g.verbs, True)):
        for match in pattern.finditer(text):
            if examined and g.examinations.search(text, sentence(text, match.start())[0], match.start()) is None:
                continue  # "ultrasound reveals ..." is not a pathology finding; "biopsy reveals ..." is
            read = _phrase(text, match.end())
            if read and not g.not_yet.search(text, sentence(text, match.start())[0], read[0][1]):
                stated.append((rank, *read))
    headed = [s for s in stated if _headed(text, s[1])]
    choice = (_last([s for s in headed if s[0] == 0]) or _last(headed) or _last([s for s in stated if s[0] == 0])
              or _last(stated) or _morphology(text))
    if choice is None or choice[1] is not None:
        return choice
    # "病理结果：（胃窦部）…，符合中分化腺癌": the site a field read before the conclusion
    sites = [site for _, _, site in stated if site is not None and site[1] <= choice[0][0]]
    return choice[0], (max(sites) if sites else None)


def _last(found: list[Found]) -> tuple[Span, Span | None] | None:
    if not found:
        return None
    _, span, site = max(found, key=lambda f: f[1][0])
    return span, site


def _phrase(text: str, start: int) -> tuple[Span, Span | None] | None:
    """What follows a trigger, past its marks, numbering and bracketed site, to the end of its sentence (of its
    clause when that is too long, and always in Chinese, whose clauses are written with commas); a negated phrase
    with no morphology in it ("Not performed") is no finding."""
    g, site = grammar(), None
    while (lead := _LEAD_IN.match(text, start)) and lead.end() > start:
        site = lead.span("site") if lead.group("site") else site
        start = lead.end()
    words = re.match(r"(?:(?:a|an|the|that)\s+)+", text[start:], re.IGNORECASE)
    start += words.end() if words else 0
    if CJK.search(text, *sentence(text, start)):
        end = clause_end(text, start)
        end = _chinese_cut(text, start, end) if _headed(text, (start, end)) else end
        if len(CJK.findall(text, start, end)) > g.max_chinese:
            return None
    else:
        end = _english_end(text, start)
        if len(text[start:end].split()) > g.max_words:
            end = clause_end(text, start)
        if len(text[start:end].split()) > g.max_words:
            return None
    end = start + len(_balanced(text[start:end].rstrip(" \t\"”'’")))
    if end <= start or (negation().cue.match(text, start) and not _headed(text, (start, end))):
        return None
    return (start, end), site


def _english_end(text: str, start: int) -> int:
    """The end of an English finding: its sentence, or a comma that opens a new clause (", one sentinel node was
    negative", ", but not specific"); a comma inside a description ("large, prominent nucleoli") does not end it."""
    end = sentence(text, start)[1]
    for comma in re.finditer(r",\s*(\w+)", text[start:end]):
        if comma.group(1).lower() in grammar().function_words or comma.group(1).isdigit():
            return start + comma.start()
    return end


def _balanced(phrase: str) -> str:
    """The phrase without a closing bracket it did not open ("this diagnosis)")."""
    while phrase and phrase[-1] in ")）" and phrase.count("(") + phrase.count("（") < phrase.count(")") + \
            phrase.count("）"):
        phrase = phrase[:-1].rstrip()
    return phrase


def _heads(text: str, span: Span) -> list[re.Match[str]]:
    g = grammar()
    return [m for m in g.heads.finditer(text, *span) if m.group().lower() not in g.not_heads]


def _headed(text: str, span: Span) -> bool:
    return bool(_heads(text, span))


def _chinese_cut(text: str, start: int, end: int) -> int:
    """A Chinese phrase ends with its last morphology head and the bracket right after it ("直肠腺癌(中低度分化)");
    what follows ("1月", a size) is not the diagnosis."""
    heads = _heads(text, (start, end))
    if not heads:
        return end
    cut = heads[-1].end()
    bracket = _BRACKET.match(text, cut, end)
    return bracket.end() if bracket else cut


def _morphology(text: str) -> tuple[Span, Span | None] | None:
    """The first noun phrase headed by a morphology term, with its modifiers and its negation."""
    heads = _heads(text, (0, len(text)))
    if not heads:
        return None
    head = heads[0]
    span = _chinese_np(text, head.span()) if CJK.match(head.group()) else _english_np(text, head.span())
    return _negated(text, span), None


def _english_np(text: str, head: Span) -> Span:
    """A head with up to five modifiers before it ("invasive ductal carcinoma") and the heads right after it
    ("carcinoma in situ", "tumor metastasis")."""
    g, (start, end) = grammar(), head
    for _ in range(5):
        word = re.search(r"(\w[\w'’-]*)\s+$", text[max(0, start - 40):start])
        if word is None or word.group(1).lower() in g.stops:
            break
        start -= len(word.group())
    while (nxt := g.heads.match(text, end + 1)) and text[end] == " " and nxt.group().lower() not in g.not_heads:
        end = nxt.end()
    return start, end


def _chinese_np(text: str, head: Span) -> Span:
    """A Chinese head with the run before it back to a mark or a stop word ("淋巴结1/6见腺癌" -> 腺癌), and the run
    after it to its last head."""
    g = grammar()
    window = max(0, head[0] - 16)
    before = text[window:head[0]]
    cuts = [m.end() for m in _CHINESE_BREAK.finditer(before)]
    cuts += [m.end() for m in g.chinese_stops.finditer(before)]
    start = window + max(cuts, default=0)
    lead = g.lead.match(text, start, head[0])
    start = lead.end() if lead else start
    stop = _CHINESE_END.search(text, head[1])
    return start, _chinese_cut(text, head[0], stop.start() if stop else len(text))


def _negated(text: str, span: Span) -> Span:
    """The phrase with the negation cue that governs it ("no evidence of malignancy", "未见癌")."""
    cues = [m for m in negation().cue.finditer(text, sentence(text, span[0])[0], span[0])
            if len(text[m.end():span[0]].split()) <= 3 and not re.search(r"[,;:，；：]", text[m.end():span[0]])
            and (m.group().isascii() or m.end() >= span[0] - 2)]
    return (cues[-1].start(), span[1]) if cues else span


def _specimen(text: str, diagnosis: Span) -> list[Span]:
    """The first procedure with its site ("core needle biopsy", "biopsy of the lower lip", "前列腺系统穿刺"), else a
    report's opening field before its findings ("Cervical Lymph Node: Findings: ...")."""
    g = grammar()
    for procedure in g.procedures.finditer(text):
        if not overlap(procedure.span(), diagnosis):
            return [_site(text, procedure.span(), diagnosis)]
    opening = _OPENING.match(text)
    if opening and g.fields.match(text, opening.end()) and not g.examinations.search(opening.group(1)):
        return [opening.span(1)]
    return []


def _site(text: str, procedure: Span, diagnosis: Span) -> Span:
    """A procedure with the site written before it (three words; a Chinese run) or after it ("of the lower lip"),
    never into the diagnosis."""
    g, (start, end) = grammar(), procedure
    if CJK.match(text[start]):
        run = re.search(r"[\u4e00-\u9fff()（）]{0,10}$", text[:start])
        if run:
            stops = [m.end() for m in g.chinese_stops.finditer(run.group())]
            first = run.start() + max(stops, default=0)
            lead = g.lead.match(text, first, start)
            start = lead.end() if lead else first
        return start, end
    for _ in range(3):
        word = re.search(r"(\w[\w'’-]*)[ \t]+$", text[max(0, start - 40):start])
        if word is None or word.group(1).lower() in g.stops:
            break
        start -= len(word.group())
    while text[end:end + 1] == " " and (more := g.procedures.match(text, end + 1)):
        end = more.end()
    after = re.match(r"\s+(?:of|from)\s+(?:(?:the|a|an)\s+)?", text[end:], re.IGNORECASE)
    site, at = end, end + (after.end() if after else 0)
    for _ in range(5 if after else 0):
        word = re.compile(r"\w[\w'’-]*").match(text, at)
        if word is None or word.group().lower() in g.stops or overlap(word.span(), diagnosis):
            break
        site, at = word.end(), word.end() + 1
        if text[word.end():at] != " ":
            break
    return start, site
