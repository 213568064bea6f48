"""Tokenizer: an existing vocabulary reproduces transformers' BertTokenizerFast; training a WordPiece vocabulary."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from pipeline.data.tokenizer import (
    SentenceEncoder,
    VocabError,
    continuation_chars,
    load_tokenizer,
    train_wordpiece,
    vocab_list,
)

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
    assert tok.decode(enc.ids) == (
        "and god said, let there be light" if lowercase else "And God said, Let there be light"
    )
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
        subprocess.run(
            [sys.executable, "-c", _TRAIN, str(shared_dir / "corpora/books"), lowercase],
            cwd=repo_root,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        ).stdout
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


def _reference(tok, sentences):
    enc = tok.encode_batch_fast(sentences, add_special_tokens=False)
    return [i for e in enc for i in e.ids], [len(e.ids) for e in enc]


def _assert_same(enc, sentences):
    ids, lens = enc.encode(sentences)
    ref_ids, ref_lens = _reference(enc.tokenizer, sentences)
    assert lens.tolist() == ref_lens
    assert ids.tolist() == ref_ids
    assert ids.dtype == lens.dtype == np.int32


@pytest.mark.slow  # the whole of ../shared/corpora (2.3M tokens): 8 s
def test_sentence_encoder_equals_the_tokenizer_on_the_shared_corpora(shared_dir, minilm_dir):
    """The regex path gives the tokenizer's ids for every sentence of the shared corpora (2.3M tokens), and
    carries nearly all of them (the non-ASCII ones go to the tokenizer)."""
    from pipeline.data.examples import split_sentences
    from pipeline.data.sources import Document, expand_inputs, read_documents

    files, _ = expand_inputs([str(shared_dir / "corpora/books"), str(shared_dir / "corpora/wiki")])
    enc = SentenceEncoder(load_tokenizer(minilm_dir / "vocab.txt"))
    assert enc.fast
    total = 0
    for f in files:
        sentences = [s for d in read_documents(f, "text") if isinstance(d, Document) for s in split_sentences(d.text)]
        _assert_same(enc, sentences)
        total += len(sentences)
    assert enc.sentences["regex"] + enc.sentences["tokenizer"] == total > 60_000
    assert 0 < enc.sentences["tokenizer"] < 0.01 * total  # 263 sentences with non-ASCII text


ADVERSARIAL = [
    "",
    " ",
    "   \t ",
    "a",
    "A.B,c",
    "x" * 99,
    "y" * 100,
    "z" * 101 + " ok",
    "Mr. Smith's 3.5kg (approx.)!",
    "tab\tsep\rcarriage",
    "line\nbreak",
    "ctrl\x01in\x7fside\x0bvt\x0cff\x1cfs\x1dgs",
    "\x00nul",
    "~`^|\\{}[]<>@#$%&*+=",
    "[MASK] and [CLS] and [cls] and [Mask]",
    "naïve café",
    "日本語 text",
    "İstanbul ΣΑΣ",
    "emoji 🙂 ok",
    "\u00a0nbsp",
    "e\u0301 combining",
    "zero\u200bwidth",
    "UPPER lower MiXeD 123abc ABC123",
]


@pytest.mark.parametrize("which", ["vocab.txt", "tokenizer.json", "trained-cased", "not-bert"])
def test_sentence_encoder_equals_the_tokenizer_on_adversarial_text(minilm_dir, which):
    """Control characters, whitespace kinds, a newline inside a sentence, words around WordPiece's 100-character
    limit, added tokens' text, non-ASCII in the same batch; a cased vocabulary; and a tokenizer whose pipeline is
    not BERT's (everything goes to the tokenizer). Then 300 random batches over the same characters."""
    import random

    from tokenizers import Tokenizer, models, pre_tokenizers

    if which == "trained-cased":
        tok = train_wordpiece(ADVERSARIAL * 5 + SENTENCES * 5, vocab_size=300, lowercase=False)
    elif which == "not-bert":
        tok = Tokenizer(
            models.WordPiece({t: i for i, t in enumerate(["[UNK]", "a", "b", "##b", "."])}, unk_token="[UNK]")
        )
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
    else:
        tok = load_tokenizer(minilm_dir / which)
    enc = SentenceEncoder(tok)
    assert enc.fast == (which != "not-bert")
    _assert_same(enc, ADVERSARIAL)
    _assert_same(enc, [s for s in ADVERSARIAL if s.isascii() and "\n" not in s])  # the all-regex branch
    every = sorted(set("".join(ADVERSARIAL + SENTENCES)))
    ascii_only = [c for c in every if c.isascii()]
    rng = random.Random(0)
    for k in range(300):  # every other batch ASCII only, so the regex path gets whole batches too
        alphabet = ascii_only if k % 2 else every
        batch = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(rng.randint(1, 8))]
        _assert_same(enc, batch)
    if enc.fast:
        assert enc.sentences["regex"] > 500
        assert len(enc.index) > 1000  # the random batches' distinct words
        enc._MAX_CACHE = 20  # a cache that starts again on every batch gives the same ids
        for _ in range(3):
            _assert_same(enc, ADVERSARIAL + SENTENCES)
        assert len(enc.index) < 200  # one batch's words


# Issue 57: byte-level BPE and Unigram trained on the corpus.

MIXED = "Ça va? naïve café — 日本語のテキスト 😀👍🏽 def f(x):\n\treturn {'a': x ** 2}  # done"


@pytest.fixture(scope="module")
def genesis(shared_dir):
    return (shared_dir / "corpora/books/01_Ge.txt").read_text().split("\n\n")


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_trained_kinds_are_deterministic_padded_and_keep_bert_template(genesis, kind):
    """Two trainings give the same tokenizer.json (each trainer run hashes its maps with a new random state:
    Unigram's raw output differs almost every time); the vocabulary is BERT's five special tokens, the pieces,
    then [unusedN] up to a multiple of 64; pairs get `[CLS] A [SEP] B [SEP]` with segment ids."""
    from pipeline.data.tokenizer import tokenizer_json, tokenizer_kind, train_tokenizer

    toks = [train_tokenizer(genesis, kind, vocab_size=700, lowercase=False) for _ in range(2)]
    assert tokenizer_json(toks[0]) == tokenizer_json(toks[1])
    tok = toks[0]
    vocab = vocab_list(tok)
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(vocab) % 64 == 0
    n_unused = sum(t.startswith("[unused") for t in vocab)
    assert vocab[len(vocab) - n_unused :] == [f"[unused{i}]" for i in range(n_unused)]
    assert tokenizer_kind(tok) == kind and 0 < len(vocab) - 64 < 700
    enc = tok.encode("And God said", "Let there be light")
    assert enc.tokens[0] == "[CLS]" and enc.tokens.count("[SEP]") == 2 and enc.tokens[-1] == "[SEP]"
    assert enc.type_ids[-1] == 1 and enc.type_ids[0] == 0
    marker = {"bpe": "\u0120", "unigram": "\u2581"}[kind]
    words = [t for t in tok.encode("And God said", add_special_tokens=False).tokens if t.startswith(marker)]
    assert [t.lstrip(marker)[:1] for t in words][-2:] == ["G", "s"]  # every word after a space starts with it
    assert "God" in tok.decode(enc.ids)


def test_byte_level_bpe_round_trips_any_text_without_unknown(genesis):
    from pipeline.data.tokenizer import train_tokenizer

    tok = train_tokenizer(genesis, "bpe", vocab_size=400, lowercase=False)
    enc = tok.encode(MIXED, add_special_tokens=False)
    assert tok.token_to_id("[UNK]") not in enc.ids
    assert tok.decode(enc.ids) == MIXED  # accents, CJK, emoji with a skin tone, code, tabs and newlines
    low = train_tokenizer(genesis, "bpe", vocab_size=400, lowercase=True)
    assert low.decode(low.encode(MIXED, add_special_tokens=False).ids) == MIXED.lower()


def test_unigram_pieces_start_words_and_never_hold_whitespace(genesis):
    from pipeline.data.tokenizer import train_tokenizer

    tok = train_tokenizer(genesis, "unigram", vocab_size=600, lowercase=True)
    assert not any(any(c.isspace() for c in t) for t in vocab_list(tok))  # vocab.txt is one token a line
    tokens = tok.encode("In the beginning\tGod\ncreated", add_special_tokens=False).tokens
    assert [t for t in tokens if t.startswith("\u2581")][:2] == ["\u2581in", "\u2581the"]
    assert tok.decode(tok.encode("in the beginning", add_special_tokens=False).ids) == "in the beginning"


def test_bad_tokenizer_kind_and_size_name_the_field():
    from pipeline.config import DataConfig
    from pipeline.data.tokenizer import train_tokenizer

    with pytest.raises(VocabError, match="data.tokenizer 'sentencepiece' is not one of"):
        train_tokenizer(["a b"], "sentencepiece", vocab_size=300)
    with pytest.raises(ValueError, match="data.tokenizer 'bpe2' is not one of"):
        DataConfig(tokenizer="bpe2")
    with pytest.raises(ValueError, match="data.vocab_size 200 is too small for data.tokenizer bpe"):
        DataConfig(tokenizer="bpe", vocab_size=200)


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_registered_directory_loads_in_transformers_with_the_pipelines_ids(genesis, shared_dir, tmp_path, kind):
    """What the pretraining job registers (save_hf + write_tokenizer_config): AutoTokenizer gives the pipeline's
    ids on held-out text, and fill-mask answers for the tokenizer's mask token, for BERT and ModernBERT."""
    import transformers

    from model.config import encoder_config
    from model.build import build_model
    from model.hf import save_hf
    from pipeline.data.tokenizer import train_tokenizer
    from pipeline.tracking.registry import write_tokenizer_config

    tok = train_tokenizer(genesis, kind, vocab_size=500, lowercase=kind == "wordpiece")
    held_out = (shared_dir / "corpora/books/02_Exo.txt").read_text().split("\n\n")[:30]
    for preset in ("tiny", "modernbert-tiny"):
        d = tmp_path / preset
        save_hf(build_model(encoder_config(preset, vocab_size=tok.get_vocab_size())), d, tokenizer=tok)
        write_tokenizer_config(str(d), model_max_length=128, lowercase=kind == "wordpiece")
        auto = transformers.AutoTokenizer.from_pretrained(d)
        assert auto.mask_token == "[MASK]" and auto.pad_token_id == tok.token_to_id("[PAD]")
        for text in held_out:
            assert auto(text, add_special_tokens=False)["input_ids"] == tok.encode(text, add_special_tokens=False).ids
        assert auto("In the", "beginning")["input_ids"] == tok.encode("In the", "beginning").ids
        preds = transformers.pipeline("fill-mask", model=str(d), top_k=3)(f"And God said {auto.mask_token} there")
        assert len(preds) == 3 and all(isinstance(p["token_str"], str) for p in preds)
