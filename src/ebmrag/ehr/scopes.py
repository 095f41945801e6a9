"""Whether an access token's granted scopes let a client read every record of a kind (SMART App Launch scopes).

A server answers `$everything` or a search with what the token may see and nothing else: a token granted
`system/Observation.rs` gets a chart without allergies, silently, and that chart would say "no allergy recorded".
So the scopes the token endpoint granted (its answer's `scope`, which may be narrower than asked for) are read:

- v1: `<context>/<Type or *>.<read|write|*>`; v2: `<context>/<Type or *>.<c r u d s letters>[?query]`, with the
  context `patient`, `user` or `system`;
- a kind is read whole when some scope names it (or `*`) with read (v1 `read` or `*`, v2 `r` or `s`) and no query:
  a v2 scope with a query (`system/Observation.rs?category=laboratory`) grants only part of the kind;
- a grant that holds no resource scope at all (only `openid`, an unknown grammar) says nothing about kinds: every
  kind counts as read, as when the server grants without saying what.
"""

from __future__ import annotations

import re

_SCOPE = re.compile(r"(?:patient|user|system)/(?P<kind>[A-Za-z]+|\*)\.(?P<rights>read|write|\*|[cruds]+)"
                    r"(?P<query>\?\S*)?")


def scope_reads(granted: str, kind: str) -> bool:
    """Whether the space-separated `granted` scopes let every `kind` record be read (module doc)."""
    scopes = [m for token in granted.split() if (m := _SCOPE.fullmatch(token))]
    if not scopes:
        return True
    return any(m["kind"] in (kind, "*") and not m["query"] and _reads(m["rights"]) for m in scopes)


def _reads(rights: str) -> bool:
    if rights in ("read", "*"):
        return True
    return rights != "write" and ("r" in rights or "s" in rights)
