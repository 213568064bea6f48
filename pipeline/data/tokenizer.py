"""The WordPiece tokenizer: load an existing vocabulary or train one with `tokenizers`, and save the pair
(`vocab.txt`, `tokenizer.json`) that was used beside the shards.

Encoding always happens without special tokens, truncation or padding: the example builder adds [CLS]/[SEP]
itself and a tokenizer.json that ships with `truncation: 128` (as many do) must not cut sentences silently.

    >>> tok = train_wordpiece(["the cat sat on the mat"] * 10, vocab_size=128, lowercase=True)
    >>> tok.encode("The cat", add_special_tokens=False).tokens
    ['the', 'cat']
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

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


def train_wordpiece(texts: Iterable[str], vocab_size: int, lowercase: bool = True) -> Tokenizer:
    """Train a BERT WordPiece vocabulary (special tokens first: [PAD] [UNK] [CLS] [SEP] [MASK])."""
    tok = _bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]")), lowercase)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##", show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    _post_processor(tok)
    tok.no_truncation()
    tok.no_padding()
    return tok


def vocab_list(tok: Tokenizer) -> list[str]:
    """Tokens ordered by id (what vocab.txt holds)."""
    by_id = sorted(tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise VocabError("tokenizer ids are not contiguous from 0; cannot write vocab.txt")
    return [t for t, _ in by_id]


def vocab_bytes(tok: Tokenizer) -> bytes:
    return ("\n".join(vocab_list(tok)) + "\n").encode("utf-8")


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def tokenizer_json(tok: Tokenizer) -> str:
    """Canonical tokenizer.json text (no truncation/padding), stable for the same tokenizer."""
    return json.dumps(json.loads(tok.to_str()), indent=2, ensure_ascii=False, sort_keys=True)


def special_token_ids(tok: Tokenizer) -> dict[str, int]:
    return {t: int(tok.token_to_id(t)) for t in SPECIAL_TOKENS}
