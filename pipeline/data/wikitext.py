"""Wikitext -> text for MediaWiki dumps (pipeline.data.wiki): mwparserfromhell's C tokenizer, and a walk over its
flat token stream. Its full parse (the node tree its Python builder makes) costs about 0.7 ms a page on the sample
against 0.13 ms for the tokens, and wikitextparser's parse is as slow (4.3 ms for the 11 pages, either library);
walking the tokens makes the conversion 1.5x WikiExtractor's instead of 0.36x (bench/data/wiki_compare.py). The
rule is the BERT paper's "extract only the text passages and ignore lists, tables, and headers":
  kept:    text; the text of internal links (`[[target|text]]` -> text, `[[target]]` -> target) and of
           external links with a label (`[http://x label]` -> label); the content of formatting tags
           (`''`/`'''` quotes are removed, `<b>`, `<i>`, `<span>`, `<sup>`, `<small>`, `<div>`, `<blockquote>`, ...);
           HTML entities decoded (`&nbsp;` -> U+00A0); `<nowiki>` content as written.
  dropped: templates (`{{...}}`, so infoboxes, navboxes, citations, and every template that renders text too:
           `{{convert}}`, `{{lang}}`; no template is expanded), template arguments (`{{{x}}}`); references
           (`<ref>...</ref>`, `<ref/>`, `<references/>`); tables (`{| ... |}`, `<table>`); files and images
           (`[[File:...]]`, `[[Image:...]]`, `[[Media:...]]`, with their captions); categories (`[[Category:...]]`;
           `[[:Category:X]]`, a visible link, is kept as text); interlanguage links (`[[de:...]]`: a prefix of 2-3
           letters or `simple`); bare URLs and label-less `[http://x]`; comments; behaviour switches
           (`__NOTOC__`); the tags math, chem, ce, score, graph, timeline, gallery, imagemap, syntaxhighlight,
           source, pre, code, hiero, inputbox, templatedata, mapframe, maplink, includeonly, indicator;
           lists (every line that starts with `*`, `#`, `;` or `:`, and `<ul>`/`<ol>`/`<dl>` elements) unless
           `WikiOptions.keep_lists` (then each item is its own paragraph, without its marker); headings
           (`== X ==`) unless `WikiOptions.keep_headings` (then the title is its own paragraph).
Paragraphs are separated by a blank line (a dropped line ends a paragraph too); lines within one are joined
by `\\n`, which the sentence splitter reads as a space.

    >>> wikitext_to_text("'''Archer''' is a [[slab serif|slab]] face.<ref>{{cite web}}</ref>\\n== Uses ==\\n* a list")
    'Archer is a slab face.'

Bounded time. The tokenizer backtracks: markup it cannot close (`<ref ` without `>`, `{{a|` without `}}`, an
unclosed `<!--`, `<b>` without `</b>`) makes it read the rest of the page again, once for each such opener, so a
page of them takes time that grows with the square of its size (`<ref ` at 20 KiB: 24 s; bench/RESULTS.md,
"Malformed input"). `markup_cost` counts, in one linear pass, what those openers may make it read again (the text
after each opener that is never closed); a page whose cost is over `MARKUP_BUDGET` times its length (plus
`MARKUP_SLACK`) is not converted: the dump reader rejects it as `markup_budget` (`wiki.page_text`). A time limit
would not do: the bytes would depend on the machine's load, and a signal that interrupts the tokenizer leaves it
broken for every later call.
"""

from __future__ import annotations

import bisect
import html
import re
from dataclasses import dataclass

import numpy as np
from mwparserfromhell.definitions import PARSER_BLACKLIST, SINGLE, URI_SCHEMES
from mwparserfromhell.parser import Parser
from mwparserfromhell.parser import tokens as T

_TOKENIZER = Parser()._tokenizer  # mwparserfromhell's own choice: the C tokenizer when built (the wheels)


@dataclass(frozen=True)
class WikiOptions:
    """What of a page's wikitext becomes text beyond the paragraphs (the BERT paper keeps neither)."""

    keep_lists: bool = False
    """Keep list items (`*`, `#`, `;`, `:` lines), each as its own paragraph."""
    keep_headings: bool = False
    """Keep section headings, each as its own paragraph."""


_DROP_TAGS = frozenset(
    "ref references table gallery imagemap timeline graph score math chem ce syntaxhighlight source pre code hiero "
    "inputbox templatedata mapframe maplink includeonly indicator".split()
)
_LIST_TAGS = frozenset({"ul", "ol", "dl"})
_LIST_ITEM = frozenset({"li", "dt", "dd"})
_HIDDEN_NS = frozenset({"file", "image", "media", "category"})
_INTERLANGUAGE = re.compile(r"[a-z]{2,3}(-[a-z0-9]+)*|simple")
_SWITCH_OR_QUOTES = re.compile(r"__[A-Z]+__|'{2,}")  # behaviour switches; bold and italic quotes
# What is left of "(; {{birth date|..}})". Written so that no two quantifiers share the same spaces: the form
# `[ \t]*[,;:]?[ \t]*` tried every split of a run of spaces between them (20,000 spaces after a `(`: 1.9 s).
_EMPTY_PARENS = re.compile(r" ?\([ \t]*(?:[,;:][ \t]*)?\)")
# Spaces before punctuation; matched from the first space of a run only (the lookbehind), once per run: ` +`
# alone restarted at every space of a run (20,000 spaces not followed by punctuation: 24 s).
_SPACE_PUNCT = re.compile(r"(?<! ) +([,.;:!?])")
_LIST = "\x01"  # marks the start of a list item in the rendered text: its line is dropped (or kept)
_HEAD = "\x02"  # marks a heading


def _tokenize(text: str) -> list:
    """mwparserfromhell's token stream (its C tokenizer, built in the wheels): the parse without the node tree,
    which costs five times the tokenizing and which the walk below does not need."""
    return _TOKENIZER.tokenize(text, 0, True)  # context 0; skip_style_tags: bold/italic quotes stay text


# Token classes, compared by identity in the walk below.
TEXT, TPL_OPEN, TPL_CLOSE = T.Text, T.TemplateOpen, T.TemplateClose
WL_OPEN, WL_SEP, WL_CLOSE = T.WikilinkOpen, T.WikilinkSeparator, T.WikilinkClose
EL_OPEN, EL_SEP, EL_CLOSE = T.ExternalLinkOpen, T.ExternalLinkSeparator, T.ExternalLinkClose
ENT_START, ENT_END, HEAD_START, HEAD_END = T.HTMLEntityStart, T.HTMLEntityEnd, T.HeadingStart, T.HeadingEnd
TAG_OPEN, TAG_CLOSE_OPEN, TAG_SELFCLOSE = T.TagOpenOpen, T.TagCloseOpen, T.TagCloseSelfclose
TAG_OPEN_CLOSE, TAG_CLOSE_CLOSE = T.TagOpenClose, T.TagCloseClose
_DROPPED = {TPL_OPEN: (TPL_OPEN, TPL_CLOSE), T.ArgumentOpen: (T.ArgumentOpen, T.ArgumentClose),
            T.CommentStart: (T.CommentStart, T.CommentEnd)}


def _skip(toks: list, i: int, open_: type, close: type) -> int:
    """The index after the `close` that balances the `open_` at i."""
    depth = 0
    n = len(toks)
    while i < n:
        k = type(toks[i])
        if k is open_:
            depth += 1
        elif k is close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def _walk(toks: list, i: int, out: list[str], stop: tuple[type, ...]) -> int:
    """Render tokens from i into `out` until a token of a kind in `stop` (returned, not consumed) or the end.
    Every construct consumes its own closing token, so nesting (a link in a file caption) needs no care."""
    n = len(toks)
    while i < n:
        k = type(toks[i])
        if k in stop:
            return i
        if k is TEXT:
            out.append(toks[i]["text"])
            i += 1
        elif k in _DROPPED:  # templates, template arguments, comments: dropped whole
            i = _skip(toks, i, *_DROPPED[k])
        elif k is WL_OPEN:
            title: list[str] = []
            i = _walk(toks, i + 1, title, (WL_SEP, WL_CLOSE))
            label: list[str] | None = None
            if i < n and type(toks[i]) is WL_SEP:
                label = []
                i = _walk(toks, i + 1, label, (WL_CLOSE,))
            i += 1
            t = "".join(title).strip()
            if not t.startswith(":") and ":" in t:
                prefix = t.split(":", 1)[0].strip().lower()
                if prefix in _HIDDEN_NS or _INTERLANGUAGE.fullmatch(prefix):
                    continue
            if label is not None:
                out.extend(label)
            else:
                out.append(t.lstrip(":").strip().lstrip("#"))
        elif k is EL_OPEN:
            i = _walk(toks, i + 1, [], (EL_SEP, EL_CLOSE))  # the URL: dropped
            if i < n and type(toks[i]) is EL_SEP:
                i = _walk(toks, i + 1, out, (EL_CLOSE,))  # the label: kept
            i += 1
        elif k is ENT_START:
            j = i + 1
            while j < n and type(toks[j]) is not ENT_END:
                j += 1
            out.append(_entity(toks[i + 1 : j]))
            i = j + 1
        elif k is HEAD_START:
            out.append("\n" + _HEAD)
            i = _walk(toks, i + 1, out, (HEAD_END,)) + 1
            out.append("\n")
        elif k is TAG_OPEN:
            i = _tag(toks, i, out)
        else:  # separators and attribute tokens outside what consumes them: nothing to render
            i += 1
    return i


def _tag(toks: list, i: int, out: list[str]) -> int:
    """A tag from its TagOpenOpen at i: its name, attributes skipped, its contents rendered or dropped."""
    markup = toks[i].get("wiki_markup")
    n = len(toks)
    tag = toks[i + 1]["text"].strip().lower() if i + 1 < n and type(toks[i + 1]) is TEXT else ""
    i = _walk(toks, i + 1, [], (TAG_CLOSE_OPEN, TAG_SELFCLOSE))  # the name and attributes: not text
    if i >= n:
        return i
    if type(toks[i]) is TAG_SELFCLOSE:
        if markup and tag in _LIST_ITEM:
            out.append("\n" + _LIST)  # `*`, `#`, `;`, `:` at a line start (`;a:b` puts dd mid-line)
        elif tag in ("br", "hr"):
            out.append("\n")
        return i + 1
    listy = tag in _LIST_ITEM or tag in _LIST_TAGS  # an HTML list: each item a line of its own
    if listy:
        out.append("\n" + _LIST if tag in _LIST_ITEM else "\n")
    i = _walk(toks, i + 1, [] if tag in _DROP_TAGS else out, (TAG_OPEN_CLOSE,))
    if listy:
        out.append("\n")
    while i < n and type(toks[i]) is not TAG_CLOSE_CLOSE:
        i += 1
    return i + 1


def _entity(parts: list) -> str:
    s = "".join("#" if isinstance(t, T.HTMLEntityNumeric) else t.get("char", "x") if isinstance(t, T.HTMLEntityHex)
                else t.get("text", "") for t in parts)
    return html.unescape(f"&{s};")


def wikitext_to_text(wikitext: str, options: WikiOptions = WikiOptions()) -> str:
    """A page's text passages (see the module docstring for what is kept and dropped)."""
    out: list[str] = []
    _walk(_tokenize(wikitext), 0, out, ())
    text = "".join(out)
    text = _SPACE_PUNCT.sub(r"\1", _EMPTY_PARENS.sub("", _SWITCH_OR_QUOTES.sub("", text)))
    paras: list[list[str]] = [[]]
    for line in text.split("\n"):
        line = " ".join(line.split())  # runs of spaces, tabs, no-break spaces: one space
        kind = line[:1]
        if kind in (_LIST, _HEAD):
            body = line.lstrip(_LIST + _HEAD).strip()
            keep = options.keep_lists if kind == _LIST else options.keep_headings
            paras.append([body] if keep and body else [])
            paras.append([])
        elif line:
            paras[-1].append(line)
        elif paras[-1]:
            paras.append([])
    return "\n\n".join("\n".join(p) for p in paras if p).replace(_LIST, "").replace(_HEAD, "")


# ---------------------------------------------------------------------------------------------- the markup budget

MARKUP_BUDGET = 4
"""How many times its own length (plus `MARKUP_SLACK` characters) a page's unclosed markup may make the tokenizer
read again before the page is rejected (`markup_budget`). A real article's few stray openers cost well under one
length; each one the budget admits costs up to about three times a clean page's conversion (bench/RESULTS.md,
"Malformed input"), so a page within the budget converts in linear time."""
MARKUP_SLACK = 1 << 16
"""Characters of rescanning every page may cost whatever its length (a short page with a few stray openers)."""

# The openers and closers other than `{{ }}` and `[[ ]]` (counted with numpy, `_bracket_cost`), one pattern per
# first character, so that the regex engine finds each by its literal first character and skips text fast.
_ANGLE = re.compile(r"<(?:(?P<comment>!--)|(?P<slash>/?)(?P<tag>[A-Za-z][A-Za-z0-9]*))")  # comments, tags
_TABLE_OPEN, _TABLE_CLOSE = re.compile(r"\{\|"), re.compile(r"\|\}(?!\})")  # `|}}` closes a template
# [http://x label]; lowercase schemes only: a case-insensitive branch costs the engine its fast scan for `[`
_LINK = re.compile(r"\[(?://|(?:%s):)" % "|".join(sorted(URI_SCHEMES)))
_OPAQUE = frozenset(t.lower() for t in PARSER_BLACKLIST)  # nowiki, pre, math, source, ...: content is not parsed
_SINGLE = frozenset(t.lower() for t in SINGLE)  # br, hr, li, td, ...: no closing tag needed


class _Next:
    """The next position of a string at or after a position, for positions that only grow: each search starts
    where the last one stopped, so all of them together read the text once."""

    def __init__(self, text: str, what: str | re.Pattern) -> None:
        self.text, self.what, self.at = text, what, -1

    def __call__(self, pos: int) -> int:
        """The position, or len(text) when there is none."""
        if self.at < pos:
            if isinstance(self.what, str):
                k = self.text.find(self.what, pos)
            else:
                m = self.what.search(self.text, pos)
                k = m.start() if m else -1
            self.at = len(self.text) if k < 0 else k
        return self.at


def _doubled(raw: np.ndarray, byte: int) -> np.ndarray:
    """Where `byte` twice starts, as a left-to-right scan finds them (`{{{{` is two, at 0 and 2).

    >>> _doubled(np.frombuffer(b"{{{ {{{{", np.uint8), ord("{")).tolist()
    [0, 4, 6]
    """
    hit = np.flatnonzero((raw[:-1] == byte) & (raw[1:] == byte))
    if len(hit) < 2:
        return hit
    starts = np.ones(len(hit), bool)
    starts[1:] = np.diff(hit) != 1  # a run of the byte gives consecutive hits: keep every other from its first
    run_first = np.flatnonzero(starts)[np.cumsum(starts) - 1]
    return hit[(np.arange(len(hit)) - run_first) % 2 == 0]


def _bracket_cost(raw: np.ndarray, opener: int, closer: int) -> int:
    """Σ (bytes after it) over each doubled `opener` no later doubled `closer` closes (last-in first-out):
    an opener is closed where the depth first drops below the depth it opened."""
    opens, closes = _doubled(raw, opener), _doubled(raw, closer)
    if not len(opens):
        return 0
    pos = np.concatenate([opens, closes])
    order = np.argsort(pos, kind="stable")
    pos = pos[order]
    sign = np.concatenate([np.ones(len(opens), np.int64), -np.ones(len(closes), np.int64)])[order]
    depth = np.cumsum(sign)
    floor = np.minimum.accumulate(depth[::-1])[::-1]  # the lowest depth from each position on
    unclosed = (sign > 0) & (floor >= depth)
    return int((len(raw) - pos[unclosed]).sum())


def markup_cost(wikitext: str) -> int:
    """Characters the tokenizer may read again for markup that is never closed, in linear time: for each opener
    (`{{`, `[[`, `{|`, `<!--`, a tag that needs a closing tag) with no closer after it, the text after it; for a
    tag with no `>` before the next `<`, the text after it; for an external link with no `]` on its line, the rest
    of the line. Openers are matched to closers last-in first-out per kind (per name for tags); the contents of
    comments and of unparsed tags (nowiki, pre, math, ...) hold no tags, tables or links.

    >>> markup_cost("A [[link]], {{t|x}} and <ref>r</ref>."), markup_cost("{{a|" * 3)
    (0, 24)
    """
    n = len(wikitext)
    raw = np.frombuffer(wikitext.encode("utf-8", "surrogatepass"), np.uint8)
    brackets = _bracket_cost(raw, ord("{"), ord("}")) + _bracket_cost(raw, ord("["), ord("]"))
    tags = _Tags(wikitext)
    cost = brackets * n // max(1, len(raw)) + tags.cost()  # bytes to characters
    hidden = tags.hidden
    tables: list[int] = []
    events = sorted([(m.start(), 1) for m in _TABLE_OPEN.finditer(wikitext)]
                    + [(m.start(), -1) for m in _TABLE_CLOSE.finditer(wikitext)])
    for a, step in events:
        if hidden.covers(a) or not _at_line_start(wikitext, a):
            continue
        if step > 0:
            tables.append(a)
        elif tables:
            tables.pop()
    newline, bracket = _Next(wikitext, "\n"), _Next(wikitext, "]")
    for m in _LINK.finditer(wikitext):  # its label ends at the line's end
        if bracket(m.end()) >= newline(m.end()) and not hidden.covers(m.start()):  # equal: neither is there
            cost += newline(m.end()) - m.start()
    return cost + sum(n - a for a in tables)


def _at_line_start(text: str, a: int) -> bool:
    """Whether only spaces and tabs stand between the line's start and `a` (a table's `{|` and `|}`)."""
    while a > 0 and text[a - 1] in " \t":
        a -= 1
    return a == 0 or text[a - 1] == "\n"


class _Spans:
    """Disjoint spans [start, end), added in order of position; `covers` answers for positions in any order."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, start: int, end: int) -> None:
        self.starts.append(start)
        self.ends.append(end)

    def covers(self, pos: int) -> bool:
        k = bisect.bisect_right(self.starts, pos) - 1
        return k >= 0 and pos < self.ends[k]


class _Tags:
    """`markup_cost` for comments and tags, in one walk over every `<`: an unclosed comment costs the text after
    it; a `<name` with no `>` before the next `<` costs the text after it; an opening tag that needs a closing tag
    and never gets one costs the text after it; the contents of comments and unparsed tags are `hidden`."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.hidden = _Spans()
        self.open_at: dict[str, list[int]] = {}  # tag name -> positions of its unclosed opening tags
        self.gt, self.lt, self.comment_end = _Next(text, ">"), _Next(text, "<"), _Next(text, "-->")
        self.closers: dict[str, _Next] = {}

    def cost(self) -> int:
        text, n = self.text, len(self.text)
        cost = skip = 0
        for m in _ANGLE.finditer(text):
            a = m.start()
            if a < skip:
                continue
            if m.group("comment"):
                end = self.comment_end(m.end())
                if end == n:
                    cost += n - a
                else:
                    self.hidden.add(a, end + 3)
                    skip = end + 3
            else:
                cost, skip = self._tag(m, cost, skip)
        return cost + sum(n - a for stack in self.open_at.values() for a in stack)

    def _tag(self, m: re.Match, cost: int, skip: int) -> tuple[int, int]:
        text, n, a, pos = self.text, len(self.text), m.start(), m.end()
        name = m.group("tag").lower()
        end = self.gt(pos)
        if end == n or self.lt(pos) < end:  # the tokenizer reads its attributes to no end
            return cost + n - a, skip
        if m.group("slash"):
            if self.open_at.get(name):
                self.open_at[name].pop()
        elif text[end - 1] != "/" and name not in _SINGLE:
            if name not in _OPAQUE:
                self.open_at.setdefault(name, []).append(a)
                return cost, skip
            if name not in self.closers:  # its content is text up to its closing tag
                self.closers[name] = _Next(text, re.compile(r"</" + name + r"\b", re.IGNORECASE))
            close = self.closers[name](end)
            if close == n:
                return cost + n - a, skip
            self.hidden.add(end, close)
            return cost, close
        return cost, skip


def over_budget(wikitext: str) -> bool:
    """Whether converting `wikitext` may cost more than `MARKUP_BUDGET` times its length (`markup_cost`)."""
    return markup_cost(wikitext) > MARKUP_BUDGET * len(wikitext) + MARKUP_SLACK
