"""Masking statistics over >= 100k real tokens (MiniLM's bert-base-uncased vocabulary), determinism, batch API."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.data.examples import split_sentences
from pipeline.data.masking import MaskingPolicy, mask_batch, mask_example, mask_rows
from pipeline.data.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def vocab(minilm_dir):
    return (minilm_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def sequences(minilm_dir, shared_dir):
    """~150k tokens of real text as [CLS] ... [SEP] ... [SEP] sequences of 128 tokens."""
    tok = load_tokenizer(minilm_dir / "vocab.txt")
    text = " ".join((shared_dir / "corpora/books" / n).read_text() for n in ("01_Ge.txt", "02_Exo.txt", "03_Lev.txt"))
    ids = np.concatenate([e.ids for e in tok.encode_batch(split_sentences(text), add_special_tokens=False)])
    seqs = []
    for k in range(0, len(ids) - 125, 125):
        body = ids[k : k + 125]
        seqs.append(np.concatenate([[101], body[:60], [102], body[60:], [102]]).astype(np.int32))
    assert sum(len(s) for s in seqs) >= 100_000
    return seqs


def _mask_all(seqs, policy, seed=1, epoch=0):
    m, p, labels = mask_rows(seqs, np.arange(len(seqs)), policy, seed=seed, epoch=epoch)
    return list(zip(m, p, labels))


@pytest.mark.parametrize("whole_word", [False, True])
def test_masking_statistics(sequences, vocab, whole_word):
    policy = MaskingPolicy.from_vocab(vocab, whole_word=whole_word)
    special, cont, _ = policy.tables()
    out = _mask_all(sequences, policy)
    total = sum(len(s) for s in sequences)
    masked = sum(len(p) for _, p, _ in out)
    assert abs(masked / total - 0.15) <= 0.005, masked / total
    n_mask = n_same = n_rand = 0
    for s, (m, pos, lab) in zip(sequences, out):
        assert len(pos) <= policy.max_predictions_per_seq
        assert np.all(np.diff(pos) > 0)
        assert not special[s[pos]].any(), "a special token was masked"
        np.testing.assert_array_equal(lab, s[pos])
        untouched = np.setdiff1d(np.arange(len(s)), pos)
        np.testing.assert_array_equal(m[untouched], s[untouched])
        n_mask += int((m[pos] == policy.mask_token_id).sum())
        n_same += int((m[pos] == s[pos]).sum())
        n_rand += int(((m[pos] != s[pos]) & (m[pos] != policy.mask_token_id)).sum())
        assert not special[m[pos][m[pos] != policy.mask_token_id]].any(), "a special token was drawn as replacement"
        if whole_word:  # every word is masked whole: no masked/unmasked boundary inside a word
            sel = np.zeros(len(s), bool)
            sel[pos] = True
            for j in range(1, len(s)):
                if cont[s[j]] and not special[s[j - 1]]:
                    assert sel[j] == sel[j - 1], f"word split by the mask at {j}"
    assert n_mask + n_same + n_rand == masked
    assert abs(n_mask / masked - 0.8) <= 0.02
    assert abs(n_same / masked - 0.1) <= 0.02
    assert abs(n_rand / masked - 0.1) <= 0.02


def test_whole_word_groups_are_actually_exercised(sequences, vocab):
    """The corpus has multi-piece words, so the whole-word test above is not vacuous."""
    policy = MaskingPolicy.from_vocab(vocab, whole_word=True)
    _, cont, _ = policy.tables()
    out = _mask_all(sequences, policy)
    masked_cont = sum(int(cont[s[p]].sum()) for s, (_, p, _) in zip(sequences, out))
    assert masked_cont > 100


def test_max_predictions_per_seq_is_respected(sequences, vocab):
    policy = MaskingPolicy.from_vocab(vocab, max_predictions_per_seq=5)
    out = _mask_all(sequences[:200], policy)
    assert all(len(p) == 5 for _, p, _ in out)  # round(128 * 0.15) = 19 > 5: the cap binds


def test_never_masks_only_special_tokens(vocab):
    policy = MaskingPolicy.from_vocab(vocab)
    m, p, _ = mask_example(np.array([101, 102, 102], np.int32), policy, seed=0, epoch=0, example_id=0)
    assert len(p) == 0 and m.tolist() == [101, 102, 102]


def test_hand_computed_small_case():
    p = MaskingPolicy(
        mask_rate=0.5,
        max_predictions_per_seq=2,
        whole_word=False,
        vocab_size=10,
        mask_token_id=4,
        special_ids=(0, 1, 2, 3, 4),
    )
    ids, pos, lab = mask_example(np.array([2, 7, 8, 3], np.int32), p, seed=0, epoch=0, example_id=1)
    # two candidates (positions 1, 2), round(4 * 0.5) = 2 to predict: both chosen
    assert pos.tolist() == [1, 2] and lab.tolist() == [7, 8]
    assert ids[0] == 2 and ids[3] == 3


def test_mask_batch_deterministic_per_example_and_epoch(sequences, vocab):
    policy = MaskingPolicy.from_vocab(vocab)
    rows = sequences[:64]
    ids = np.empty(len(rows), dtype=object)
    ids[:] = rows
    batch = {"input_ids": ids, "example_id": np.arange(1000, 1064, dtype=np.int64)}
    a = mask_batch(batch, policy, seed=3, epoch=0)
    b = mask_batch(batch, policy, seed=3, epoch=0)
    c = mask_batch(batch, policy, seed=3, epoch=1)
    for k in ("input_ids", "masked_lm_positions", "masked_lm_ids"):
        assert all(np.array_equal(x, y) for x, y in zip(a[k], b[k]))
    assert sum(not np.array_equal(x, y) for x, y in zip(a["masked_lm_positions"], c["masked_lm_positions"])) > 50
    # the same example in another batch position (another worker, another batch) gets the same mask
    perm = np.arange(64)[::-1]
    ids_r = np.empty(64, dtype=object)
    ids_r[:] = [rows[i] for i in perm]
    r = mask_batch({"input_ids": ids_r, "example_id": batch["example_id"][perm]}, policy, seed=3, epoch=0)
    for j, i in enumerate(perm):
        assert np.array_equal(r["masked_lm_positions"][j], a["masked_lm_positions"][i])
    # input is untouched, 2-D batches keep their shape
    assert np.array_equal(batch["input_ids"][0], rows[0])
    two_d = mask_batch({"input_ids": np.stack(rows), "example_id": batch["example_id"]}, policy, seed=3, epoch=0)
    assert two_d["input_ids"].shape == (64, 128)
    assert np.array_equal(two_d["input_ids"][5], a["input_ids"][5])


def test_policy_from_vocab_errors():
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        MaskingPolicy.from_vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a"])
    with pytest.raises(ValueError, match="mask_rate"):
        MaskingPolicy(mask_rate=1.5)


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram", "wordpiece ~~", "wordpiece guessed"])
def test_whole_word_masking_for_every_tokenizer_kind(shared_dir, kind):
    """On the same sentences, each kind's word starts (`##` continuations, `Ġ`, `▁`), read from the tokenizer
    (`Specials.words`), group a word's pieces: every whitespace word is masked whole or not at all, and multi-piece
    words are masked. "wordpiece ~~": a WordPiece whose tokenizer.json makes `~~` its continuation prefix (nothing
    assumes `##`); "wordpiece guessed": no recorded rule (data prepared before it was), told by the pieces."""
    import bisect
    import json
    import re

    from tokenizers import Tokenizer

    from pipeline.data.specials import specials
    from pipeline.data.tokenizer import train_tokenizer, vocab_list

    text = (shared_dir / "corpora/books/01_Ge.txt").read_text()
    tok = train_tokenizer(text.split("\n\n"), kind.split()[0], vocab_size=400, lowercase=False)
    if kind == "wordpiece ~~":
        spec = json.loads(tok.to_str())
        spec["model"]["continuing_subword_prefix"] = spec["decoder"]["prefix"] = "~~"
        spec["model"]["vocab"] = {
            "~~" + t[2:] if t.startswith("##") else t: i for t, i in spec["model"]["vocab"].items()
        }
        tok = Tokenizer.from_str(json.dumps(spec))
        assert tok.encode("Abimelech", add_special_tokens=False).tokens[1].startswith("~~")
    sp = specials(tok)
    assert sp.words == {"wordpiece": ("continuation", "##"), "bpe": ("start", "\u0120"),
                        "unigram": ("start", "\u2581"), "wordpiece ~~": ("continuation", "~~"),
                        "wordpiece guessed": ("continuation", "##")}[kind]  # fmt: skip
    words = re.sub(r"[^A-Za-z ]+", " ", " ".join(text.split()[:6000])).split()
    sentences = [" ".join(words[k : k + 20]) for k in range(0, len(words), 20)]
    if kind == "wordpiece guessed":
        sp = dataclasses.replace(sp, words=())
    policy = MaskingPolicy.from_vocab(
        vocab_list(tok), whole_word=True, mask_rate=0.3, max_predictions_per_seq=40, specials=sp
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    rows, word_of = [], []
    for s in sentences:
        enc = tok.encode(s, add_special_tokens=False)
        rows.append(np.array([cls, *enc.ids, sep], np.int32))
        starts = [0] + [i for i, c in enumerate(s) if c == " "]  # a space belongs to the word after it
        word_of.append([-1] + [bisect.bisect_right(starts, a) - 1 for a, _ in enc.offsets] + [-2])
    multi = 0
    for row, w, (_, pos, _) in zip(rows, word_of, _mask_all(rows, policy)):
        sel = np.zeros(len(row), bool)
        sel[pos] = True
        for word in set(w) - {-1, -2}:
            at = [j for j, x in enumerate(w) if x == word]
            assert len(set(sel[at])) == 1, (kind, tok.decode(row[at].tolist()), sel[at])
            multi += len(at) > 1 and bool(sel[at[0]])
    assert multi > 200, multi


def test_word_marks_are_read_from_the_tokenizers_model_and_pre_tokenizer():
    """Each way a tokenizer.json can mark words, read from its model and pre-tokenizer (a Sequence searched)."""
    from pipeline.data.specials import word_marks

    bytelevel = {"type": "ByteLevel", "add_prefix_space": False}
    cases = [
        ({"model": {"type": "WordPiece"}}, ("continuation", "##")),  # WordPiece's own default
        ({"model": {"type": "WordPiece", "continuing_subword_prefix": "@@"}}, ("continuation", "@@")),
        (
            {"model": {"type": "BPE", "continuing_subword_prefix": "##"}, "pre_tokenizer": bytelevel},
            ("continuation", "##"),
        ),
        (
            {"model": {"type": "BPE"}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [bytelevel]}},
            ("start", "Ġ"),
        ),
        ({"model": {"type": "Unigram"}, "pre_tokenizer": {"type": "Metaspace", "replacement": "_"}}, ("start", "_")),
        ({"model": {"type": "Unigram"}, "pre_tokenizer": {"type": "Metaspace"}}, ("start", "\u2581")),
        ({"model": {"type": "WordLevel"}, "pre_tokenizer": {"type": "Whitespace"}}, ("pieces", "")),
        ({"model": {"type": "BPE"}, "pre_tokenizer": None}, ("pieces", "")),
    ]
    for spec, want in cases:
        assert word_marks(spec) == want, spec
    from pipeline.data.masking import _special_and_continuations

    assert _special_and_continuations(["[PAD]", "a", "b"], ("pieces", "")) == ((0,), ())  # every piece a word
