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
page of them takes time that grows with the square of its size (`<ref ` at 20 KiB: 16 s; bench/results/wiki.md,
"Malformed input"). What such a reading costs depends on what it meets: 5 ns a byte inside a comment, about 13 in
a tag's body, and 0.5-1.6 us for each tag, entity, link, list line, template `|` or attribute it parses again on
the way. `markup_cost` estimates, in one linear pass, that time (the routes that fail, `_routes`, each priced by
`_PRICES`, which were fitted to the tokenizer's measured times); a page estimated over `MARKUP_BUDGET` ns a
character (plus `MARKUP_SLACK`) is not converted: the dump reader rejects it as `markup_budget` (`wiki.page_text`).
Real pages with hundreds of openers never closed (manuals, code, anything converted into wikitext) convert in a few
us a character and are kept; the estimate is within 0.7-1.3x of the measured time on the hostile pages it rejects.
A time limit would not do: the bytes would depend on the machine's load, and a signal that interrupts the
tokenizer leaves it broken for every later call.
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
_DROPPED = {
    TPL_OPEN: (TPL_OPEN, TPL_CLOSE),
    T.ArgumentOpen: (T.ArgumentOpen, T.ArgumentClose),
    T.CommentStart: (T.CommentStart, T.CommentEnd),
}


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
    s = "".join(
        "#"
        if isinstance(t, T.HTMLEntityNumeric)
        else t.get("char", "x")
        if isinstance(t, T.HTMLEntityHex)
        else t.get("text", "")
        for t in parts
    )
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

MARKUP_BUDGET = 12_000
"""Nanoseconds of conversion (on the machine `_PRICES` were measured on) that a page's unclosed markup may cost
per character of the page, plus `MARKUP_SLACK`: a page estimated over it is rejected (`markup_budget`). A page that
converts in up to 10 us a character is within it (the estimate is within 0.7-1.1x of the measured time where it
matters); the hostile pages of bench/data/reader_timing.py --markup, from 20 KiB, are over it."""
MARKUP_SLACK = 10_000_000
"""Nanoseconds every page may cost whatever its length (a short page with a few stray openers)."""


@dataclass(frozen=True)
class _Price:
    """What the tokenizer spends, in ns, on a route of one kind that fails (an opener never closed): per byte it
    reads, once per route, and per mark it meets on the way (`_marks`): markup it parses, or tries to, and throws
    away with the route."""

    byte: float
    route: float = 0.0
    each: tuple[tuple[str, float], ...] = ()


# Fitted to the C tokenizer's CPU times (`python bench/data/reader_timing.py --calibrate`; bench/results/wiki.md,
# "Long technical pages") on pages of one kind of opener followed by text holding one kind of mark, on the hostile
# patterns and on real manuals; rounded. A table's byte is raised from the fitted 12-14 to 20: tables nested in
# tables (the hostile `{|` pattern, random mixtures) measured 1.5x that. The check against measured times is the
# same command's second table (hostile pages) and `--technical` (real pages: the slowest one's estimate).
_PRICES = {
    "comment": _Price(5, 3600),  # `<!--`: its content is not parsed
    "opaque": _Price(8, 600, (("entity", 1400), ("endtag", 1200))),  # `<nowiki>`, `<pre>`, `<math>`, ...
    "attrs": _Price(12, 20000, (("word", 800), ("link", 440), ("entity", 220), ("row", 190), ("equals", 150))),
    "body": _Price(13, 16000, (("entity", 1600), ("line", 1200), ("tag", 1100), ("link", 640), ("colon", 100))),
    "template": _Price(
        13,
        20000,
        (("entity", 1300), ("line", 1000), ("link", 860), ("tag", 610), ("pipe", 540), ("colon", 60), ("equals", 40)),
    ),
    "wikilink": _Price(13, 6400, (("entity", 1300), ("tag", 1300), ("line", 1200), ("link", 1100), ("colon", 110))),
    "table": _Price(
        20, 20000, (("entity", 1500), ("tag", 1300), ("line", 1200), ("row", 780), ("link", 600), ("colon", 100))
    ),
    "extlink": _Price(15, 3500, (("tag", 3200), ("entity", 1500), ("link", 1200))),  # to the line's end
}

# The openers and closers other than `{{ }}` and `[[ ]]` (found with numpy, `_unclosed`), one pattern per first
# character, so that the regex engine finds each by its literal first character and skips text fast.
_ANGLE = re.compile(rb"<(?:(?P<comment>!--)|(?P<slash>/?)(?P<tag>[A-Za-z][A-Za-z0-9]*))")  # comments, tags
_TABLE_OPEN, _TABLE_CLOSE = re.compile(rb"\{\|"), re.compile(rb"\|\}(?!\})")  # `|}}` closes a template
# [http://x label]; lowercase schemes only: a case-insensitive branch costs the engine its fast scan for `[`
_LINK = re.compile(rb"\[(?://|(?:%s):)" % "|".join(sorted(URI_SCHEMES)).encode())
_LINK_END = re.compile(rb"(?<!\])\](?!\])")  # not one of a wikilink's `]]`
_OPAQUE = frozenset(t.lower().encode() for t in PARSER_BLACKLIST)  # nowiki, pre, math, source, ...: not parsed
_SINGLE = frozenset(t.lower().encode() for t in SINGLE)  # br, hr, li, td, ...: no closing tag needed
# The marks a route meets on its way (`_Price.each`), besides the openers never closed (priced as their own routes).
_ENTITY = re.compile(rb"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
_TAG = re.compile(rb"</?[A-Za-z]")
_END_TAG = re.compile(rb"</[A-Za-z]")  # in an unparsed tag's content: what may be its closing tag
_LINE = re.compile(rb"\n[*#:;=]")  # a list item or a heading
_ROW = re.compile(rb"\n[|!]")  # a table's row or cell


class _Next:
    """The next position of a string at or after a position, for positions that only grow: each search starts
    where the last one stopped, so all of them together read the text once."""

    def __init__(self, text: bytes, what: bytes | re.Pattern) -> None:
        self.text, self.what, self.at = text, what, -1

    def __call__(self, pos: int) -> int:
        """The position, or len(text) when there is none."""
        if self.at < pos:
            if isinstance(self.what, bytes):
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


def _unclosed(opens: np.ndarray, closes: np.ndarray) -> np.ndarray:
    """The openers no later closer closes (last-in first-out): an opener is closed where the depth first drops
    below the depth it opened.

    >>> _unclosed(np.array([0, 4, 9]), np.array([6])).tolist()
    [0, 9]
    """
    if not len(opens):
        return opens
    pos = np.concatenate([opens, closes])
    order = np.argsort(pos, kind="stable")
    sign = np.concatenate([np.ones(len(opens), np.int64), -np.ones(len(closes), np.int64)])[order]
    depth = np.cumsum(sign)
    floor = np.minimum.accumulate(depth[::-1])[::-1]  # the lowest depth from each position on
    return pos[order][(sign > 0) & (floor >= depth)]


# What ends a template's name or a wikilink's title (the tokenizer's `verify_safe`): `|` goes on to the parameters
# or the label, where anything goes; the others fail the route there. In a template's name, a line break after text
# fails it at the next character that is not a space, unless that is a `|`.
_NAME_END = re.compile(rb"[|\[\]<>{}\n]")


def _early_fail(text: bytes, opens: np.ndarray, template: bool) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the routes of `{{` or `[[` openers never closed: an opener whose name (title) reaches a
    `|`, or the page's end, reads to the page's end; one whose name meets what the name may not hold fails there.
    Each search stops at the next `{` or `[`, so together they read the text about once.

    >>> [e.tolist() for e in _early_fail(b"[[a|b [[c\\nd", np.array([0, 6]), template=False)]
    [[0, 6], [11, 10]]
    """
    n, ends = len(text), []
    for a in opens.tolist():
        pos = a + 2
        while True:
            m = _NAME_END.search(text, pos)
            if m is None or text[m.start()] == ord("|"):
                end = n
            elif text[m.start()] == ord("\n") and template:
                if not text[a + 2 : m.start()].strip():  # no text yet: the name may start on a later line
                    pos = m.end()
                    continue
                k = m.end()
                while k < n and text[k] in b" \t\r\n":
                    k += 1
                end = n if k < n and text[k] == ord("|") else k + 1
            else:
                end = m.start() + 1
            break
        ends.append(end)
    return opens, np.array(ends, np.int64)


def _routes(text: bytes) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The failing routes of a page's UTF-8 bytes by kind (`_PRICES`): the [start, end) each reads again. An opener
    with no closer after it (`{{`, `[[`, `{|`, `<!--`, a tag that needs a closing tag, an unparsed tag's) reads to
    the end, unless (`{{`, `[[`) its name fails first (`_early_fail`); so does a tag with no `>` before the next
    `<` (its attributes); an external link with no lone `]` on its line reads to the line's end. Openers are matched
    to closers last-in first-out per kind (per name for tags); the contents of comments and of unparsed tags
    (nowiki, pre, math, ...) hold no tags, tables or links."""
    n = len(text)
    raw = np.frombuffer(text, np.uint8)
    routes = {
        "template": _early_fail(text, _unclosed(_doubled(raw, ord("{")), _doubled(raw, ord("}"))), True),
        "wikilink": _early_fail(text, _unclosed(_doubled(raw, ord("[")), _doubled(raw, ord("]"))), False),
    }
    starts: dict[str, list] = {}
    tags = _Tags(text)
    starts.update(tags.unclosed())
    hidden = tags.hidden
    tables: list[int] = []
    events = sorted(
        [(m.start(), 1) for m in _TABLE_OPEN.finditer(text)] + [(m.start(), -1) for m in _TABLE_CLOSE.finditer(text)]
    )
    for a, step in events:
        if hidden.covers(a) or not _at_line_start(text, a):
            continue
        if step > 0:
            tables.append(a)
        elif tables:
            tables.pop()
    starts["table"] = tables
    routes.update({k: (np.asarray(s, np.int64), np.full(len(s), n, np.int64)) for k, s in starts.items()})
    newline, bracket = _Next(text, b"\n"), _Next(text, _LINK_END)
    links = [
        (m.start(), newline(m.end()))
        for m in _LINK.finditer(text)  # its label ends at the line's end
        if bracket(m.end()) >= newline(m.end()) and not hidden.covers(m.start())
    ]  # equal: neither is there
    routes["extlink"] = (np.array([a for a, _ in links], np.int64), np.array([e for _, e in links], np.int64))
    return {k: r for k, r in routes.items() if len(r[0])}


def _marks(text: bytes, kind: str, openers: np.ndarray) -> np.ndarray:
    """Where the marks of one kind are (sorted byte positions): `word`, a non-space after a space (a tag's next
    attribute); `pipe`, `equals`, `colon` (`|`, `=`, `:`; a colon sets the tokenizer looking for a URL scheme);
    `entity`; `tag` and `link` (`{{`, `[[`), less the `openers` never closed (a route that failed once fails at
    once the next time); `line`, a line that starts a list item, heading or table row."""
    raw = np.frombuffer(text, np.uint8)
    if kind == "word":
        space = (raw == 32) | (raw == 9) | (raw == 10) | (raw == 13)
        return np.flatnonzero(space[:-1] & ~space[1:]) + 1
    if kind in ("pipe", "equals", "colon"):
        return np.flatnonzero(raw == ord({"pipe": "|", "equals": "=", "colon": ":"}[kind]))
    if kind == "link":
        found = np.union1d(_doubled(raw, ord("{")), _doubled(raw, ord("[")))
    else:
        pattern = {"entity": _ENTITY, "tag": _TAG, "endtag": _END_TAG, "line": _LINE, "row": _ROW}[kind]
        found = np.array([m.start() for m in pattern.finditer(text)], np.int64)
    return np.setdiff1d(found, openers, assume_unique=True) if kind in ("tag", "link") else found


def markup_cost(wikitext: str) -> int:
    """What the routes that fail may cost the tokenizer, in ns (of the machine `_PRICES` were measured on), in
    linear time: for each route that fails (`_routes`), the bytes it reads again and the marks it meets on the way,
    each at its kind's price.

    >>> markup_cost("A [[link]], {{t|x}} and <ref>r</ref>."), markup_cost("<ref>At the top.\\n" + "Text. " * 1000)
    (0, 94221)
    """
    text = wikitext.encode("utf-8", "surrogatepass")
    routes = _routes(text)
    openers = np.sort(np.concatenate([s for s, _ in routes.values()])) if routes else np.zeros(0, np.int64)
    marks: dict[str, np.ndarray] = {}
    cost = 0.0
    for kind, (starts, ends) in routes.items():
        price = _PRICES[kind]
        cost += price.route * len(starts) + price.byte * int((ends - starts).sum())
        for mark, ns in price.each:
            if mark not in marks:
                marks[mark] = _marks(text, mark, openers)
            at = marks[mark]
            cost += ns * int((np.searchsorted(at, ends) - np.searchsorted(at, starts)).sum())
    return round(cost)


def _at_line_start(text: bytes, a: int) -> bool:
    """Whether only spaces and tabs stand between the line's start and `a` (a table's `{|` and `|}`)."""
    while a > 0 and text[a - 1] in b" \t":
        a -= 1
    return a == 0 or text[a - 1] == ord("\n")


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
    """The failing routes of comments and tags, in one walk over every `<`: an unclosed comment (`comment`); a
    `<name` with no `>` before the next `<` (`attrs`); an opening tag that needs a closing tag and never gets one
    (`body`), an unparsed one's (`opaque`). The contents of comments and unparsed tags are `hidden`."""

    def __init__(self, text: bytes) -> None:
        self.text = text
        self.hidden = _Spans()
        self.open_at: dict[bytes, list[int]] = {}  # tag name -> positions of its unclosed opening tags
        self.gt, self.lt, self.comment_end = _Next(text, b">"), _Next(text, b"<"), _Next(text, b"-->")
        self.closers: dict[bytes, _Next] = {}
        self.found: dict[str, list[int]] = {"comment": [], "attrs": [], "opaque": []}

    def unclosed(self) -> dict[str, list[int]]:
        n, skip = len(self.text), 0
        for m in _ANGLE.finditer(self.text):
            a = m.start()
            if a < skip:
                continue
            if m.group("comment"):
                end = self.comment_end(m.end())
                if end == n:
                    self.found["comment"].append(a)
                else:
                    self.hidden.add(a, end + 3)
                    skip = end + 3
            else:
                skip = self._tag(m, skip)
        return {**self.found, "body": sorted(a for stack in self.open_at.values() for a in stack)}

    def _tag(self, m: re.Match, skip: int) -> int:
        text, n, a, pos = self.text, len(self.text), m.start(), m.end()
        name = m.group("tag").lower()
        end = self.gt(pos)
        if end == n or self.lt(pos) < end:  # the tokenizer reads its attributes to no end
            self.found["attrs"].append(a)
            return skip
        if m.group("slash"):
            if self.open_at.get(name):
                self.open_at[name].pop()
        elif text[end - 1] != ord("/") and name not in _SINGLE:
            if name not in _OPAQUE:
                self.open_at.setdefault(name, []).append(a)
                return skip
            if name not in self.closers:  # its content is text up to its closing tag
                self.closers[name] = _Next(text, re.compile(rb"</" + name + rb"\b", re.IGNORECASE))
            close = self.closers[name](end)
            if close == n:
                self.found["opaque"].append(a)
                return skip
            self.hidden.add(end, close)
            return close
        return skip


def over_budget(wikitext: str) -> bool:
    """Whether converting `wikitext` may cost more than `MARKUP_BUDGET` ns a character (`markup_cost`)."""
    return markup_cost(wikitext) > MARKUP_BUDGET * len(wikitext) + MARKUP_SLACK
