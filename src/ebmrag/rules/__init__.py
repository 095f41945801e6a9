"""Every rule, code list and vocabulary ebmrag decides by, as files a clinician can read, and the one loader.

The files sit in this folder by subject (`drugs/`, `records/`, `evidence/`, `ehr/`, `text/`), each with its
provenance in the LICENSES.md of its folder. A module that decides by a file declares how it reads it:

    @rule_file("records/absent.toml")
    def _absent(raw: Mapping[str, Any]) -> dict[str, Pattern[str]]:
        ...  # compile the table into the form the module uses

and calls `_absent()` where it needs it. The book (`bundled()`) parses each file once per process and keeps what
each reader made of it. `check()` runs every declared reader on its files: `Resources` (compose) calls it at
start-up, so a damaged or mis-edited file stops the service with its path and the fault named, not the first
question that needs it.

A reader of several files names them all; its builder receives their tables in that order, and the book keeps
what it made under all the names:

    @rule_file("evidence/analytes.toml", "evidence/critical_values.toml", as_files=True)
    def load_vocabulary(analytes: RuleFile, critical: RuleFile) -> ResultVocabulary:
        ...

With `as_files=True` the builder receives each file as a `RuleFile` instead of its table alone: the table, the
path its own errors name (`RuleBook(copy).check()` must name the copy's file, not the bundled one) and the file's
text, for the fingerprint of results computed with it (`Negation.source`, `ResultVocabulary.fingerprint`). A
builder's KeyError, TypeError or ValueError is a ConfigError naming its file (or files); a ConfigError it raises
itself is its own message, so it names `file.path`.

Why one loader: before it, sixteen modules each cached a file of their own, in six folders, some failing with
`ConfigError` and some with a bare `KeyError` on the first request that touched them; the drug vocabulary, the
negation cues and the result vocabulary kept cached readers of their own until a reader could declare several
files and be handed their paths and texts.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from ebmrag.errors import ConfigError

FOLDER = Path(__file__).resolve().parent
T = TypeVar("T")
Builder = Callable[..., Any]
_READERS: dict[tuple[str, ...], list[tuple[Builder, bool]]] = {}  # file names -> (builder, as_files) (for `check`)


@dataclass(frozen=True)
class RuleFile:
    """A rule file as read: the path its errors name, its `table` (what `RuleBook.read` gives: a read-only TOML
    table, or a word list's lines) and its text, for the fingerprint of results computed with it."""

    path: Path
    table: Any
    source: str


class RuleBook:
    """The rule files under `folder`. `read("records/absent.toml")` is the parsed TOML table (read-only);
    `read("drugs/lexicon.txt")` the file's non-empty, non-comment lines."""

    def __init__(self, folder: Path = FOLDER) -> None:
        if not folder.is_dir():
            raise ConfigError(f"rules folder {folder} does not exist")
        self.folder = folder.resolve()
        self._raw: dict[str, Any] = {}
        self._built: dict[tuple[tuple[str, ...], Builder], Any] = {}
        self._fingerprint: str | None = None

    def names(self) -> list[str]:
        """Every rule file, as its path under the folder ("records/absent.toml")."""
        return sorted(str(p.relative_to(self.folder)) for p in self.folder.rglob("*")
                      if p.suffix in (".toml", ".txt") and p.is_file())

    def path(self, name: str) -> Path:
        path = (self.folder / name).resolve()
        if not path.is_relative_to(self.folder) or path.suffix not in (".toml", ".txt"):
            raise ConfigError(f"rule file {name!r}: not a .toml or .txt file under {self.folder}")
        return path

    def read(self, name: str) -> Any:
        if name not in self._raw:
            path = self.path(name)
            try:
                if path.suffix == ".toml":
                    with open(path, "rb") as handle:
                        self._raw[name] = MappingProxyType(tomllib.load(handle))
                else:
                    lines = path.read_text(encoding="utf-8").splitlines()
                    self._raw[name] = tuple(s for line in lines if (s := line.strip()) and not s.startswith("#"))
            except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"rule file {path}: {exc}") from exc
        return self._raw[name]

    def source(self, name: str) -> str:
        """The file's text, for the fingerprint of results computed with it."""
        try:
            return self.path(name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"rule file {self.path(name)}: {exc}") from exc

    def file(self, name: str) -> RuleFile:
        """The file as a builder declared `as_files=True` receives it: its path, its table and its text."""
        return RuleFile(self.path(name), self.read(name), self.source(name))

    def fingerprint(self) -> str:
        """A digest of every rule file: a stored decision made with other rules is stale."""
        if self._fingerprint is None:
            digest = hashlib.sha256()
            for name in self.names():
                digest.update(name.encode() + b"\0" + self.path(name).read_bytes() + b"\0")
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    def built(self, names: str | Sequence[str], build: Callable[..., T], *, as_files: bool = False) -> T:
        """`build(*tables)` of the files `names` (one name or several, in the builder's order), or `build(*files)`
        with `as_files` (each a `RuleFile`), once per book; a table without what the builder needs fails naming
        the file (every file, for a builder of several)."""
        names = (names,) if isinstance(names, str) else tuple(names)
        key = (names, build)
        if key not in self._built:
            given = [self.file(name) if as_files else self.read(name) for name in names]
            try:
                self._built[key] = build(*given)
            except ConfigError:
                raise
            except (KeyError, TypeError, ValueError, AttributeError, re.error) as exc:
                paths = ", ".join(str(self.path(name)) for name in names)
                raise ConfigError(f"rule file{'s' if len(names) > 1 else ''} {paths}: "
                                  f"{type(exc).__name__}: {exc}") from exc
        return self._built[key]  # type: ignore[no-any-return]

    def check(self) -> None:
        """Read every file of the folder and run every declared reader on its files, naming the first fault."""
        for name in self.names():
            self.read(name)
        for names, builders in sorted(_READERS.items()):
            for build, as_files in builders:
                self.built(names, build, as_files=as_files)


def read_user_file(path: Path, what: str) -> tuple[Mapping[str, Any], str]:
    """(the table, its text) of a rule file a user names in the settings in place of a bundled one (`[models]
    tier_rules`, `question_rules`), with the same errors: the file and what it was to be named."""
    try:
        source = path.read_text(encoding="utf-8")
        return MappingProxyType(tomllib.loads(source)), source
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {path} is not valid TOML: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what} {path} could not be read: {exc}") from exc


@cache
def bundled() -> RuleBook:
    """The bundled rules, one book per process."""
    return RuleBook()


def rule_file(*names: str, as_files: bool = False) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Declare how a module reads the rule file `name` (or the files `names`, its builder receiving their tables
    in that order; with `as_files`, each as a `RuleFile`): the decorated builder turns them into the form the
    module uses, and the returned function gives that form, built once by a book (default: the bundled one; a
    test or a site with its own rules folder passes its `RuleBook`)."""
    if not names:
        raise TypeError("rule_file needs at least one file name")

    def declare(build: Callable[..., T]) -> Callable[..., T]:
        _READERS.setdefault(names, []).append((build, as_files))

        def read(book: RuleBook | None = None) -> T:
            return (book or bundled()).built(names, build, as_files=as_files)

        read.__doc__ = build.__doc__
        read.__name__ = build.__name__
        return read
    return declare
