"""The WordPiece tokenizer: load an existing vocabulary or train one with `tokenizers`, and save the pair
(`vocab.txt`, `tokenizer.json`) that was used beside the shards.

Encoding always happens without special tokens, truncation or padding: the example builder adds [CLS]/[SEP]
itself and a tokenizer.json that ships with `truncation: 128` (as many do) must not cut sentences silently.

A trained vocabulary is a pure function of (texts, vocab_size, lowercase). `tokenizers`' WordPieceTrainer is
not (huggingface/tokenizers#1794): it gives the `##c` continuation pieces their ids in hash-map order while it
reads the word counts, and merges of equal count are then tied by those ids. `train_wordpiece` therefore finds
the continuation characters itself and hands them to the trainer up front, in sorted order, so every id the
trainer compares is fixed before it starts; the vocabulary is then rebuilt in a canonical order (special tokens,
characters, `##` characters, merges in the order they were made).

    >>> tok = train_wordpiece(["the cat sat on the mat"] * 10, vocab_size=128, lowercase=True)
    >>> tok.encode("The cat", add_special_tokens=False).tokens
    ['the', 'cat']
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import string
import unicodedata
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from pipeline.data.specials import SPECIAL_TOKENS, VocabError, set_pair_template, adopt
from pipeline.storage.io import read_bytes


def _bert_pipeline(tok: Tokenizer, lowercase: bool) -> Tokenizer:
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None if lowercase else False, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def load_tokenizer(path: str | Path, lowercase: bool | None = None) -> Tokenizer:
    """A `tokenizer.json`, a `vocab.txt` (BERT WordPiece), or a checkpoint directory holding either
    (tokenizer.json first): the one loader, for data preparation and fine-tuning. Any tokenizers tokenizer.json
    (WordPiece, BPE, Unigram) with its own special tokens; `adopt` finds them (VocabError when it has no way to
    mask) and gives a mask made from an unused token its place.

    `lowercase` decides cased/uncased for a vocab.txt; left None, it is the `do_lower_case` of a
    `tokenizer_config.json` beside the file (transformers' own), else True.
    """
    p = Path(path)
    if p.is_dir():
        found = [p / n for n in ("tokenizer.json", "vocab.txt") if (p / n).is_file()]
        if not found:
            raise VocabError(f"tokenizer directory {path} has no tokenizer.json or vocab.txt")
        p = found[0]
    if not p.is_file():
        raise VocabError(f"vocabulary {path} does not exist")
    if p.suffix == ".json":
        try:
            tok = Tokenizer.from_file(str(p))
        except Exception as e:  # tokenizers raises plain Exception subclasses with long messages
            raise VocabError(f"vocabulary {path} is not a tokenizers tokenizer.json: {str(e)[:200]}") from None
    else:
        try:
            vocab = read_vocab(p)
        except UnicodeDecodeError:
            raise VocabError(f"vocabulary {path} is not UTF-8 text") from None
        if lowercase is None:
            config = p.parent / "tokenizer_config.json"
            lowercase = bool(json.loads(config.read_text()).get("do_lower_case", True)) if config.is_file() else True
        tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
        _bert_pipeline(tok, lowercase)
    if p.suffix != ".json" and tok.token_to_id("[CLS]") is not None and tok.token_to_id("[SEP]") is not None:
        set_pair_template(tok)
    adopt(tok, f"vocabulary {path}")
    try:  # a model of another kind, or tokens vocab.txt cannot list: named now, not in the middle of the job
        tokenizer_kind(tok)
        vocab_list(tok)
    except VocabError as e:
        raise VocabError(f"vocabulary {path}: {e}") from None
    tok.no_truncation()
    tok.no_padding()
    return tok


class SentenceEncoder:
    """Token ids of many sentences at once, as `encode_batch_fast(..., add_special_tokens=False)` gives them,
    about 4x cheaper on ASCII text.

    BERT's normalizer and pre-tokenizer cut text into words that WordPiece encodes one at a time, so a word's
    ids never depend on its neighbours. For an ASCII sentence the cut is a regex: control characters
    dropped, letters and digits form words, every other printable character is a word of its own, [ \\t\\r]
    separate (and upper case is lowered when the normalizer lowercases). Each distinct word is encoded once by
    the tokenizer itself (the cache) and the ids are gathered with numpy. Everything the regex does not cover
    goes to the tokenizer as before: sentences with non-ASCII characters, a newline, or an added token's text
    (an added token is matched before normalization), and every sentence of a tokenizer that is not BERT's
    `BertNormalizer(clean_text) + BertPreTokenizer + WordPiece`. tests/test_tokenizer.py holds the two equal
    over the shared corpora and over adversarial strings.

    >>> tok = train_wordpiece(["the cat sat on the mat."] * 10, vocab_size=128, lowercase=True)
    >>> sentences = ["The cat.", "", "THE m\\x01at sat", "cät"]  # the last one goes to the tokenizer
    >>> ids, lens = SentenceEncoder(tok).encode(sentences)
    >>> lens.tolist(), tok.decode(ids.tolist())
    ([3, 0, 3, 1], 'the cat. the mat sat cat')
    >>> ids.tolist() == [i for e in tok.encode_batch_fast(sentences, add_special_tokens=False) for i in e.ids]
    True
    """

    _CTRL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # Cc: removed by clean_text
    _MAX_CACHE = 500_000  # distinct words kept (~75 MB); the cache starts again beyond it

    def __init__(self, tok: Tokenizer) -> None:
        self.tokenizer = tok
        spec = json.loads(tok.to_str())
        norm, pre, model = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}, spec.get("model") or {}
        self.fast = (
            norm.get("type") == "BertNormalizer"
            and norm.get("clean_text") is True
            and pre.get("type") == "BertPreTokenizer"
            and model.get("type") == "WordPiece"
        )
        self.lowercase = bool(norm.get("lowercase"))
        self.added = sorted({t.content for t in tok.get_added_tokens_decoder().values()})
        punct = re.escape("".join(c for c in map(chr, range(33, 127)) if not c.isalnum()))
        self._words = re.compile(r"[A-Za-z0-9]+|[" + punct + r"]|\n")
        self.sentences = {"regex": 0, "tokenizer": 0}  # how many went which way (tests read it)
        self._reset()

    def _reset(self) -> None:
        self.index: dict[str, int] = {"\n": 0}  # "\n" separates sentences: no ids
        self.wlen = np.zeros(1, np.int64)
        self.woff = np.zeros(2, np.int64)
        self.flat = np.zeros(0, np.int32)

    def _slow(self, sentences: list[str], count: bool = True) -> tuple[np.ndarray, np.ndarray]:
        self.sentences["tokenizer"] += len(sentences) if count else 0
        enc = (
            [e.ids for e in self.tokenizer.encode_batch_fast(sentences, add_special_tokens=False)] if sentences else []
        )
        lens = np.fromiter(map(len, enc), dtype=np.int32, count=len(enc))
        ids = np.fromiter(itertools.chain.from_iterable(enc), dtype=np.int32, count=int(lens.sum()))
        return ids, lens

    def _plain(self, s: str) -> bool:
        return s.isascii() and "\n" not in s and not self._has_added(s)

    def _has_added(self, text: str) -> bool:
        """Whether an added token's text occurs, as written or lower-cased (a `normalized` added token is matched
        after the normalizer)."""
        if not self.added:
            return False
        low = text.lower()
        return any(a in text or a in low for a in self.added)

    def encode(self, sentences: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(ids, lens): every sentence's ids back to back (int32) and each sentence's count (int32)."""
        if not self.fast:
            return self._slow(sentences)
        text = "\n".join(sentences)
        if text.isascii() and text.count("\n") == len(sentences) - 1 and not self._has_added(text):
            return self._cut(text)
        plain = [self._plain(s) for s in sentences]
        ids_p, lens_p = (
            self._cut("\n".join(s for s, ok in zip(sentences, plain) if ok))
            if any(plain)
            else (np.zeros(0, np.int32), np.zeros(0, np.int32))
        )
        ids_s, lens_s = self._slow([s for s, ok in zip(sentences, plain) if not ok])
        order = np.asarray(plain, bool)
        lens = np.empty(len(sentences), np.int32)
        lens[order], lens[~order] = lens_p, lens_s
        starts = np.zeros(len(sentences), np.int64)  # where each sentence's run starts in `both`, in sentence order
        starts[order] = np.concatenate([[0], np.cumsum(lens_p)[:-1]]) if len(lens_p) else []
        starts[~order] = (np.concatenate([[0], np.cumsum(lens_s)[:-1]]) + len(ids_p)) if len(lens_s) else []
        both = np.concatenate([ids_p, ids_s])
        return gather_runs(both, starts, lens.astype(np.int64)), lens

    def _cut(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """The fast path over ASCII sentences joined by "\\n"."""
        if self.lowercase:
            text = text.lower()
        if self._CTRL.search(text):
            text = self._CTRL.sub("", text)
        if len(self.index) > self._MAX_CACHE:
            self._reset()
        index, n0 = self.index, len(self.index)
        setdefault = index.setdefault
        wid = np.fromiter([setdefault(w, len(index)) for w in self._words.findall(text)], np.int64)
        self.sentences["regex"] += text.count("\n") + 1
        if len(index) > n0:  # encode the new words, each on its own (what the pre-tokenizer hands WordPiece)
            new = list(itertools.islice(index, n0, None))
            ids, lens = self._slow(new, count=False)
            self.wlen = np.concatenate([self.wlen, lens.astype(np.int64)])
            self.woff = np.concatenate([self.woff, self.woff[-1] + np.cumsum(lens, dtype=np.int64)])
            self.flat = np.concatenate([self.flat, ids])
        counts = self.wlen[wid]
        ends = np.cumsum(counts)
        ids = gather_runs(self.flat, self.woff[wid], counts)
        cuts = np.flatnonzero(wid == 0)  # the separators
        bounds = np.concatenate([[0], ends[cuts], [len(ids)]]) if len(ends) else np.zeros(len(cuts) + 2, np.int64)
        return ids, np.diff(bounds).astype(np.int32)


def gather_runs(flat: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """flat[starts[0]:starts[0]+counts[0]] + flat[starts[1]:...] + ..., without a Python loop.

    >>> gather_runs(np.arange(10), np.array([7, 0, 3]), np.array([2, 0, 3])).tolist()
    [7, 8, 3, 4, 5]
    """
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, flat.dtype)
    run_starts = np.cumsum(counts) - counts  # where each run begins in the output
    return flat[np.repeat(starts - run_starts, counts) + np.arange(total)]


def read_vocab(path: str | Path) -> list[str]:
    """The tokens of a vocab.txt (local path or URI), one per line, in id order: the one vocab reader.

    Raises UnicodeDecodeError for a non-UTF-8 file and FileNotFoundError for a missing one.
    """
    lines = read_bytes(str(path)).decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    return lines


def _is_word_char(c: str) -> bool:
    """Neither whitespace, nor punctuation (ASCII or Unicode P*), nor a CJK ideograph: a character that
    BertPreTokenizer (after BertNormalizer, which isolates CJK) keeps inside a word."""
    o = ord(c)
    cjk = 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2FA1F or 0xF900 <= o <= 0xFAFF
    return not (cjk or c.isspace() or c in string.punctuation or unicodedata.category(c).startswith("P"))


def continuation_chars(texts: Iterable[str], lowercase: bool = True) -> list[str]:
    """Normalized characters that occur after the first character of a word, sorted: the `##c` pieces the
    WordPiece trainer creates. Found on the raw text (vectorised; normalizing first is 5x slower) and mapped
    through the normalizer per character; `train_wordpiece` checks the result against the trained vocabulary.

    >>> continuation_chars(["Ab, c. dÉ!"])
    ['b', 'e']
    """
    norm = _bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]")), lowercase).normalizer
    is_word = np.zeros(0x110000, dtype=bool)  # by code point, filled as characters are first seen
    seen: set[str] = set()
    cont = np.zeros(0x110000, dtype=bool)
    found: set[str] = set()
    for text in texts:
        new = set(text) - seen
        seen |= new
        for c in new:
            is_word[ord(c)] = _is_word_char(c)
            found.update(x for x in norm.normalize_str(c)[1:] if _is_word_char(x))  # "İ" -> "i̇": a tail
        cps = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
        w = is_word[cps]
        cont[cps[1:][w[:-1] & w[1:]]] = True  # a word character right after a word character
    for o in np.flatnonzero(cont):
        n = norm.normalize_str(chr(o))
        found.update(x for x in n if _is_word_char(x))
    return sorted(found)


def train_wordpiece(texts: Iterable[str], vocab_size: int, lowercase: bool = True) -> Tokenizer:
    """Train a BERT WordPiece vocabulary (special tokens first: [PAD] [UNK] [CLS] [SEP] [MASK]), deterministically.

    `texts` is read twice (a list, or any re-iterable; a one-shot iterator is materialised first).
    """
    if iter(texts) is texts:
        texts = list(texts)
    conts = ["##" + c for c in continuation_chars(texts, lowercase)]
    vocab = _train_ordered(texts, vocab_size, lowercase, conts)
    missed = sorted(t for t in vocab if len(t) == 3 and t.startswith("##") and t not in conts)
    if missed:  # a character our pre-tokenizer rule did not foresee: train again with the exact set
        conts = sorted(set(conts) | set(missed))
        vocab = _train_ordered(texts, vocab_size, lowercase, conts)
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    _bert_pipeline(tok, lowercase)
    set_pair_template(tok)
    tok.no_truncation()
    tok.no_padding()
    return tok


def _train_ordered(texts: Iterable[str], vocab_size: int, lowercase: bool, conts: list[str]) -> list[str]:
    """One trainer run with the continuation pieces declared up front; the tokens in canonical order."""
    tok = _bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]")), lowercase)
    # As special tokens, the pieces get ids 5.. in sorted order before the trainer reads any word.
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS) + conts,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    by_id = [t for t, _ in sorted(tok.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1])]
    fixed = set(SPECIAL_TOKENS) | set(conts)
    rest = [t for t in by_id if t not in fixed]
    n_chars = next((i for i, t in enumerate(rest) if len(t) != 1), len(rest))  # the sorted alphabet comes first
    used = set(by_id)
    return list(SPECIAL_TOKENS) + rest[:n_chars] + [c for c in conts if c in used] + rest[n_chars:]


TOKENIZER_KINDS = ("wordpiece", "bpe", "unigram")
VOCAB_MULTIPLE = 64  # trained bpe/unigram vocabularies are padded with [unusedN] to a multiple of this (tensor cores)


def train_tokenizer(texts: Iterable[str], kind: str, vocab_size: int, lowercase: bool = True) -> Tokenizer:
    """A tokenizer of `kind` trained on `texts`, deterministically, with BERT's special tokens ([PAD] [UNK] [CLS]
    [SEP] [MASK], ids 0-4) and its `[CLS] A [SEP] B [SEP]` template:

    - wordpiece: `train_wordpiece` (BERT's normalizer and pre-tokenizer, `##` continuations);
    - bpe: byte-level, as RoBERTa, GPT-2 and OLMo (`Ġ` marks a space before a word): no unknown token, any text
      decodes back to itself (cased; lowercase adds a Lowercase normalizer);
    - unigram: SentencePiece-style, `▁` starts every word (NFKC, whitespace runs become one space).

    bpe and unigram vocabularies are then padded with `[unusedN]` tokens to a multiple of 64.

        >>> tok = train_tokenizer(["the cat sat on the mat"] * 10, "bpe", vocab_size=300, lowercase=False)
        >>> tok.encode("the cat", add_special_tokens=False).tokens, tok.get_vocab_size()
        (['the', 'Ġcat'], 320)
    """
    if kind not in TOKENIZER_KINDS:
        raise VocabError(f"data.tokenizer {kind!r} is not one of {', '.join(TOKENIZER_KINDS)}")
    if kind == "wordpiece":
        tok = train_wordpiece(texts, vocab_size, lowercase)
        if tok.get_vocab_size() > vocab_size:  # the trainer keeps every character (and ## character) regardless
            raise _too_small(vocab_size, kind, tok.get_vocab_size())
        return tok
    tok = _train_bpe(texts, vocab_size, lowercase) if kind == "bpe" else _train_unigram(texts, vocab_size, lowercase)
    n = tok.get_vocab_size()
    tok.add_special_tokens([f"[unused{i}]" for i in range(-n % VOCAB_MULTIPLE)])
    set_pair_template(tok)
    tok.no_truncation()
    tok.no_padding()
    return tok


def _too_small(vocab_size: int, kind: str, needed: int) -> VocabError:
    return VocabError(
        f"data.vocab_size {vocab_size} is too small for data.tokenizer {kind} on this corpus: its alphabet and the "
        f"{len(SPECIAL_TOKENS)} special tokens need at least {needed}"
    )


def _train_bpe(texts: Iterable[str], vocab_size: int, lowercase: bool) -> Tokenizer:
    """Byte-level BPE. The trainer is deterministic here: every byte is in its alphabet from the start (ids in
    a fixed order) and equal-count merges are tied by those ids (tests/test_tokenizer.py trains twice)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + len(SPECIAL_TOKENS):
        raise VocabError(
            f"data.vocab_size {vocab_size} is too small for a byte-level BPE: it needs at least "
            f"{len(alphabet) + len(SPECIAL_TOKENS)} (256 bytes + {len(SPECIAL_TOKENS)} special tokens)"
        )
    tok = Tokenizer(models.BPE())
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _unigram_pipeline(tok: Tokenizer, lowercase: bool) -> Tokenizer:
    steps = [normalizers.NFKC()] + ([normalizers.Lowercase()] if lowercase else [])
    # one space for any whitespace run: no piece holds a newline (vocab.txt is one token a line)
    tok.normalizer = normalizers.Sequence(steps + [normalizers.Replace(Regex(r"\s+"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


def _train_unigram(texts: Iterable[str], vocab_size: int, lowercase: bool) -> Tokenizer:
    """SentencePiece Unigram. The trainer's EM sums floats in hash-map order, so two runs differ in a score's last
    bits, and it scores the characters it adds back last in hash-map order; those scores are handed out in
    character order, all are rounded to 1e-6 and the pieces ordered by (score, piece), so the same texts give the
    same tokenizer.json (tests/test_tokenizer.py trains twice)."""
    tok = _unigram_pipeline(Tokenizer(models.Unigram()), lowercase)
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), unk_token="[UNK]", show_progress=False
    )
    try:
        tok.train_from_iterator(texts, trainer=trainer)
    except Exception as e:  # tokenizers: "The vocabulary is not large enough to contain all chars"
        if "not large enough" not in str(e):
            raise
        chars = len(
            {
                c
                for t in texts
                for c in _unigram_pipeline(Tokenizer(models.Unigram()), lowercase).normalizer.normalize_str(t)
            }
        )
        raise _too_small(vocab_size, "unigram", chars + len(SPECIAL_TOKENS)) from None
    special = set(SPECIAL_TOKENS)
    pieces = [(p, s) for p, s in json.loads(tok.to_str())["model"]["vocab"] if p not in special]
    # Characters the pruning dropped come back last with scores 1e-4 apart, given in hash-map order: the same
    # scores, handed out again in the pieces' order.
    start = len(pieces) - 1
    while start > 0 and any(abs(pieces[start - 1][1] - pieces[start][1] - d) < 1e-9 for d in (0.0, 1e-4)):
        start -= 1
    tail = range(start, len(pieces))
    for i, p, s in zip(tail, sorted(pieces[i][0] for i in tail), sorted((pieces[i][1] for i in tail), reverse=True)):
        pieces[i] = (p, s)
    rest = sorted(((p, round(s, 6)) for p, s in pieces), key=lambda ps: (-ps[1], ps[0]))
    vocab = [(t, 0.0) for t in SPECIAL_TOKENS] + rest
    out = _unigram_pipeline(
        Tokenizer(models.Unigram(vocab, unk_id=SPECIAL_TOKENS.index("[UNK]"), byte_fallback=False)), lowercase
    )
    out.add_special_tokens(list(SPECIAL_TOKENS))
    return out


def tokenizer_report(tok: Tokenizer, texts: Iterable[str]) -> dict[str, Any]:
    """How a tokenizer cuts `texts` (a held-out slice): fertility (tokens per whitespace-separated word), UTF-8
    bytes per token, the share of tokens that are the unknown token, and the share of the vocabulary used.

        >>> tok = train_tokenizer(["the cat sat on the mat"] * 10, "wordpiece", vocab_size=128)
        >>> r = tokenizer_report(tok, ["the cat sat", "the dog"])
        >>> r["fertility"], r["unknown_rate"], r["words"], r["tokens"]
        (1.0, 0.2, 5, 5)
    """
    texts = [t for t in texts if t]
    unk = tok.token_to_id("[UNK]")
    model_unk = (json.loads(tok.to_str()).get("model") or {}).get("unk_token")
    unk = tok.token_to_id(model_unk) if model_unk else unk
    words = sum(len(t.split()) for t in texts)
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    ids = np.fromiter(
        itertools.chain.from_iterable(e.ids for e in tok.encode_batch_fast(texts, add_special_tokens=False)),
        dtype=np.int64,
    )
    n = len(ids)
    return {
        "fertility": round(n / words, 4) if words else None,
        "bytes_per_token": round(nbytes / n, 4) if n else None,
        "unknown_rate": round(float((ids == unk).sum()) / n, 4) if n and unk is not None else 0.0,
        "vocab_used": round(len(np.unique(ids)) / tok.get_vocab_size(), 4),
        "words": words,
        "tokens": n,
        "bytes": nbytes,
    }


def report_line(r: dict[str, Any]) -> str:
    """One line of `tokenizer_report`'s figures, for the console."""
    return (
        f"fertility {r['fertility']} tokens/word, {r['bytes_per_token']} bytes/token, unknown "
        f"{100 * r['unknown_rate']:.2f}%, vocabulary used {100 * r['vocab_used']:.1f}% "
        f"({r['words']:,} words{'' if r.get('held_out', True) else ', inside the training sample'})"
    )


def tokenizer_kind(tok: Tokenizer) -> str:
    """wordpiece, bpe or unigram: what the model of a tokenizer is (a BPE that is not byte-level counts as bpe)."""
    model = json.loads(tok.to_str()).get("model") or {}
    kind = {"WordPiece": "wordpiece", "BPE": "bpe", "Unigram": "unigram"}.get(model.get("type"))
    if kind is None:
        raise VocabError(f"tokenizer model {model.get('type')!r} is not WordPiece, BPE or Unigram")
    return kind


def vocab_list(tok: Tokenizer) -> list[str]:
    """Tokens ordered by id (what vocab.txt holds)."""
    by_id = sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise VocabError("tokenizer ids are not contiguous from 0; cannot write vocab.txt")
    broken = next((i for t, i in by_id if "\n" in t), None)  # vocab.txt holds one token a line
    if broken is not None:
        raise VocabError(f"tokenizer token {broken} holds a newline; vocab.txt cannot hold it")
    return [t for t, _ in by_id]


def vocab_bytes(tok: Tokenizer) -> bytes:
    return ("\n".join(vocab_list(tok)) + "\n").encode("utf-8")


def check_pair(vocab_txt: str, tokenizer_json_path: str, vocab_sha256: str) -> Tokenizer:
    """The tokenizer of `tokenizer_json_path`, after checking that it and `vocab_txt` both hold the vocabulary
    whose sha256 is `vocab_sha256`: token ids from two vocabularies must never meet in one dataset.

    Raises VocabError naming the file that does not match.
    """
    got = sha256_bytes(read_bytes(vocab_txt))
    if got != vocab_sha256:
        raise VocabError(
            f"{vocab_txt} has sha256 {got[:12]}, expected {vocab_sha256[:12]}: the vocabulary changed "
            "under this preparation; run it again"
        )
    try:
        tok = Tokenizer.from_str(read_bytes(tokenizer_json_path).decode("utf-8"))
    except Exception as e:  # tokenizers raises plain Exception subclasses
        raise VocabError(f"{tokenizer_json_path} is not a tokenizers tokenizer.json: {str(e)[:200]}") from None
    got = sha256_bytes(vocab_bytes(tok))
    if got != vocab_sha256:
        raise VocabError(
            f"{tokenizer_json_path} holds a vocabulary with sha256 {got[:12]}, not that of "
            f"{vocab_txt} ({vocab_sha256[:12]}); run the preparation again"
        )
    tok.no_truncation()
    tok.no_padding()
    return tok


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def tokenizer_json(tok: Tokenizer) -> str:
    """Canonical tokenizer.json text (no truncation/padding), stable for the same tokenizer."""
    return json.dumps(json.loads(tok.to_str()), indent=2, ensure_ascii=False, sort_keys=True)


def special_token_ids(tok: Tokenizer) -> dict[str, int]:
    return {t: int(tok.token_to_id(t)) for t in SPECIAL_TOKENS}
