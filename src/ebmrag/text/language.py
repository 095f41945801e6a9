"""Which language a question is in: English and Chinese are supported, anything else is refused by name.

Script decides first: a question whose letters are at least 20 % CJK ideographs (two at least) is Chinese (Chinese
notes mix in Latin lab names like HER2 or CEA). A Latin-script question is English unless it has
at least four words, no common English function word and two or more function words of another
European language: the rule lexicons, prompts and symptom lists are English, and silently
answering a Spanish question with English rules would look like an answer and not be one.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

from ebmrag.errors import EbmragError

SUPPORTED = ("en", "zh")
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
_ENGLISH = frozenset("the a an of and or is are was were be to in on for with what which who how does do did "
                     "should can could would his her their this that there any after before than not no".split())
_OTHER_EUROPEAN = frozenset("el la los las de del que y en por para con una un es est le les des du et pour "
                            "avec une der die das und ist mit für ein eine nicht il lo gli di che per sono um "
                            "uma não".split())


class UnsupportedLanguageError(EbmragError, ValueError):
    """The text is in a language ebmrag has no rules and prompts for."""


def _script(char: str) -> str:
    if "\u4e00" <= char <= "\u9fff" or "\u3400" <= char <= "\u4dbf":
        return "CJK"
    try:
        return unicodedata.name(char).split()[0]
    except ValueError:
        return "UNKNOWN"


def detect_language(text: str) -> str:
    letters = [c for c in text if c.isalpha()]
    if not letters:
        raise UnsupportedLanguageError("the question has no words to read")
    scripts = Counter(_script(c) for c in letters)
    if scripts["CJK"] >= max(2, 0.2 * len(letters)):
        return "zh"
    if scripts["LATIN"] < 0.7 * len(letters):
        found = scripts.most_common(1)[0][0].title()
        raise UnsupportedLanguageError(f"the question is written in {found} script; ebmrag supports English and "
                                       "Chinese questions")
    words = [w.lower() for w in _WORD.findall(text)]
    if len(words) >= 4 and not _ENGLISH.intersection(words) and len(_OTHER_EUROPEAN.intersection(words)) >= 2:
        raise UnsupportedLanguageError("the question looks like a European language other than English; ebmrag "
                                       "supports English and Chinese questions")
    return "en"


def prompt_language(text: str) -> str:
    """The language of `text` for picking a prompt: `detect_language`'s, English for text it cannot place."""
    try:
        return detect_language(text)
    except UnsupportedLanguageError:
        return "en"
