"""A section's CDA narrative block (<text>) -> FHIR XHTML, plain text, and its ID -> text map.

The narrative is what the clinician signed: entries point into it (<reference value="#allergen1"/>) for their
original text, so "Penicillin G benzathine" survives even when the coded allergen is null-flavoured. CDA's own
elements become their XHTML cousins (paragraph -> p, content -> span, list/item -> ul/li); styleCode and ID
attributes are dropped, images (renderMultiMedia) are left out, and every text node is escaped.
"""

from __future__ import annotations

from html import escape
from xml.etree.ElementTree import Element

from ebmrag.records.ccda.values import inline_text

XHTML_NS = "http://www.w3.org/1999/xhtml"
_TAGS = {
    "paragraph": "p", "content": "span", "list": "ul", "item": "li", "br": "br", "caption": "caption",
    "table": "table", "thead": "thead", "tbody": "tbody", "tfoot": "tfoot", "tr": "tr", "th": "th", "td": "td",
    "colgroup": "colgroup", "col": "col", "sub": "sub", "sup": "sup", "linkHtml": "a", "footnote": "span",
    "footnoteRef": "span", "pre": "pre",
}
_KEPT_ATTRIBUTES = {"colspan", "rowspan", "span"}
_DROPPED = {"renderMultiMedia"}
_VOID = {"br", "col"}
_BLOCKS = {"paragraph", "list", "item", "table", "tr", "caption", "br", "thead", "tbody", "tfoot", "pre"}


def _local(tag: str) -> str:
    return tag.split("}", 1)[1] if tag.startswith("{") else tag


def narrative_ids(text: Element | None) -> dict[str, str]:
    """Every element carrying an ID attribute -> its whitespace-collapsed text."""
    if text is None:
        return {}
    return {str(el.get("ID")): inline_text(el) for el in text.iter() if el.get("ID")}


def to_xhtml(text: Element) -> str:
    """The narrative block as a FHIR Narrative div; "" when it holds no text at all."""
    if not inline_text(text):
        return ""
    return f'<div xmlns="{XHTML_NS}">{_inner(text)}</div>'


def _inner(el: Element) -> str:
    return escape(el.text or "", quote=False) + "".join(_element(child) + escape(child.tail or "", quote=False)
                                                        for child in el)


def _element(el: Element) -> str:
    if not isinstance(el.tag, str):  # a comment or processing instruction kept by a custom parser
        return ""
    name = _local(el.tag)
    if name in _DROPPED:
        return ""
    tag = _TAGS.get(name, "span")
    if name == "list" and el.get("listType") == "ordered":
        tag = "ol"
    attributes = "".join(f' {key}="{escape(value)}"' for key, value in el.attrib.items()
                         if key in _KEPT_ATTRIBUTES)
    href = el.get("href") or ""
    if tag == "a" and href.startswith(("http://", "https://", "#")):
        attributes += f' href="{escape(href)}"'
    if tag in _VOID:
        return f"<{tag}{attributes}/>"
    if name == "list":  # XHTML has no list caption: it becomes a paragraph before the list
        captions = "".join(f"<p>{_inner(c)}</p>" for c in el if isinstance(c.tag, str) and _local(c.tag) == "caption")
        items = "".join(_element(c) + escape(c.tail or "", quote=False) for c in el
                        if not (isinstance(c.tag, str) and _local(c.tag) == "caption"))
        return f"{captions}<{tag}{attributes}>{items}</{tag}>"
    return f"<{tag}{attributes}>{_inner(el)}</{tag}>"


def plain_text(text: Element | None) -> str:
    """The narrative as readable lines: blocks and table rows on their own lines, cells separated by " | "."""
    if text is None:
        return ""
    parts: list[str] = []
    _collect(text, parts)
    lines = (" ".join(line.split()).strip("| ") for line in "".join(parts).split("\n"))
    return "\n".join(line for line in lines if line)


def _collect(el: Element, parts: list[str]) -> None:
    parts.append((el.text or "").replace("\n", " "))
    for child in el:
        name = _local(child.tag) if isinstance(child.tag, str) else ""
        if name and name not in _DROPPED:
            if name in _BLOCKS:
                parts.append("\n")
            elif name in ("td", "th"):
                parts.append(" | ")
            _collect(child, parts)
            if name in _BLOCKS:
                parts.append("\n")
        parts.append((child.tail or "").replace("\n", " "))
