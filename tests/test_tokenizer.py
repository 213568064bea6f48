"""Tokenizer: an existing vocabulary reproduces transformers' BertTokenizerFast; training a WordPiece vocabulary."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.data.tokenizer import VocabError, continuation_chars, load_tokenizer, train_wordpiece, vocab_list

SENTENCES = [
    "In the beginning God created the heaven and the earth.",
    "The asyncio module's event loop runs coroutines; use asyncio.run() — naïve café.",
    "UNBELIEVABLY long-winded, hyphenated words: antidisestablishmentarianism!",
]


@pytest.mark.parametrize("name", ["vocab.txt", "tokenizer.json"])
def test_existing_vocab_matches_transformers(minilm_dir, name):
    from transformers import BertTokenizerFast

    ref = BertTokenizerFast.from_pretrained(str(minilm_dir))
    tok = load_tokenizer(minilm_dir / name)
    for s in SENTENCES:
        assert tok.encode(s, add_special_tokens=False).ids == ref(s, add_special_tokens=False)["input_ids"]
    assert vocab_list(tok) == (minilm_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]


def test_tokenizer_json_truncation_is_disabled(minilm_dir):
    tok = load_tokenizer(minilm_dir / "tokenizer.json")
    assert len(tok.encode("word " * 1000, add_special_tokens=False).ids) == 1000


@pytest.mark.parametrize("lowercase", [True, False])
def test_train_wordpiece(shared_dir, lowercase):
    text = (shared_dir / "corpora/books/01_Ge.txt").read_text().split("\n\n")
    tok = train_wordpiece(text, vocab_size=600, lowercase=lowercase)
    vocab = vocab_list(tok)
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert 500 <= len(vocab) <= 600 and any(t.startswith("##") for t in vocab)
    enc = tok.encode("And God said, Let there be light", add_special_tokens=False)
    assert tok.decode(enc.ids) == ("and god said, let there be light" if lowercase else "And God said, Let there be light")
    assert ("God" in vocab) != lowercase


def test_bad_vocab_files(tmp_path):
    (tmp_path / "v.txt").write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(VocabError, match=r"lacks BERT special token\(s\) \[CLS\], \[SEP\], \[MASK\]"):
        load_tokenizer(tmp_path / "v.txt")
    with pytest.raises(VocabError, match="does not exist"):
        load_tokenizer(tmp_path / "missing.txt")
    (tmp_path / "t.json").write_text("{not json")
    with pytest.raises(VocabError, match="not a tokenizers tokenizer.json"):
        load_tokenizer(tmp_path / "t.json")


_TRAIN = """
import glob, hashlib, sys
from pipeline.data.tokenizer import train_wordpiece, vocab_bytes, tokenizer_json
texts = [open(p, encoding="utf-8").read() for p in sorted(glob.glob(sys.argv[1] + "/*.txt"))[:3]]
tok = train_wordpiece(iter(texts), vocab_size=3000, lowercase=sys.argv[2] == "1")
print(hashlib.sha256(vocab_bytes(tok)).hexdigest(), hashlib.sha256(tokenizer_json(tok).encode()).hexdigest())
"""


@pytest.mark.parametrize("lowercase", ["1", "0"])
def test_trained_vocab_is_identical_in_fresh_processes(repo_root, shared_dir, lowercase):
    """Each process hashes its maps with a new random state; the raw WordPieceTrainer gives a different
    vocabulary almost every time on this input (huggingface/tokenizers#1794), ours the same bytes."""
    outs = {
        subprocess.run([sys.executable, "-c", _TRAIN, str(shared_dir / "corpora/books"), lowercase], cwd=repo_root,
                       capture_output=True, text=True, check=True, timeout=300).stdout
        for _ in range(3)
    }
    assert len(outs) == 1, outs


def test_trained_vocab_canonical_order(shared_dir):
    text = (shared_dir / "corpora/books/08_Ruth.txt").read_text().split("\n\n")
    vocab = vocab_list(train_wordpiece(text, vocab_size=400))
    singles = [t for t in vocab[5:] if len(t) == 1]
    conts = [t for t in vocab[5:] if len(t) == 3 and t.startswith("##")]
    # special tokens, the sorted alphabet, the sorted ## characters, then merges in the order they were made
    assert vocab[5 : 5 + len(singles)] == sorted(singles)
    assert vocab[5 + len(singles) : 5 + len(singles) + len(conts)] == sorted(conts)
    assert set(conts) == {"##" + c for c in continuation_chars(text)}
