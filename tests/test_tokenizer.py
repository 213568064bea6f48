"""Tokenizer: an existing vocabulary reproduces transformers' BertTokenizerFast; training a WordPiece vocabulary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    with pytest.raises(VocabError, match=r"^vocabulary \S+v.txt has no cls token: no template .* \[CLS\], <s>"):
        load_tokenizer(tmp_path / "v.txt")
    (tmp_path / "v.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    with pytest.raises(VocabError, match=r"^vocabulary \S+v.txt has no way to mask: no mask token"):
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

    from model.family import encoder_config
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


# ---------------------------------------------------------------------------------------------------------------
# a tokenizer the user brings (data.vocab): its own special tokens (issue 57)


@pytest.fixture(scope="module")
def roberta_files(genesis, tmp_path_factory):
    """RoBERTa-style byte-level BPE tokenizer.json files: with `<mask>`, with no mask but two unused tokens, with
    neither."""
    from conftest import roberta_tokenizer

    d = tmp_path_factory.mktemp("roberta")
    roberta_tokenizer(genesis).save(str(d / "roberta.json"))
    roberta_tokenizer(genesis, mask=None, unused=2).save(str(d / "no-mask.json"))
    roberta_tokenizer(genesis, mask=None).save(str(d / "no-way.json"))
    return d


def test_a_loaded_tokenizer_brings_its_own_special_tokens(roberta_files, tmp_path):
    """The roles come from the tokenizer: RoBERTa's template `<s> A </s></s> B </s>`, `<pad>` and `<mask>`; with no
    mask token the first unused one becomes it (one piece in any text); with neither, or a template that is not
    `cls A sep B sep`, or a file that does not parse, one line names the file."""
    from tokenizers import Tokenizer, models, processors

    from pipeline.data.specials import specials

    tok = load_tokenizer(roberta_files / "roberta.json")
    sp = specials(tok)
    assert sp.tokens == {"cls": "<s>", "sep": "</s>", "pad": "<pad>", "mask": "<mask>", "unk": "<unk>"}
    assert sp.ids == {"cls": 0, "sep": 2, "pad": 1, "mask": 4, "unk": 3} and sp.middle == 2 and not sp.made
    assert sp.template == "<s> $A </s> </s> $B </s>" and sp.never_masked == (0, 1, 2, 3, 4)
    pair = tok.encode("In the", "beginning").tokens
    assert pair[0] == "<s>" and pair[-1] == "</s>" and pair[pair.index("</s>") : pair.index("</s>") + 2] == ["</s>"] * 2

    no_mask = load_tokenizer(roberta_files / "no-mask.json")
    sp = specials(no_mask)
    assert sp.tokens["mask"] == "<unused0>" and sp.made == {"mask": "<unused0>"} and sp.never_masked == tuple(range(6))
    assert no_mask.encode("And <unused0> said", add_special_tokens=False).tokens.count("<unused0>") == 1

    with pytest.raises(VocabError, match=r"^vocabulary \S+no-way.json has no way to mask: no mask token"):
        load_tokenizer(roberta_files / "no-way.json")
    odd = Tokenizer.from_file(str(roberta_files / "roberta.json"))
    odd.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    odd.save(str(tmp_path / "odd.json"))
    with pytest.raises(VocabError, match=r"^vocabulary \S+odd.json: its pair template `<s> \$A \$B </s>` is not"):
        load_tokenizer(tmp_path / "odd.json")
    bert = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    Tokenizer(models.WordLevel({t: i for i, t in enumerate(bert + ["a"])}, "[UNK]")).save(str(tmp_path / "wl.json"))
    with pytest.raises(VocabError, match=r"^vocabulary \S+wl.json: tokenizer model 'WordLevel' is not WordPiece, BPE"):
        load_tokenizer(tmp_path / "wl.json")
    Tokenizer(models.WordPiece({t: i for i, t in enumerate(bert + ["a\nb"])}, unk_token="[UNK]")).save(
        str(tmp_path / "nl.json")
    )
    with pytest.raises(VocabError, match=r"^vocabulary \S+nl.json: tokenizer token 5 holds a newline"):
        load_tokenizer(tmp_path / "nl.json")
    (tmp_path / "broken.json").write_text('{"model": {"type": "BPE"')
    with pytest.raises(VocabError, match=r"^vocabulary \S+broken.json is not a tokenizers tokenizer.json"):
        load_tokenizer(tmp_path / "broken.json")


@pytest.mark.parametrize("whole_word", [False, True])
def test_masking_never_picks_a_loaded_tokenizers_special_tokens(roberta_files, genesis, whole_word):
    """NSP pairs in RoBERTa's template, masked at 50%: no selected position is `<s>`, `</s>` or `<pad>`, and no
    random replacement is a special token; the masked tokens read `<mask>`; whole words stay whole."""
    from pipeline.data.examples import make_pair
    from pipeline.data.masking import MaskingPolicy, mask_rows
    from pipeline.data.specials import specials

    tok = load_tokenizer(roberta_files / "roberta.json")
    sp = specials(tok)
    policy = MaskingPolicy.from_vocab(
        vocab_list(tok), mask_rate=0.5, max_predictions_per_seq=60, whole_word=whole_word, specials=sp
    )
    enc = [np.array(e.ids, np.int32) for e in tok.encode_batch(genesis[1:201], add_special_tokens=False)]
    rows = [
        make_pair(a[:40], b[:40], sp.ids["cls"], sp.ids["sep"], 0, sp.middle).input_ids
        for a, b in zip(enc[::2], enc[1::2])
    ]
    assert rows[0][0] == 0 and list(rows[0][41:43]) == [2, 2] and rows[0][-1] == 2
    masked, positions, labels = mask_rows(rows, np.arange(len(rows)), policy, seed=0, epoch=0)
    special = set(sp.never_masked)
    picked = np.concatenate(labels)
    assert len(picked) > 20 * len(rows) and not special & set(picked.tolist())
    for row, m, pos in zip(rows, masked, positions):
        assert all(m[i] == row[i] for i in range(len(row)) if i not in set(pos.tolist()))  # the rest untouched
        assert not special & set(m[pos].tolist()) - {sp.ids["mask"]}  # replacements are never special
    assert (np.concatenate([m[p] for m, p in zip(masked, positions)]) == sp.ids["mask"]).mean() > 0.7
    if whole_word:  # a piece without Ġ is masked exactly when the piece before it (same word) is
        cont = set(policy.continuation_ids)
        for row, pos in zip(rows, positions):
            chosen = set(pos.tolist())
            for i in range(2, len(row)):
                if row[i] in cont and row[i - 1] not in special:
                    assert (i in chosen) == (i - 1 in chosen)


def test_a_tokenizer_without_a_mask_token_prepares_with_an_unused_one(roberta_files, shared_dir, tmp_path):
    """Data preparation with the no-mask tokenizer: the manifest says which unused token masks, the shards use
    it, and the tokenizer.json written beside them makes it one piece (what the registered directory holds)."""
    import json

    import pyarrow.parquet as pq

    out = tmp_path / "data"
    cmd = [sys.executable, "jobs/prepare_data.py", "--input", str(shared_dir / "corpora/books/08_Ruth.txt")]
    cmd += ["--output", str(out), "--vocab", str(roberta_files / "no-mask.json"), "--masking", "static"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "mask token made from <unused0>" in r.stdout + r.stderr
    m = json.loads((out / "manifest.json").read_text())
    sp = m["tokenizer"]["special_tokens"]
    assert sp["made"] == {"mask": "<unused0>"} and m["special_token_ids"]["mask"] == 4 and sp["middle"] == 2
    t = pq.read_table([str(p) for p in sorted((out / "shards").glob("*.parquet"))])
    ids = np.concatenate(t.column("input_ids").to_numpy(zero_copy_only=False))
    assert (ids == 4).sum() > 0 and (ids == 5).sum() == 0  # <unused0> masks; <unused1> never appears
    assert load_tokenizer(out / "tokenizer.json").encode("a <unused0> b", add_special_tokens=False).ids.count(4) == 1

    r = subprocess.run(
        cmd[:-4] + ["--vocab", str(roberta_files / "no-way.json"), "--output", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode != 0 and not (tmp_path / "x").exists()
    last = r.stderr.strip().splitlines()[-1]
    assert "no-way.json has no way to mask: no mask token ([MASK], <mask>, <|mask|>) and no unused token" in last
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("which", ["roberta", "no-mask"])
def test_fill_mask_answers_for_a_loaded_tokenizers_mask_token(roberta_files, genesis, tmp_path, which):
    """What the job registers for a loaded tokenizer (save_hf + write_tokenizer_config with its roles): AutoTokenizer
    reads its special tokens and gives the pipeline's ids; fill-mask answers for `<mask>` (or the unused token)."""
    import transformers

    from model.build import build_model
    from model.family import encoder_config
    from model.hf import save_hf
    from pipeline.data.specials import specials
    from pipeline.tracking.registry import write_tokenizer_config

    tok = load_tokenizer(roberta_files / f"{which}.json")
    sp = specials(tok)
    d = tmp_path / which
    cfg = encoder_config("tiny", vocab_size=tok.get_vocab_size(), pad_token_id=sp.ids["pad"])
    save_hf(build_model(cfg), d, tokenizer=tok)
    write_tokenizer_config(str(d), model_max_length=128, lowercase=False, special_tokens=sp.tokens)
    auto = transformers.AutoTokenizer.from_pretrained(d)
    assert auto.mask_token == sp.tokens["mask"] and auto.pad_token_id == 1 and auto.cls_token == "<s>"
    for text in genesis[300:320]:
        assert auto(text, add_special_tokens=False)["input_ids"] == tok.encode(text, add_special_tokens=False).ids
    assert auto("In the", "beginning")["input_ids"] == tok.encode("In the", "beginning").ids
    preds = transformers.pipeline("fill-mask", model=str(d), top_k=3)(f"And God said {auto.mask_token} there")
    assert len(preds) == 3 and all(isinstance(p["token_str"], str) for p in preds)


@pytest.mark.slow
@pytest.mark.parametrize("which,mask", [("roberta", "<mask>"), ("no-mask", "<unused0>")])
def test_the_main_job_with_a_roberta_style_tokenizer(
    roberta_files, shared_dir, tmp_path, monkeypatch, job_cluster, which, mask
):
    """`jobs/pretrain.py --config configs/tiny.yaml --data.vocab roberta.json` (NSP on, so the pairs take its template)
    prepares `<s> A </s></s> B </s>` rows, trains, registers a version whose tokenizer_config names `<mask>` and
    `<pad>` and whose config's pad_token_id is `<pad>`'s (1), fill-mask answers for `<mask>`; masking the prepared
    rows as the loader does never picks a special token; `jobs/finetune.py` fine-tunes the version. The same with a
    tokenizer that has no mask token, `<unused0>` (id 4) made into one (not fine-tuned again: fine-tuning masks
    nothing)."""
    import json
    import math
    import os

    import pyarrow.parquet as pq
    import transformers

    from conftest import sqlite_store
    from pipeline import tracking
    from pipeline.data.dataset import PreparedDataset
    from pipeline.data.masking import mask_rows

    repo = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": sqlite_store(tmp_path / "mlflow.db"),
        "PYTHONUNBUFFERED": "1",
        "RAY_ADDRESS": job_cluster,
    }
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])
    books = [str(shared_dir / "corpora" / "books" / b) for b in ("08_Ruth.txt", "57_Phmn.txt")]
    args = ["--config", str(repo / "configs" / "tiny.yaml"), "--data.inputs", f"[{', '.join(books)}]"]
    args += ["--data.output", str(tmp_path / "data"), "--data.vocab", str(roberta_files / f"{which}.json")]
    args += ["--data.nsp", "true", "--data.max_seq_length", "64", "--data.max_predictions_per_seq", "20"]
    args += ["--train.max_steps", "4", "--train.warmup_steps", "1", "--train.eval_every_steps", "4"]
    args += ["--train.checkpoint_every_steps", "4", "--train.eval_batches", "2"]
    args += ["--train.storage_path", str(tmp_path / "runs"), "--tracking.model_name", "rb-e2e", "--eval.suite", "null"]
    pre = subprocess.run(
        [sys.executable, str(repo / "jobs" / "pretrain.py"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert pre.returncode == 0, pre.stderr[-3000:]
    assert pre.stdout.strip().splitlines()[-1] == "registered models:/rb-e2e/1"

    ds = PreparedDataset.load(str(tmp_path / "data"))
    assert ds.specials.template == "<s> $A </s> </s> $B </s>" and ds.pad_id == 1 and ds.specials.ids["mask"] == 4
    assert ds.specials.made == ({} if which == "roberta" else {"mask": "<unused0>"})
    special = set(ds.specials.never_masked)
    assert special == set(range(5 if which == "roberta" else 6))
    t = pq.read_table([p for p, _ in ds.shards])
    rows = [np.asarray(r, np.int32) for r in t.column("input_ids").to_pylist()]
    nsp = t.column("next_sentence_label").to_pylist()
    for row, label in zip(rows, nsp):
        assert row[0] == 0 and row[-1] == 2 and label in (0, 1)
        sep = int(np.flatnonzero(row == 2)[0])
        assert row[sep + 1] == 2 and (row == 2).sum() == 3  # A </s></s> B </s>
    _, positions, labels = mask_rows(rows, t.column("example_id").to_numpy(), ds.policy(), seed=0, epoch=1)
    assert sum(map(len, labels)) > 0 and not set(np.concatenate(labels).tolist()) & special
    assert ds.policy().mask_token_id == 4 and not special & set(ds.policy().tables()[2].tolist())

    local = tracking.download_model("models:/rb-e2e/1", str(tmp_path / "dl"))
    config = json.loads(Path(local, "config.json").read_text())
    tok_config = json.loads(Path(local, "tokenizer_config.json").read_text())
    assert config["pad_token_id"] == 1 and tok_config["mask_token"] == mask and tok_config["cls_token"] == "<s>"
    auto = transformers.AutoTokenizer.from_pretrained(local)
    text = (shared_dir / "corpora" / "books" / "01_Ge.txt").read_text()[:2000]
    assert auto(text)["input_ids"] == load_tokenizer(local).encode(text).ids
    preds = transformers.pipeline("fill-mask", model=local, top_k=2)(f"And Ruth said, {mask} me not")
    assert len(preds) == 2 and all(isinstance(p["token_str"], str) for p in preds)

    if which != "roberta":
        return
    task = shared_dir / "tasks" / "pydocs_topic"
    ft = subprocess.run(
        [sys.executable, str(repo / "jobs" / "finetune.py"), "--model", "models:/rb-e2e/1"]
        + ["--task", "sequence-classification", "--train", str(task / "train.tsv"), "--eval", str(task / "dev.tsv")]
        + ["--data.max_seq_length", "64", "--data.max_train_examples", "64", "--data.max_eval_examples", "32"]
        + ["--train.max_steps", "4", "--train.batch_size", "16", "--train.storage_path", str(tmp_path / "ft")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert ft.returncode == 0, ft.stderr[-3000:]
    result = json.loads(ft.stdout.strip().splitlines()[-1])
    assert 0.0 <= result["accuracy"] <= 1.0 and math.isfinite(result["loss"])


def test_a_vocab_size_too_small_for_the_alphabet_names_the_field():
    """Under wordpiece and unigram the corpus's alphabet sets the least size: one line naming data.vocab_size and
    the size needed (unigram's trainer raised a bare Exception; WordPiece's silently grew past the size asked)."""
    from pipeline.data.tokenizer import train_tokenizer

    texts = ["".join(chr(0x4E00 + i) for i in range(k * 50, (k + 1) * 50)) + " abc" for k in range(6)] * 3
    for kind, needed in (("wordpiece", 310), ("unigram", 309)):
        with pytest.raises(VocabError, match=rf"^data.vocab_size 128 is too small for data.tokenizer {kind} on this "):
            train_tokenizer(texts, kind, vocab_size=128)
        with pytest.raises(VocabError, match=rf"need at least {needed}$"):
            train_tokenizer(texts, kind, vocab_size=128)
    assert train_tokenizer(texts, "wordpiece", vocab_size=320).get_vocab_size() <= 320


def test_a_data_vocab_with_other_special_tokens_than_the_checkpoints_is_refused(roberta_files, tmp_path):
    """model.init with a data.vocab holding the checkpoint's tokens under another template: one line naming both
    files and the difference; the checkpoint's own tokenizer.json passes."""
    from tokenizers import Tokenizer, processors

    from model.build import build_model
    from model.family import encoder_config
    from model.hf import save_hf
    from pipeline.config import ConfigError, load_config, resolve_paths
    from pipeline.pretrain.init import resolve_init

    tok = load_tokenizer(roberta_files / "roberta.json")
    ckpt = tmp_path / "ckpt"
    save_hf(build_model(encoder_config("tiny", vocab_size=tok.get_vocab_size(), pad_token_id=1)), ckpt, tokenizer=tok)
    other = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    other.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> $B:1 </s>:1", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    other.save(str(tmp_path / "other.json"))

    def cfg(vocab):
        args = ["--data.output", str(tmp_path / "data"), "--train.storage_path", str(tmp_path / "runs")]
        return resolve_paths(load_config(None, [*args, "--model.init", str(ckpt), "--data.vocab", str(vocab)]))

    assert resolve_init(cfg(ckpt / "tokenizer.json"))[0].data.vocab == str(ckpt / "tokenizer.json")
    with pytest.raises(ConfigError) as e:
        resolve_init(cfg(tmp_path / "other.json"))
    msg = str(e.value)
    assert msg.startswith(f"data.vocab {tmp_path / 'other.json'} (sha256 ") and "\n" not in msg
    assert "the same tokens, but its special tokens differ (template <s> $A </s> $B </s> vs <s> $A </s> </s> $B" in msg


def test_the_models_pad_id_is_the_tokenizers_not_the_presets(roberta_files):
    """modernbert-base's preset pad_token_id is 50283 (ModernBERT's own tokenizer's); with a prepared vocabulary of
    640 tokens whose `<pad>` is 1 the model pretraining builds, and a scratch fine-tuning model, pad with 1."""
    from pipeline.config.sections import ModelConfig
    from pipeline.finetune.data import TaskData
    from pipeline.finetune.job import Source, task_model
    from pipeline.pretrain.worker import initial_model

    small = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 1}
    model = initial_model(ModelConfig(preset="modernbert-base", overrides=small), 640, pad_token_id=1)
    assert model.config.pad_token_id == 1 and model.model.embeddings.tok_embeddings.padding_idx == 1
    src = Source("scratch:modernbert-base", None, "modernbert-base", str(roberta_files / "roberta.json"))
    td = TaskData("sequence-classification", {}, {}, {0: "a", 1: "b"})
    ft = task_model(src, td, small, 600)
    assert ft.config.pad_token_id == 1


def test_fine_tuning_pads_with_the_tokenizers_pad_token(roberta_files, shared_dir):
    """A task tokenized with the RoBERTa-style tokenizer: pairs in its template, batches padded with `<pad>` (1),
    not BERT's 0 (`<s>` here)."""
    from pipeline.finetune.data import pad_batch, prepare_task

    task = shared_dir / "tasks" / "pydocs_topic"
    td = prepare_task(
        "sequence-classification",
        task / "train.tsv",
        task / "dev.tsv",
        roberta_files / "roberta.json",
        max_seq_length=64,
        max_train_examples=16,
        max_eval_examples=8,
    )
    assert td.pad_id == 1 and all(r[0] == 0 and r[-1] == 2 for r in td.eval["input_ids"])
    b = pad_batch(td.eval, list(range(8)), td.pad_id)
    assert (b["input_ids"][b["attention_mask"] == 0] == 1).all() and (b["attention_mask"] == 0).any()


def test_data_vocab_may_be_a_directory_holding_the_tokenizer(roberta_files, shared_dir, tmp_path):
    """`--data.vocab DIR` is the tokenizer.json in it (before: IsADirectoryError, reported as an internal error);
    a directory holding neither file is one line before any work."""
    import shutil

    from pipeline.config import load_config, resolve_paths
    from pipeline.data.stages import check_paths

    (tmp_path / "tok").mkdir()
    shutil.copy(roberta_files / "roberta.json", tmp_path / "tok" / "tokenizer.json")
    (tmp_path / "empty").mkdir()
    book = str(shared_dir / "corpora/books/08_Ruth.txt")

    def cfg(vocab):
        return resolve_paths(load_config(None, ["--data.inputs", book, "--data.vocab", str(vocab)]), tmp_path)

    assert cfg(tmp_path / "tok").data.vocab == str(tmp_path / "tok" / "tokenizer.json")
    check_paths(cfg(tmp_path / "tok").data)
    with pytest.raises(VocabError, match=r"^tokenizer directory \S+empty has no tokenizer.json or vocab.txt$"):
        check_paths(cfg(tmp_path / "empty").data)


def test_the_training_sample_is_bounded_in_utf8_bytes(tmp_path):
    """data.tokenizer_sample_bytes bounds the sample in UTF-8 bytes (text of 2-byte and 3-byte characters yields
    about half and a third of the characters an ASCII file does), spread over the files; the old name
    data.vocab_sample_chars still sets it, and giving both with different figures is one line naming both."""
    from pipeline.config import ConfigError, DataConfig
    from pipeline.data.stages import _sample_texts, plan

    texts = {
        "ascii.txt": "plain words here " * 400,
        "cjk.txt": "漢字は日本語です。 " * 1000,
        "latin.txt": "été à Noël. " * 1000,
    }
    for name, text in texts.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    cfg = DataConfig(inputs=[str(tmp_path)], output=str(tmp_path / "out"), tokenizer_sample_bytes=3000)
    sample = list(_sample_texts(plan(cfg)))
    assert [len(t.encode("utf-8")) for t in sample] == [1001, 1001, 1001]  # 3,000 // 3 + 1 a file, sorted order
    assert [len(t) for t in sample] == [1001, 357, 750]  # ascii, cjk, latin: bytes, not characters
    assert all(texts[n].startswith(t) for n, t in zip(sorted(texts), sample))
    old = DataConfig(inputs=[str(tmp_path)], vocab_sample_chars=1234)
    assert (old.tokenizer_sample_bytes, old.vocab_sample_chars) == (1234, None)
    with pytest.raises(ConfigError, match=r"^data.vocab_sample_chars 10 and data.tokenizer_sample_bytes 20 are both"):
        DataConfig(inputs=[str(tmp_path)], vocab_sample_chars=10, tokenizer_sample_bytes=20)


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_a_later_phase_cuts_text_with_the_first_phases_tokenizer(shared_dir, tmp_path, kind):
    """Two phases of a job that trains its vocabulary (`phase_data_configs`, the data stages in process): the second
    phase's data is tokenized by the first phase's own tokenizer, every kind (a BPE's or Unigram's vocab.txt alone
    loaded as a WordPiece over the same tokens: 28% [UNK] in a CPU dry run of the modernbert-base job, found there),
    so neither phase's shards hold an unknown token."""
    import pyarrow.parquet as pq

    from pipeline.config import load_config, phase_data_configs
    from pipeline.data.dataset import PreparedDataset
    from pipeline.data.stages import data_stages
    from pipeline.data.tokenizer import tokenizer_kind
    from pipeline.runner.dag import run_graph

    books = [str(shared_dir / "corpora" / "books" / b) for b in ("08_Ruth.txt", "57_Phmn.txt")]
    cfg = load_config(
        None,
        ["--data.inputs", f"[{', '.join(books)}]", "--data.output", str(tmp_path / "d"), "--data.tokenizer", kind]
        + ["--data.vocab_size", "640", "--data.nsp", "false", "--data.num_shards", "1", "--data.dupe_factor", "1"]
        + ["--train.max_steps", "10", "--train.phases", "[{fraction: 0.5, max_seq_length: 64}, {max_seq_length: 128}]"],
    )
    dcfgs = phase_data_configs(cfg)
    assert dcfgs[1].vocab == f"{dcfgs[0].output}/{'vocab.txt' if kind == 'wordpiece' else 'tokenizer.json'}"
    for d in dcfgs:
        run_graph(data_stages(d), remote=False, log=lambda m: None)
    first, second = (PreparedDataset.load(d.output) for d in dcfgs)
    assert first.vocab_sha256 == second.vocab_sha256
    toks = [load_tokenizer(d.output + "/tokenizer.json") for d in dcfgs]
    assert [tokenizer_kind(t) for t in toks] == [kind, kind]
    text = (shared_dir / "corpora" / "books" / "08_Ruth.txt").read_text()[:3000]
    assert toks[1].encode(text).ids == toks[0].encode(text).ids
    assert toks[0].token_to_id("[UNK]") not in toks[1].encode(text).ids  # every character is in these books
    unk = toks[0].token_to_id("[UNK]")
    for ds in (first, second):  # and no shard of either phase holds an unknown token
        ids = pq.read_table([p for p, _ in ds.shards]).column("input_ids").to_pylist()
        assert sum(map(len, ids)) > 3000 and not any(unk in row for row in ids), ds.output
