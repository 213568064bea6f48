"""Tokenizer: an existing vocabulary reproduces transformers' BertTokenizerFast; training a WordPiece vocabulary."""

from __future__ import annotations

import pytest

from pipeline.data.tokenizer import VocabError, load_tokenizer, train_wordpiece, vocab_list

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
