"""What the dedup pass keeps of a document, computed a window at a time: the exact key (blake2b of the normalised
text) and the MinHash signature of its word shingles (pipeline/data/dedup.py says what they are compared for), with
the parameters both take (`DedupParams`: mode, threshold, num_perm, shingle size, the LSH bands of `lsh_bands`).

Memory per document is a constant plus its signature, whatever its length: the text is normalised, shingled and
hashed `window_chars` characters at a time (`windows`), and shingle hashes go to rensa in batches of at most
about `batch_shingles`. No list of all words, all shingles or the whole normalised text is ever built; the text
itself is the caller's (a .txt book is read whole by pipeline/data/sources.py, as for the tokenize pass).

Why the windows give the one-shot values, byte for byte
    words: a window ends just before a whitespace character, so no word is cut; str.casefold maps each character
    on its own and str.split() splits on the same characters whatever the cut, so the windows' words, in order,
    are `normalise(text).split(" ")`.
    exact key: blake2b is updated with each window's words joined by one space, and one space between windows:
    the bytes of `normalise(text)`.
    shingles: the words of consecutive documents are shingled in batches (`_Shingles`, `BATCH_WORDS`: per-call
    costs are paid per batch, not per short article); a document's shingles are those that start in its words and
    end within them, and a document still open when a batch is shingled carries its last shingle_size - 1 words
    into the next batch, so its shingles over all batches are the document's, in order; a document with fewer
    words than shingle_size is still one shingle of all of them (of the empty word when it has none).
    signature: R-MinHash keeps, per slot, the minimum over the shingles of a seeded hash of each; the signature
    of a set is the elementwise minimum of its parts' signatures, and a shingle seen twice changes no minimum.
    A document's shingles in each batch are one row of a rensa call, and its signature the minimum of its rows'.
tests/test_signing.py checks both against the one-shot computation and against values pinned before streaming.

MinHash implementation: rensa's full-set R-MinHash (`RMinHash.digest_matrix_from_flat_token_hashes`, one call
per batch, 32-bit slots), fed our own shingle hashes. Measured by bench/data/dedup_quality.py on the shared corpora
(66 books + 483 wiki documents, 1.44M shingles, num_perm 128): the sketch itself takes ~0.003 s in rensa, ~0.46 s
in a vectorised numpy MinHash (multiply-shift hash functions, `np.minimum.reduceat` per document) and ~1 s in
datasketch 2.0.0 (`update_batch`), so the pass's cost is the normalising and shingle hashing around it. Its
estimates are as close to the true Jaccard as classical MinHash's (RESULTS.md). Word hashes are blake2b (never
Python's salted `hash()`), shingle hashes a polynomial of them finished with splitmix64, and rensa's slots are
seeded by `seed`, so signatures are identical in every process and on every machine, for one rensa algorithm
version (rensa 0.5 is version 2; the dependency is pinned below 0.6: signatures are never stored across runs).

    >>> p = DedupParams(num_perm=16)
    >>> text = "The LORD  said unto Moses, " * 40
    >>> keys, sigs = records([text], p)
    >>> keys2, sigs2 = records([text], p, window_chars=7, batch_shingles=3)   # many windows and rensa calls
    >>> bool((keys == keys2).all()), bool((sigs == sigs2).all()), sigs.shape
    (True, True, (1, 16))
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from rensa import RMinHash

WINDOW_CHARS = 1 << 20
"""Characters of a document normalised and shingled at a time (~180k words: ~15 MB of Python objects)."""
BATCH_SHINGLES = 1 << 21
"""Shingle hashes (8 bytes each) collected, from one document or many, for one rensa call."""
BATCH_WORDS = 1 << 16
"""Words (of many documents, or of one long document's windows) hashed and shingled at a time (`_Shingles`)."""

SHINGLE_MUL = np.uint64(0x9E3779B97F4A7C15)  # odd: the polynomial over word hashes stays a bijection per step
_SPACE = re.compile(r"\s")  # what str.split() splits on: both are Py_UNICODE_ISSPACE (tests/test_signing.py)
_NO_SLOT = np.uint32(0xFFFFFFFF)  # a signature slot before any shingle (above every value rensa gives)


Mode = Literal["off", "exact", "near"]


@functools.lru_cache(maxsize=64)  # ~40 ms a call, and every DedupParams asks
def lsh_bands(threshold: float, num_perm: int, fn_weight: float = 0.9) -> tuple[int, int]:
    """(bands, rows) with bands * rows <= num_perm minimising the weighted areas under the LSH S-curve
    P(candidate | J) = 1 - (1 - J**rows)**bands: false positives (J < threshold) weighted 1 - fn_weight, false
    negatives (J >= threshold) weighted fn_weight. datasketch's `_optimal_param` with weights 0.5/0.5; here false
    negatives weigh more because every candidate is verified with the signatures, so a false positive costs one
    comparison while a false negative is a missed duplicate (measured in bench/data/dedup_quality.py).

    >>> lsh_bands(0.8, 128), lsh_bands(0.8, 128, fn_weight=0.5)
    ((14, 9), (9, 13))
    """
    j = np.linspace(0.0, 1.0, 2001)
    below, above = j < threshold, j >= threshold
    best, best_err = (1, 1), float("inf")
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            p = 1.0 - (1.0 - j**r) ** b
            fp = np.trapezoid(p[below], j[below]) if below.sum() > 1 else 0.0
            fn = np.trapezoid(1.0 - p[above], j[above]) if above.sum() > 1 else 0.0
            err = (1.0 - fn_weight) * fp + fn_weight * fn
            if err < best_err - 1e-12:
                best, best_err = (b, r), err
    return best


@dataclass(frozen=True)
class DedupParams:
    """How duplicates are found. Field errors name the config field they come from (`data.dedup_*`)."""

    mode: Mode = "near"
    """off: keep everything; exact: normalised-text hash only; near: exact, then MinHash + LSH."""
    threshold: float = 0.8
    """Estimated Jaccard of the word-shingle sets at or above which a later document is dropped."""
    num_perm: int = 128
    """MinHash values per document: estimate error ~ sqrt(J(1-J)/num_perm) (0.035 at J 0.8)."""
    shingle_size: int = 5
    """Words per shingle."""
    seed: int = 0
    """Seeds the MinHash hash functions; signatures only compare within one seed."""
    max_leaders: int = 32
    """Per LSH group, at most this many mutually dissimilar earliest members are compared with each member."""
    bands: int = field(default=0)
    """LSH bands; 0 = chosen by `lsh_bands(threshold, num_perm)`."""
    rows: int = field(default=0)
    """Signature values per band; 0 = chosen with `bands`."""

    def __post_init__(self) -> None:
        if self.mode not in ("off", "exact", "near"):
            raise ValueError(f"data.dedup {self.mode!r} is not one of off, exact, near")
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"data.dedup_threshold {self.threshold} is not in (0, 1]")
        if not 16 <= self.num_perm <= 1024:
            raise ValueError(f"data.dedup_num_perm {self.num_perm} is not in [16, 1024]")
        if self.shingle_size < 1:
            raise ValueError(f"data.dedup_shingle_size {self.shingle_size} is not >= 1")
        if self.max_leaders < 1:
            raise ValueError(f"data.dedup_max_leaders {self.max_leaders} is not >= 1")
        if (self.bands == 0) != (self.rows == 0):
            raise ValueError(f"data.dedup_bands {self.bands} and data.dedup_rows {self.rows}: give both or neither")
        if self.bands == 0:
            b, r = lsh_bands(self.threshold, self.num_perm)
            object.__setattr__(self, "bands", b)
            object.__setattr__(self, "rows", r)
        elif self.bands < 1 or self.rows < 1 or self.bands * self.rows > self.num_perm:
            raise ValueError(
                f"data.dedup_bands {self.bands} x data.dedup_rows {self.rows} must be >= 1 and fit in "
                f"data.dedup_num_perm {self.num_perm}"
            )


def normalise(text: str) -> str:
    """Case-folded, whitespace runs collapsed to one space, stripped: the text both dedup kinds compare.

    >>> normalise("Straße\\u00a0 IS\\r\\nhere")
    'strasse is here'
    """
    return " ".join(text.casefold().split())  # str.split() splits on runs of Unicode whitespace, as \\s+ does


def windows(text: str, window_chars: int = WINDOW_CHARS) -> Iterator[list[str]]:
    """The words of `normalise(text)`, about `window_chars` characters of text at a time; a window ends just
    before a whitespace character (or at the end), so it never cuts a word. A window may have no word.

    >>> list(windows("The  LORD\\nsaid unto", 5))
    [['the', 'lord'], ['said'], ['unto']]
    """
    a, n = 0, len(text)
    while a < n:
        b = a + window_chars
        if b < n:
            space = _SPACE.search(text, b)
            b = space.start() if space else n
        yield text[a:b].casefold().split()
        a = b


def splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


_WORD_HASHES: dict[str, int] = {}  # word -> its 8-byte blake2b, across documents (a corpus repeats its words)
_WORD_CACHE_MAX = 500_000


def _word_hashes(words: list[str]) -> np.ndarray:
    """(len(words),) uint64: each word's 8-byte blake2b, little-endian."""
    table = _WORD_HASHES
    new = set(words).difference(table)  # a word's hash is its own: the order they are added in does not matter
    if len(table) + len(new) > _WORD_CACHE_MAX:
        table.clear()
        new = set(words)
    digests = b"".join(hashlib.blake2b(w.encode("utf-8"), digest_size=8).digest() for w in new)
    table.update(zip(new, np.frombuffer(digests, dtype="<u8").tolist()))  # a set unchanged iterates in one order
    return np.fromiter(map(table.__getitem__, words), np.uint64, len(words))


def _poly_shingles(w: np.ndarray, k: int) -> np.ndarray:
    """The len(w) - k + 1 hashes of the k-word runs of word hashes `w` (len(w) >= k >= 1)."""
    m = len(w) - k + 1
    acc = w[:m].copy()
    with np.errstate(over="ignore"):
        for i in range(1, k):
            acc = acc * SHINGLE_MUL + w[i : m + i]
        return splitmix(acc + np.uint64(k))  # k mixed in: a 2-word text is not a 5-gram


def shingle_hashes(text: str, shingle_size: int = 5) -> np.ndarray:
    """uint64 hashes of the word `shingle_size`-grams of `normalise(text)` (one shingle of all words when shorter),
    all at once: for a document that fits in memory several times over (tests, bench/data/dedup_quality.py).

    >>> len(shingle_hashes("a b c d e f", 5)), len(shingle_hashes("a b", 5)), len(shingle_hashes("", 5))
    (2, 1, 1)
    >>> bool((shingle_hashes("A  B c d e") == shingle_hashes("a b c d e")).all())
    True
    """
    w = _word_hashes(normalise(text).split(" "))
    return _poly_shingles(w, min(shingle_size, len(w)))


class _Shingles:
    """Documents' shingle hashes from their words, many documents at a time: the words of consecutive documents (a
    long one's windows one after another) are collected up to `batch` words, then hashed and shingled over the
    whole batch at once (`flush`), and each document's shingles (those starting in its words and ending within
    them) go to `minhashes` as its rows. numpy's and the word cache's per-call costs are paid per batch, not per
    document: most articles are a few hundred words, where they cost more than the hashing itself. A document
    still open at a flush carries its last k - 1 words into the next batch, whose shingles then start where the
    flushed ones stopped; a document with fewer than k words in all gets the one shingle of all of them (of the
    empty word when it has none). Together, each document's hashes are `shingle_hashes` of its whole text."""

    def __init__(self, shingle_size: int, minhashes: _MinHashes, batch: int) -> None:
        self.k, self.minhashes, self.batch = shingle_size, minhashes, batch
        self.words: list[str] = []
        self.docs: list[int] = []  # the batch's documents, in order ...
        self.starts: list[int] = []  # ... and where each one's words start in `words`
        self.ended = False  # whether the batch's last document has ended
        self.full = False  # whether the batch's first document made a shingle of k words in an earlier batch

    def _open(self, doc: int) -> None:
        if not self.docs or self.docs[-1] != doc:
            self.docs.append(doc)
            self.starts.append(len(self.words))
            self.ended = False

    def add(self, doc: int, words: list[str]) -> None:
        self._open(doc)
        self.words += words
        if len(self.words) >= self.batch:
            self.flush()

    def end(self, doc: int) -> None:
        self._open(doc)  # a document without words has its place too
        self.ended = True

    def flush(self) -> None:
        k, n = self.k, len(self.words)
        hashes = _word_hashes(self.words)
        every = _poly_shingles(hashes, k) if n >= k else hashes[:0]  # every[j]: the shingle of words j .. j+k-1
        last = len(self.docs) - 1
        full = False
        for i, (doc, a, b) in enumerate(zip(self.docs, self.starts, [*self.starts[1:], n])):
            full = (i == 0 and self.full) or b - a >= k
            if b - a >= k:
                self.minhashes.add(doc, every[a : b - k + 1])
            elif not full and (i < last or self.ended):  # fewer than k words in all
                w = hashes[a:b] if b > a else _word_hashes([""])
                self.minhashes.add(doc, _poly_shingles(w, len(w)))
        if self.ended or not self.docs:
            self.words, self.docs, self.starts, self.full = [], [], [], False
        else:  # the last document goes on in the next batch, after its last k - 1 words
            self.words = self.words[max(self.starts[last], n - (k - 1)) :]
            self.docs, self.starts, self.full = [self.docs[last]], [0], full


def signatures_of_shingles(shingles: Sequence[np.ndarray], params: DedupParams) -> np.ndarray:
    """(n, num_perm) uint32 MinHash (rensa's full-set R-MinHash) of each row of shingle hashes (each non-empty).

    One call for the whole batch: the hashes go to rensa as one flat uint64 buffer with row offsets.
    """
    if len(shingles) == 0:
        return np.zeros((0, params.num_perm), dtype=np.uint32)
    flat = np.ascontiguousarray(np.concatenate(shingles), dtype=np.uint64)
    offsets = np.zeros(len(shingles) + 1, dtype=np.uint64)
    np.cumsum([len(x) for x in shingles], out=offsets[1:])
    matrix = RMinHash.digest_matrix_from_flat_token_hashes(flat, offsets, params.num_perm, params.seed)
    return np.array(matrix.to_rows(), dtype=np.uint32).reshape(len(shingles), params.num_perm)


class _MinHashes:
    """Documents' signatures as their shingle hashes come, in document order: rows of hashes are collected up
    to `batch` hashes, then signed in one rensa call; a document's signature is the elementwise minimum of its
    rows' (one row per window, so a long document spans several rows and calls)."""

    def __init__(self, params: DedupParams, batch: int) -> None:
        self.params, self.batch = params, batch
        self.sigs = np.full((0, params.num_perm), _NO_SLOT, np.uint32)  # grown by doubling, 4 * num_perm B a row
        self.rows: list[np.ndarray] = []
        self.owners: list[int] = []  # each row's document
        self.pending = 0

    def add(self, doc: int, hashes: np.ndarray) -> None:
        if len(hashes):
            self.rows.append(hashes)
            self.owners.append(doc)
            self.pending += len(hashes)
            if self.pending >= self.batch:
                self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        n = self.owners[-1] + 1
        if n > len(self.sigs):
            grown = np.full((max(n, 2 * len(self.sigs)), self.params.num_perm), _NO_SLOT, np.uint32)
            grown[: len(self.sigs)] = self.sigs
            self.sigs = grown
        np.minimum.at(self.sigs, np.asarray(self.owners), signatures_of_shingles(self.rows, self.params))
        self.rows, self.owners, self.pending = [], [], 0

    def finish(self, n: int) -> np.ndarray:
        self.flush()
        return self.sigs[:n].copy()


def _sign(
    texts: Iterable[str],
    params: DedupParams | None,
    window_chars: int,
    batch_shingles: int,
    batch_words: int = BATCH_WORDS,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(exact keys, signatures or None when `params` is None) of `texts`, each read once, a window at a time."""
    keys: list[bytes] = []
    shingles = (
        None if params is None else _Shingles(params.shingle_size, _MinHashes(params, batch_shingles), batch_words)
    )
    for text in texts:  # not enumerate(): its cached result tuple would hold the text while the next is read
        doc = len(keys)
        key = hashlib.blake2b(digest_size=16)
        space = b""  # the one space between two windows' words in the normalised text
        for words in windows(text, window_chars):
            if not words:
                continue
            key.update(space)
            key.update(" ".join(words).encode("utf-8"))
            space = b" "
            if shingles is not None:
                shingles.add(doc, words)
        if shingles is not None:
            shingles.end(doc)
        keys.append(key.digest())
        del text  # not held while the next document is read
    exact = np.frombuffer(b"".join(keys), dtype="<u8").reshape(-1, 2).copy()
    if shingles is None:
        return exact, None
    shingles.flush()
    return exact, shingles.minhashes.finish(len(keys))


def exact_keys(texts: Iterable[str], window_chars: int = WINDOW_CHARS) -> np.ndarray:
    """(n, 2) uint64: the 16-byte blake2b of each normalised text, as two words (two Arrow columns, no bytes).

    >>> k = exact_keys(["A  b", "a b", "a c"])
    >>> bool((k[0] == k[1]).all()), bool((k[0] == k[2]).all())
    (True, False)
    """
    return _sign(texts, None, window_chars, BATCH_SHINGLES)[0]


def signatures(
    texts: Iterable[str],
    params: DedupParams,
    window_chars: int = WINDOW_CHARS,
    batch_shingles: int = BATCH_SHINGLES,
    batch_words: int = BATCH_WORDS,
) -> np.ndarray:
    """(n, num_perm) uint32 MinHash signatures of the texts' word shingles; the same on every machine.

    >>> from pipeline.data.dedup import DedupParams, similarity
    >>> s = signatures(["a b c d e f g", "A B C D E F G", "x y z"], DedupParams(num_perm=16))
    >>> bool((s[0] == s[1]).all()), float(similarity(s[0], s[2]))
    (True, 0.0)
    """
    sigs = _sign(texts, params, window_chars, batch_shingles, batch_words)[1]
    assert sigs is not None
    return sigs


def records(
    texts: Iterable[str],
    params: DedupParams,
    window_chars: int = WINDOW_CHARS,
    batch_shingles: int = BATCH_SHINGLES,
    batch_words: int = BATCH_WORDS,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(exact_keys(texts), signatures(texts, params) or None when params.mode is not near), each text read once:
    what the dedup pass keeps of a unit's documents. `texts` may be a generator: a text is not held after it is
    signed, and memory is a window or a batch of words, and a batch of hashes, plus 16 + 4 * num_perm bytes a
    document."""
    return _sign(texts, params if params.mode == "near" else None, window_chars, batch_shingles, batch_words)
