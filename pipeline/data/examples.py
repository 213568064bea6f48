"""Sentence splitting, next-sentence pairs (Google's `create_instances_from_document`) and MLM-only packing.

Pure functions over token-id arrays; Ray only wraps them (pipeline/shards.py). Departures from Google's
`create_pretraining_data.py`, and why:

- Sentences come from a measured regex splitter (`split_sentences`, ~40M chars/s here), not NLTK: the corpus is
  tokenized faster than a model-based splitter runs, and the throughput goal decides.
- The random-next document is drawn from a `RandomPool`: a deterministic, bounded sample of sentence windows
  from the whole corpus (bottom-k by hash of (seed, doc_id, window)), so B comes from any document, not a
  neighbour, without holding the corpus in memory. Google holds every document in memory instead.
- Randomness derives from (seed, doc_id, dupe) (`derive_seed`), so the output does not depend on which worker
  handles which document.
- `truncate_seq_pair` works on index windows, drawing the same coin flips as Google's list version.
- A chunk of one sentence is not forced to a random B (Google's does that, which pushes the random fraction
  above 50% on text with long sentences): the coin decides, and an IsNext lone sentence is cut in two.
- Long documents are cut into pieces (`split_document`, at most `data.max_document_chars` characters, 1M by
  default) before tokenization, so memory is bounded per piece, not per document (a .txt book is one
  document). Cuts fall after a blank line (paragraph) where the second half of the window has one, else after a
  sentence end, else after whitespace; the pieces together are the whole text. Each piece is a document of its
  own (`piece_id`; the first piece keeps the document's id, so documents under the bound are unchanged). Google's
  pair semantics hold inside each piece. What changes at a boundary: the last sentence of a piece never gets
  the piece's following sentence as an IsNext B (one lost pair per ~1M characters), a random B may come from
  another piece of the same document (still not the next segment), and with a whitespace cut (a paragraph
  without a sentence end over half a million characters) one sentence is split in two.

    >>> split_sentences("It rained. Then it stopped! ok")
    ['It rained.', 'Then it stopped! ok']
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from pipeline.config import DataConfig

# A sentence ends at . ! ? (plus closing quotes/brackets) followed by space and an upper-case letter, digit or
# opening quote. Abbreviations ("Mr. Smith") split too; acceptable for BERT pairs, and 100x faster than a model.
_SENT_END = re.compile(r"([.!?][\"'\u201d\u2019)\]]*)\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")
_PARA = re.compile(r"\n\s*\n")
_WS = re.compile(r"\s+")


def split_sentences(text: str) -> list[str]:
    """Paragraphs split on blank lines, sentences on end punctuation; single newlines are spaces.

    >>> split_sentences("A b. C d.\\n\\nNew para\\nwrapped.")
    ['A b.', 'C d.', 'New para wrapped.']
    """
    out: list[str] = []
    for para in _PARA.split(text):
        para = _WS.sub(" ", para).strip()
        if para:
            # the end punctuation and closing quotes stay with their sentence; \n marks the cut
            out.extend(s for s in _SENT_END.sub("\\1\n", para).split("\n") if s)
    return out


def split_document(text: str, max_chars: int) -> Iterator[str]:
    """Contiguous pieces of at most `max_chars` characters that together are `text`, cut after a paragraph
    break in the second half of each window, else after a sentence end, else after whitespace, else hard.

    >>> list(split_document("One. Two.\\n\\nThree four. Five six.", 16))
    ['One. Two.\\n\\n', 'Three four. ', 'Five six.']
    """
    a, n = 0, len(text)
    while n - a > max_chars:
        window = text[a : a + max_chars]
        half = max_chars // 2
        cut = 0
        for pattern in (_PARA, _SENT_END, _WS):
            last = None
            for last in pattern.finditer(window, half):
                pass
            if last is not None and last.end() < len(window):
                cut = last.end()
                break
        cut = cut or max_chars
        yield text[a : a + cut]
        a += cut
    yield text[a:]


def piece_id(doc_id: int, k: int) -> int:
    """The document id of piece `k` of document `doc_id`: the document's own for the first piece, else a 62-bit
    hash with bit 62 set (source ids are `file index << 32 | record`, below 2**62).

    >>> piece_id(5, 0), piece_id(5, 1) >= 2**62, piece_id(5, 1) != piece_id(5, 2)
    (5, True, True)
    """
    return doc_id if k == 0 else (1 << 62) | (derive_seed("piece", doc_id, k) >> 1)


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from identities, independent of process, worker or Python's hash randomisation.

    >>> derive_seed(1, "nsp", 7) == derive_seed(1, "nsp", 7) != derive_seed(1, "nsp", 8)
    True
    """
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & (2**63 - 1)


@dataclass(frozen=True)
class Instance:
    """One example before masking: `[CLS] A [SEP] B [SEP]` ids, token types and the NSP label."""

    input_ids: np.ndarray  # (L,) int32
    token_type_ids: np.ndarray  # (L,) int8
    next_sentence_label: int  # 0 = B follows A, 1 = B is random, -1 = no NSP (MLM-only packing)


@dataclass
class RandomPool:
    """Sentence windows from many documents, the source of random-next segments.

    `tokens` holds all windows' sentences back to back; `sent_ends[j]` is the end offset of sentence j in
    `tokens`; window w covers sentences `win_starts[w]:win_starts[w + 1]` and comes from `doc_ids[w]`.
    """

    doc_ids: np.ndarray  # (P,) int64
    win_starts: np.ndarray  # (P + 1,) int64 into sent_ends
    sent_ends: np.ndarray  # (S,) int64 into tokens
    tokens: np.ndarray  # (T,) int32

    def __len__(self) -> int:
        return len(self.doc_ids)

    @classmethod
    def from_windows(cls, windows: list[tuple[int, list[np.ndarray]]]) -> RandomPool:
        """`[(doc_id, [sentence ids, ...]), ...]` -> pool."""
        doc_ids = np.array([d for d, _ in windows], dtype=np.int64)
        counts = [len(s) for _, s in windows]
        win_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        sents = [s for _, ss in windows for s in ss]
        lens = np.array([len(s) for s in sents], dtype=np.int64)
        tokens = np.concatenate(sents).astype(np.int32) if sents else np.zeros(0, np.int32)
        return cls(doc_ids, win_starts, np.cumsum(lens).astype(np.int64), tokens)

    def sentences(self, w: int) -> list[np.ndarray]:
        starts = self.__dict__.get("_starts")
        if starts is None:  # sentence start offsets, computed once per pool
            starts = self.__dict__["_starts"] = np.concatenate([[0], self.sent_ends]).astype(np.int64)
        a, b = int(self.win_starts[w]), int(self.win_starts[w + 1])
        return [self.tokens[starts[j] : starts[j + 1]] for j in range(a, b)]

    def pick_other(self, doc_id: int, rng: random.Random) -> int | None:
        """Google's "10 tries for a different document", then a deterministic scan; None if none exists."""
        n = len(self)
        if n == 0:
            return None
        w = 0
        for _ in range(10):
            w = rng.randint(0, n - 1)
            if self.doc_ids[w] != doc_id:
                return w
        others = np.flatnonzero(self.doc_ids != doc_id)
        if len(others) == 0:
            return None
        return int(others[np.searchsorted(others, w) % len(others)])


def target_length(room: int, short_seq_prob: float, rng: random.Random) -> int:
    """Google's target length: the full `room`, or with probability `short_seq_prob` a uniform 2..room, so the
    model also sees short inputs. One `rng.random()` draw, plus one `randint` when short (order matters for
    byte-identical output)."""
    if rng.random() < short_seq_prob:
        return rng.randint(2, room)
    return room


def group_consecutive(sizes: list[int], target: int) -> list[list[int]]:
    """Indices grouped in order, each group closed once its total reaches `target` (the last may fall short).

    >>> group_consecutive([5, 1, 1, 9, 2], 6)
    [[0, 1], [2, 3], [4]]
    """
    groups: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for i, n in enumerate(sizes):
        cur.append(i)
        total += n
        if total >= target:
            groups.append(cur)
            cur, total = [], 0
    if cur:
        groups.append(cur)
    return groups


def document_windows(sentences: list[np.ndarray], window_tokens: int) -> list[list[np.ndarray]]:
    """Consecutive sentences grouped until each group has >= `window_tokens` tokens (last may be shorter).

    >>> [len(w) for w in document_windows([np.ones(3), np.ones(3), np.ones(5), np.ones(1)], 5)]
    [2, 1, 1]
    """
    groups = group_consecutive([len(s) for s in sentences], window_tokens)
    return [[sentences[i] for i in g] for g in groups]


def truncate_seq_pair(len_a: int, len_b: int, max_num_tokens: int, rng: random.Random) -> tuple[int, int, int, int]:
    """Google's `truncate_seq_pair` on index windows: returns (a_start, a_end, b_start, b_end).

    Trims the longer segment one token at a time, from the front or the back at random.

    >>> truncate_seq_pair(3, 2, 10, random.Random(0))
    (0, 3, 0, 2)
    """
    a0, a1, b0, b1 = 0, len_a, 0, len_b
    while (a1 - a0) + (b1 - b0) > max_num_tokens:
        trunc_a = (a1 - a0) > (b1 - b0)
        front = rng.random() < 0.5
        if trunc_a:
            a0, a1 = (a0 + 1, a1) if front else (a0, a1 - 1)
        else:
            b0, b1 = (b0 + 1, b1) if front else (b0, b1 - 1)
    return a0, a1, b0, b1


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int32, copy=False) if parts else np.zeros(0, np.int32)


def make_pair(
    tokens_a: np.ndarray, tokens_b: np.ndarray, cls_id: int, sep_id: int, label: int, middle: int = 1
) -> Instance:
    """`[CLS] A [SEP] B [SEP]` with token types 0 then 1; `middle` 2 puts two separators between A and B, as the
    tokenizer's template does (RoBERTa's `<s> A </s></s> B </s>`, the second of type 1).

    >>> make_pair(np.array([5, 6]), np.array([7]), 101, 102, 0).input_ids.tolist()
    [101, 5, 6, 102, 7, 102]
    >>> make_pair(np.array([5, 6]), np.array([7]), 0, 2, 0, middle=2).input_ids.tolist()
    [0, 5, 6, 2, 2, 7, 2]
    """
    la, lb = len(tokens_a), len(tokens_b)
    n = la + lb + 2 + middle
    ids = np.empty(n, dtype=np.int32)
    ids[0] = cls_id
    ids[1 : la + 1] = tokens_a
    ids[la + 1 : la + 1 + middle] = sep_id
    ids[la + 1 + middle : n - 1] = tokens_b
    ids[-1] = sep_id
    types = np.zeros(n, dtype=np.int8)
    types[la + 2 :] = 1
    return Instance(ids, types, label)


def create_instances_from_document(
    sentences: list[np.ndarray],
    doc_id: int,
    pool: RandomPool,
    *,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    cls_id: int,
    sep_id: int,
    middle: int = 1,
) -> list[Instance]:
    """Google's next-sentence pair algorithm over one document's tokenized sentences.

    A target length (shorter with `short_seq_prob`) is fixed per document; sentences accumulate until it is
    reached; A is a random prefix of whole sentences; B is the rest (label 0) or, half the time, a random
    segment of another document (label 1) and the unused sentences are put back.
    """
    max_num_tokens = max_seq_length - 2 - middle  # the template's special tokens
    target_seq_length = target_length(max_num_tokens, short_seq_prob, rng)
    instances: list[Instance] = []
    chunk: list[np.ndarray] = []
    length = 0
    i = 0
    n = len(sentences)
    while i < n:
        chunk.append(sentences[i])
        length += len(sentences[i])
        if i == n - 1 or length >= target_seq_length:
            a_end = 1
            if len(chunk) >= 2:
                a_end = rng.randint(1, len(chunk) - 1)
            tokens_a = _cat(chunk[:a_end])
            label = 0
            w = None
            # Departure: Google forces a random B whenever the chunk is one sentence, which pushes the random
            # fraction above 50% on text with long sentences; here the coin decides and a lone sentence that
            # gets "IsNext" is cut at a random token instead (A and B are still consecutive text).
            if rng.random() < 0.5 or (len(chunk) == 1 and len(chunk[0]) < 2):
                w = pool.pick_other(doc_id, rng)
            if w is not None:
                label = 1
                target_b_length = target_seq_length - len(tokens_a)
                random_doc = pool.sentences(w)
                start = rng.randint(0, len(random_doc) - 1)
                parts: list[np.ndarray] = []
                got = 0
                for j in range(start, len(random_doc)):
                    parts.append(random_doc[j])
                    got += len(random_doc[j])
                    if got >= target_b_length:
                        break
                tokens_b = _cat(parts)
                i -= len(chunk) - a_end  # put the unused sentences back
            elif len(chunk) >= 2:
                tokens_b = _cat(chunk[a_end:])
            elif len(tokens_a) >= 2:
                cut = rng.randint(1, len(tokens_a) - 1)
                tokens_a, tokens_b = tokens_a[:cut], tokens_a[cut:]
            else:
                tokens_b = np.zeros(0, np.int32)  # a one-token document and no other document: no pair
            if len(tokens_a) >= 1 and len(tokens_b) >= 1:
                a0, a1, b0, b1 = truncate_seq_pair(len(tokens_a), len(tokens_b), max_num_tokens, rng)
                instances.append(make_pair(tokens_a[a0:a1], tokens_b[b0:b1], cls_id, sep_id, label, middle))
            chunk, length = [], 0
        i += 1
    return instances


def pack_sentences(
    sentences: list[np.ndarray],
    *,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
    cls_id: int,
    sep_id: int,
) -> list[Instance]:
    """MLM-only packing: whole sentences back to back in `[CLS] ... [SEP]` up to the length, no NSP (label -1).

    A sentence longer than the room is cut into pieces. Token types are all 0.

    >>> [x.input_ids.tolist() for x in pack_sentences([np.array([5, 6]), np.array([7, 8, 9])],
    ...     max_seq_length=6, short_seq_prob=0.0, rng=random.Random(0), cls_id=1, sep_id=2)]
    [[1, 5, 6, 2], [1, 7, 8, 9, 2]]
    """
    room = max_seq_length - 2
    target = target_length(room, short_seq_prob, rng)
    out: list[Instance] = []
    cur: list[np.ndarray] = []
    n = 0

    def flush() -> None:
        body = _cat(cur)
        ids = np.concatenate([[cls_id], body, [sep_id]]).astype(np.int32)
        out.append(Instance(ids, np.zeros(len(ids), np.int8), -1))

    for s in sentences:
        for k in range(0, max(len(s), 1), room):
            piece = s[k : k + room]
            if len(piece) == 0:
                continue
            if cur and n + len(piece) > target:
                flush()
                cur, n = [], 0
            cur.append(piece)
            n += len(piece)
    if cur:
        flush()
    return out


MIN_PIECE = 16
"""Packing by document: a document's cut piece shorter than this does not start at the end of a row (next row)."""


def pack_documents(
    docs: list[list[np.ndarray]], max_seq_length: int, cls_id: int, sep_id: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """ModernBERT's packing: documents (lists of sentences) back to back in rows of `max_seq_length`, each piece
    `[CLS] ... [SEP]`; a document that does not fit the rest of a row is cut there and goes on in the next (unless
    the cut piece would be under MIN_PIECE tokens: the row ends instead). Returns each row's ids and its pieces'
    lengths (the `doc_lengths` shard column, summing to the row's length), so a model can keep them apart.

    >>> [(r.tolist(), d.tolist()) for r, d in pack_documents([[np.array([5, 6])], [np.array([7, 8, 9])]],
    ...                                                      max_seq_length=7, cls_id=1, sep_id=2)]
    [([1, 5, 6, 2], [4]), ([1, 7, 8, 9, 2], [5])]
    >>> [d.tolist() for _, d in pack_documents([[np.array([5])], [np.arange(10, 30)]], max_seq_length=24, cls_id=1,
    ...                                        sep_id=2)]
    [[3, 21], [3]]
    """
    rows: list[tuple[np.ndarray, np.ndarray]] = []
    cur: list[np.ndarray] = []
    n = 0

    def flush() -> None:
        nonlocal cur, n
        if cur:
            rows.append((_cat(cur), np.array([len(x) for x in cur], np.int32)))
        cur, n = [], 0

    for sents in docs:
        toks = _cat(sents)
        while len(toks):
            room = max_seq_length - n - 2  # tokens of this document the row still takes, besides [CLS] and [SEP]
            if room < 1 or (room < len(toks) and room < MIN_PIECE and cur):
                flush()
                continue
            piece, toks = toks[:room], toks[room:]
            cur.append(np.concatenate([[cls_id], piece, [sep_id]]).astype(np.int32))
            n += len(piece) + 2
    flush()
    return rows


def unit_rows(
    docs: list[tuple[int, list[np.ndarray]]],
    pool: RandomPool,
    cfg: DataConfig,
    cls_id: int,
    sep_id: int,
    unit: str,
    middle: int = 1,
) -> tuple[list, list, list, list, list]:
    """A unit's unmasked rows: input ids, token types, NSP labels, example ids and documents' lengths (empty: the
    row is one document). NSP pairs or MLM-only packs per document with an RNG from (seed, doc_id, dupe); with
    `data.pack_documents` the documents back to back in full rows instead (`pack_documents`)."""
    dupes = cfg.dupe_factor if cfg.masking == "static" else 1
    ids: list[np.ndarray] = []
    types, nsp, ex_ids, doc_lens = [], [], [], []
    for dupe in range(dupes):  # dupe-major, as Google: copies of one document are not adjacent
        pieces: list[list[np.ndarray]] = []  # packing by document: each document's sentences
        for doc_id, sents in docs:
            if cfg.pack_documents:  # the documents go on across rows (pack_documents)
                pieces.append(sents)
                continue
            rng = random.Random(derive_seed(cfg.seed, "pairs", doc_id, dupe))
            if cfg.nsp:
                insts = create_instances_from_document(
                    sents,
                    doc_id,
                    pool,
                    max_seq_length=cfg.max_seq_length,
                    short_seq_prob=cfg.short_seq_prob,
                    rng=rng,
                    cls_id=cls_id,
                    sep_id=sep_id,
                    middle=middle,
                )
            else:
                insts = pack_sentences(
                    sents,
                    max_seq_length=cfg.max_seq_length,
                    short_seq_prob=cfg.short_seq_prob,
                    rng=rng,
                    cls_id=cls_id,
                    sep_id=sep_id,
                )
            for k, inst in enumerate(insts):
                ids.append(inst.input_ids)
                types.append(inst.token_type_ids)
                nsp.append(inst.next_sentence_label)
                ex_ids.append(derive_seed(cfg.seed, "example", doc_id, dupe, k))
                doc_lens.append(np.zeros(0, np.int32))
        for k, (row, lens) in enumerate(pack_documents(pieces, cfg.max_seq_length, cls_id, sep_id)):
            ids.append(row)
            types.append(np.zeros(len(row), np.int8))
            nsp.append(-1)
            ex_ids.append(derive_seed(cfg.seed, "packed-example", unit, dupe, k))
            doc_lens.append(lens)
    return ids, types, nsp, ex_ids, doc_lens
