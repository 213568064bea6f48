"""Sentence splitting, truncate_seq_pair against Google's list version, NSP statistics and provenance, packing."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pipeline.data.examples import (
    RandomPool,
    create_instances_from_document,
    derive_seed,
    document_windows,
    pack_sentences,
    split_sentences,
    truncate_seq_pair,
)
from pipeline.data.tokenizer import load_tokenizer

CLS, SEP = 101, 102
STRIDE = 1_000_000  # document d's k-th token has id (d + 1) * STRIDE + k: provenance is readable from the ids


def google_truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng):
    """Verbatim from google-research/bert create_pretraining_data.py (the reference)."""
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_num_tokens:
            break
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        assert len(trunc_tokens) >= 1
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


@pytest.mark.parametrize("la,lb,m", [(3, 2, 10), (200, 5, 125), (70, 90, 125), (1, 400, 61), (125, 125, 125)])
def test_truncate_seq_pair_matches_google(la, lb, m):
    for seed in range(20):
        a, b = list(range(la)), list(range(1000, 1000 + lb))
        google_truncate_seq_pair(a, b, m, random.Random(seed))
        a0, a1, b0, b1 = truncate_seq_pair(la, lb, m, random.Random(seed))
        assert list(range(la))[a0:a1] == a and list(range(1000, 1000 + lb))[b0:b1] == b


def test_split_sentences():
    text = 'He said "Go." Then 3 men left! Did they?  Yes.\n\nA new\nparagraph, e.g. this one.'
    assert split_sentences(text) == [
        'He said "Go."',
        "Then 3 men left!",
        "Did they?",
        "Yes.",
        "A new paragraph, e.g. this one.",
    ]
    assert split_sentences("   \n\n ") == []


@pytest.fixture(scope="module")
def documents(minilm_dir, shared_dir):
    """Real sentence lengths (books + wiki), ids replaced by (doc, position) codes: >= 100k tokens."""
    import gzip
    import json

    tok = load_tokenizer(minilm_dir / "vocab.txt")
    texts = [(shared_dir / "corpora/books" / n).read_text() for n in ("08_Ruth.txt", "01_Ge.txt", "40_Mat.txt")]
    with gzip.open(shared_dir / "corpora/wiki/pydocs.jsonl.gz", "rt") as f:
        texts += [json.loads(line)["text"] for _, line in zip(range(120), f)]
    docs = []
    for d, text in enumerate(texts):
        lens = [len(e.ids) for e in tok.encode_batch(split_sentences(text), add_special_tokens=False)]
        lens = [n for n in lens if n]
        ends = np.cumsum(lens)
        flat = (d + 1) * STRIDE + np.arange(ends[-1], dtype=np.int64)
        docs.append([s.astype(np.int32) for s in np.split(flat, ends[:-1])])
    assert sum(sum(len(s) for s in doc) for doc in docs) >= 100_000
    return docs


def _pool(docs, window=128):
    return RandomPool.from_windows([(d, w) for d, doc in enumerate(docs) for w in document_windows(doc, window)])


@pytest.mark.parametrize("max_seq_length", [128, 64])
def test_nsp_pairs_statistics_and_provenance(documents, max_seq_length):
    pool = _pool(documents)
    n_random = n = 0
    for d, doc in enumerate(documents):
        rng = random.Random(derive_seed(7, "pairs", d, 0))
        for inst in create_instances_from_document(
            doc, d, pool, max_seq_length=max_seq_length, short_seq_prob=0.1, rng=rng, cls_id=CLS, sep_id=SEP
        ):
            ids, types = inst.input_ids, inst.token_type_ids
            assert len(ids) <= max_seq_length and ids.dtype == np.int32
            seps = np.flatnonzero(ids == SEP)
            assert ids[0] == CLS and len(seps) == 2 and seps[1] == len(ids) - 1
            a, b = ids[1 : seps[0]].astype(np.int64), ids[seps[0] + 1 : -1].astype(np.int64)
            assert len(a) >= 1 and len(b) >= 1
            assert types[: seps[0] + 1].tolist() == [0] * (seps[0] + 1) and set(types[seps[0] + 1 :]) == {1}
            da, db = set(a // STRIDE - 1), set(b // STRIDE - 1)
            assert da == {d}
            assert np.all(np.diff(a) == 1) and np.all(np.diff(b) == 1)  # each segment is contiguous text
            n += 1
            if inst.next_sentence_label == 1:
                n_random += 1
                assert len(db) == 1 and db != {d}, "a random B from the same document"
            else:
                assert inst.next_sentence_label == 0 and db == {d} and b[0] > a[-1], "IsNext B is not after A"
    assert n > 1000
    assert abs(n_random / n - 0.5) <= 0.03, n_random / n


def test_nsp_is_deterministic_and_random_b_comes_from_many_documents(documents):
    pool = _pool(documents)
    kw = dict(max_seq_length=128, short_seq_prob=0.1, cls_id=CLS, sep_id=SEP)
    a = create_instances_from_document(documents[1], 1, pool, rng=random.Random(5), **kw)
    b = create_instances_from_document(documents[1], 1, pool, rng=random.Random(5), **kw)
    assert [x.input_ids.tolist() for x in a] == [x.input_ids.tolist() for x in b]
    sources = {int(x.input_ids[-2]) // STRIDE - 1 for x in a if x.next_sentence_label == 1}
    assert len(sources) >= 20  # not only a neighbour: B is drawn from the whole pool


def test_pool_pick_other():
    pool = RandomPool.from_windows([(5, [np.array([1])]), (5, [np.array([2])]), (9, [np.array([3])])])
    rng = random.Random(0)
    assert all(pool.doc_ids[pool.pick_other(5, rng)] == 9 for _ in range(200))
    assert RandomPool.from_windows([(5, [np.array([1])])]).pick_other(5, rng) is None
    assert pool.sentences(2)[0].tolist() == [3]


def test_single_document_corpus_gives_only_isnext():
    doc = [np.arange(i * 10, i * 10 + 10, dtype=np.int32) for i in range(30)]
    pool = RandomPool.from_windows([(0, w) for w in document_windows(doc, 128)])
    insts = create_instances_from_document(
        doc, 0, pool, max_seq_length=64, short_seq_prob=0.0, rng=random.Random(1), cls_id=CLS, sep_id=SEP
    )
    assert insts and all(x.next_sentence_label == 0 for x in insts)


def test_pack_sentences_keeps_every_token_in_order(documents):
    doc = documents[0]
    out = pack_sentences(doc, max_seq_length=64, short_seq_prob=0.0, rng=random.Random(0), cls_id=CLS, sep_id=SEP)
    body = np.concatenate([x.input_ids[1:-1] for x in out])
    np.testing.assert_array_equal(body, np.concatenate(doc))
    assert all(len(x.input_ids) <= 64 and x.next_sentence_label == -1 and not x.token_type_ids.any() for x in out)
    assert all(x.input_ids[0] == CLS and x.input_ids[-1] == SEP for x in out)
    # whole sentences: a sentence shorter than the room never straddles two examples
    starts = set(np.cumsum([0] + [len(s) for s in doc])[:-1].tolist())
    k = 0
    for x in out[:-1]:
        k += len(x.input_ids) - 2
        assert k in starts or any(len(s) > 62 for s in doc)


@pytest.mark.parametrize("max_chars", [1000, 5000, 40_000])
def test_split_document_covers_the_text_at_paragraph_boundaries(shared_dir, max_chars):
    from pipeline.data.examples import split_document

    text = (shared_dir / "corpora/books/08_Ruth.txt").read_text()
    pieces = list(split_document(text, max_chars))
    assert "".join(pieces) == text and len(pieces) >= len(text) // max_chars
    assert all(len(p) <= max_chars for p in pieces)
    # after a blank line where the window's second half has one (chapters here are ~4k chars), else a sentence
    assert all(p.endswith("\n\n") or p.rstrip(" ").rstrip("\"'\u201d\u2019)]")[-1] in ".?!" for p in pieces[:-1])
    if max_chars >= 10_000:
        assert all(p.endswith("\n\n") for p in pieces[:-1])
    # the sentences of the pieces are the sentences of the document
    assert [s for p in pieces for s in split_sentences(p)] == split_sentences(text)


def test_split_document_falls_back_to_sentences_then_whitespace_then_a_hard_cut():
    from pipeline.data.examples import split_document

    one_para = "Alpha beta gamma. " * 200  # no blank line: cut after a sentence end
    pieces = list(split_document(one_para, 1000))
    assert "".join(pieces) == one_para and all(p.endswith(". ") for p in pieces[:-1])
    assert [s for p in pieces for s in split_sentences(p)] == split_sentences(one_para)
    words = "word " * 1000  # no sentence end: after whitespace
    assert all(p.endswith(" ") for p in list(split_document(words, 1000))[:-1])
    assert [len(p) for p in split_document("x" * 2500, 1000)] == [1000, 1000, 500]
    assert list(split_document("short", 1000)) == ["short"]


def test_long_document_is_tokenized_in_pieces_with_every_token(shared_dir, minilm_dir, tmp_path):
    """A book cut into 20k-character pieces: one document written, several pieces, the same tokens in the same
    order as the uncut book (cuts fall between paragraphs), bounded chunks."""
    import pyarrow.parquet as pq

    from pipeline.config import DataConfig
    from pipeline.data.passes import tokenize_file
    from pipeline.data.sources import expand_inputs
    from pipeline.data.tokenizer import load_tokenizer

    files, _ = expand_inputs([str(shared_dir / "corpora/books/41_Mark.txt")])
    tok = load_tokenizer(minilm_dir / "vocab.txt")
    whole = tokenize_file(files[0], tok, DataConfig(chunk_chars=10**9), str(tmp_path / "whole"))
    cut = tokenize_file(files[0], tok, DataConfig(chunk_chars=50_000, max_document_chars=20_000), str(tmp_path / "cut"))
    assert whole["documents_written"] == cut["documents_written"] == 1 and whole["pieces"] == 1
    assert cut["pieces"] >= 4 and len(cut["chunks"]) >= 2 and cut["tokens"] == whole["tokens"]
    assert cut["sentences"] == whole["sentences"]

    def ids(stats):
        return [
            t for c in stats["chunks"] for row in pq.read_table(c["path"]).column("tokens").to_pylist() for t in row
        ]

    assert ids(cut) == ids(whole)
    doc_ids = [d for c in cut["chunks"] for d in pq.read_table(c["path"]).column("doc_id").to_pylist()]
    assert doc_ids[0] == files[0].index << 32 and len(set(doc_ids)) == len(doc_ids) == cut["pieces"]


def test_pack_documents_fills_rows_and_cuts_documents_at_row_ends():
    from pipeline.data.examples import MIN_PIECE, pack_documents

    assert MIN_PIECE == 16
    docs = [[np.arange(10, 15), np.arange(15, 20)], [np.arange(100, 130)], [np.arange(200, 203)]]
    rows = pack_documents(docs, max_seq_length=24, cls_id=1, sep_id=2)
    # row 0: doc 0 (10 tokens + CLS/SEP); the 10 tokens of room left would cut doc 1 into a piece under MIN_PIECE,
    # so the row ends. Row 1: 22 of doc 1's 30. Row 2: doc 1's last 8, then doc 2 whole.
    assert [d.tolist() for _, d in rows] == [[12], [24], [10, 5]]
    assert rows[1][0].tolist() == [1, *range(100, 122), 2]
    assert rows[2][0].tolist() == [1, *range(122, 130), 2, 1, 200, 201, 202, 2]
    # with room for a piece of at least MIN_PIECE, a row is filled to the last token
    wide = pack_documents(docs, max_seq_length=30, cls_id=1, sep_id=2)
    assert [d.tolist() for _, d in wide] == [[12, 18], [16, 5]]
    text = [t for r, _ in wide for t in r.tolist() if t > 2]
    assert text == [t for d in docs for s in d for t in s.tolist()]  # every text token once, in order
