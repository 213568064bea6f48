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
import json
import string
import unicodedata
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from pipeline.io import read_bytes

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class VocabError(ValueError):
    """A vocabulary file that cannot be used; the message names it."""


def _bert_pipeline(tok: Tokenizer, lowercase: bool) -> Tokenizer:
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None if lowercase else False, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _post_processor(tok: Tokenizer) -> None:
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)]
    )


def load_tokenizer(path: str | Path, lowercase: bool = True) -> Tokenizer:
    """A `vocab.txt` (BERT WordPiece, `lowercase` decides cased/uncased) or a `tokenizer.json`."""
    p = Path(path)
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
        tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
        _bert_pipeline(tok, lowercase)
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        raise VocabError(f"vocabulary {path} lacks BERT special token(s) {', '.join(missing)}")
    if p.suffix != ".json":
        _post_processor(tok)
    tok.no_truncation()
    tok.no_padding()
    return tok


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
    _post_processor(tok)
    tok.no_truncation()
    tok.no_padding()
    return tok


def _train_ordered(texts: Iterable[str], vocab_size: int, lowercase: bool, conts: list[str]) -> list[str]:
    """One trainer run with the continuation pieces declared up front; the tokens in canonical order."""
    tok = _bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]")), lowercase)
    # As special tokens, the pieces get ids 5.. in sorted order before the trainer reads any word.
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS) + conts, continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    by_id = [t for t, _ in sorted(tok.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1])]
    fixed = set(SPECIAL_TOKENS) | set(conts)
    rest = [t for t in by_id if t not in fixed]
    n_chars = next((i for i, t in enumerate(rest) if len(t) != 1), len(rest))  # the sorted alphabet comes first
    used = set(by_id)
    return list(SPECIAL_TOKENS) + rest[:n_chars] + [c for c in conts if c in used] + rest[n_chars:]


def vocab_list(tok: Tokenizer) -> list[str]:
    """Tokens ordered by id (what vocab.txt holds)."""
    by_id = sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise VocabError("tokenizer ids are not contiguous from 0; cannot write vocab.txt")
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
        raise VocabError(f"{vocab_txt} has sha256 {got[:12]}, expected {vocab_sha256[:12]}: the vocabulary changed "
                         "under this preparation; run it again")
    try:
        tok = Tokenizer.from_str(read_bytes(tokenizer_json_path).decode("utf-8"))
    except Exception as e:  # tokenizers raises plain Exception subclasses
        raise VocabError(f"{tokenizer_json_path} is not a tokenizers tokenizer.json: {str(e)[:200]}") from None
    got = sha256_bytes(vocab_bytes(tok))
    if got != vocab_sha256:
        raise VocabError(f"{tokenizer_json_path} holds a vocabulary with sha256 {got[:12]}, not that of "
                         f"{vocab_txt} ({vocab_sha256[:12]}); run the preparation again")
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
