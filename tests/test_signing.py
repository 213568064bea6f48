"""pipeline/data/signing.py: the streamed exact keys and signatures are byte for byte the one-shot ones (and the
values pinned before signing streamed), whatever the window; windows never cut a word; rensa's R-MinHash of a
set is the elementwise minimum of its parts'."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
import sys

import numpy as np
import pytest
from rensa import RMinHash

from pipeline.data.signing import DedupParams
from pipeline.data.signing import (
    exact_keys,
    normalise,
    records,
    shingle_hashes,
    signatures,
    signatures_of_shingles,
    windows,
)

EDGE = [
    "",
    " ",
    "a",
    "A b",
    "one two three four",
    "one two three four five",
    "one two three four five six",
    "Straße\u00a0 IS\r\nhere\u2003and   ΣΑΣ  ΌΣΟΣ \u3000 end\u2028x\x1cy\x85z",
    "\t lead and trail \n",
    "x " * 3000,
    "İstanbul ǅ ﬁ ﬃ",
]
"""Texts shorter than a shingle, empty, all whitespace, Unicode whitespace and case folds that change length."""


@pytest.fixture(scope="module")
def texts(shared_dir) -> list[str]:
    """EDGE, three shared books and the first 40 wiki articles: the texts the values below were pinned on."""
    books = [
        (shared_dir / "corpora/books" / n).read_text(encoding="utf-8")
        for n in ("08_Ruth.txt", "31_Obad.txt", "57_Phmn.txt")
    ]
    with gzip.open(shared_dir / "corpora/wiki/pydocs.jsonl.gz", "rt", encoding="utf-8") as f:
        wiki = [json.loads(line)["text"] for _, line in zip(range(40), f)]
    return EDGE + books + wiki


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


@pytest.mark.parametrize(
    "window_chars, batch_shingles, batch_words", [(1 << 20, 1 << 21, 1 << 16), (37, 50, 7), (300, 1, 1)]
)
@pytest.mark.parametrize(
    "params, sigs_digest",
    [
        (DedupParams(), "adab3bec9d7379ee"),
        (DedupParams(num_perm=64, seed=5, shingle_size=3), "8cce5f1c6eff9e5b"),
        (DedupParams(num_perm=16, shingle_size=1), "c38abcaa20cde03b"),
    ],
)
def test_records_are_the_values_pinned_before_streaming(
    texts, params, sigs_digest, window_chars, batch_shingles, batch_words
):
    """The digests were taken with the one-shot code (whole normalised text, all shingles in one rensa call), before
    documents were shingled in batches of words (a batch of 1 or 7 words flushes inside nearly every document)."""
    keys, sigs = records(texts, params, window_chars, batch_shingles, batch_words)
    assert (_digest(keys), _digest(sigs)) == ("45fe6a6516d58705", sigs_digest)
    assert _digest(signatures(iter(texts), params, window_chars, batch_shingles, batch_words)) == sigs_digest


@pytest.mark.parametrize("window_chars", [1, 5, 64, 4096])
def test_streamed_equals_one_shot(texts, window_chars):
    """Against the definitions: blake2b of normalise(text), rensa over all of shingle_hashes(text) at once."""
    params = DedupParams(num_perm=32, shingle_size=4)
    sample = EDGE + random.Random(window_chars).sample(texts[len(EDGE) :], 8)
    keys, sigs = records(sample, params, window_chars=window_chars, batch_shingles=97, batch_words=window_chars + 2)
    assert keys.tobytes() == b"".join(hashlib.blake2b(normalise(t).encode(), digest_size=16).digest() for t in sample)
    one_shot = signatures_of_shingles([shingle_hashes(t, params.shingle_size) for t in sample], params)
    assert sigs.tobytes() == one_shot.tobytes()
    assert exact_keys(sample, window_chars).tobytes() == keys.tobytes()


def test_exact_mode_signs_nothing():
    keys, sigs = records(["a b c", "A  B C"], DedupParams(mode="exact"))
    assert sigs is None and (keys[0] == keys[1]).all()
    assert records([], DedupParams())[1].shape == (0, 128)


@pytest.mark.parametrize("window_chars", [1, 2, 3, 10])
def test_windows_never_cut_a_word(window_chars):
    spaces = "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())
    rng = random.Random(window_chars)
    text = "".join(
        rng.choice(["Ab", "ß", "ǅx", "ﬁ", "word", rng.choice(spaces), rng.choice(spaces) * 3]) for _ in range(2000)
    )
    words = [w for ws in windows(text, window_chars) for w in ws]
    assert " ".join(words) == normalise(text)


def test_regex_whitespace_is_what_str_split_splits_on():
    """windows cuts at `\\s`; str.split() splits on str.isspace(): the same characters (Py_UNICODE_ISSPACE)."""
    space = re.compile(r"\s")
    chars = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    assert [c for c in chars if space.match(c)] == [c for c in chars if c.isspace()]


def test_minhash_of_a_set_is_the_minimum_over_its_parts():
    """Why windows may be signed apart: rensa's R-MinHash of a set is the elementwise minimum of its parts' (in
    any split, a shingle repeated or not)."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.integers(0, 2**64 - 1, int(rng.integers(1, 3000)), dtype=np.uint64)
        x = np.concatenate([x, x[: len(x) // 3]])  # repeated shingles, as a text repeats 5-grams
        whole = RMinHash.digest_matrix_from_flat_token_hashes(x, np.array([0, len(x)], np.uint64), 64, 3).to_rows()
        cuts = np.sort(rng.choice(np.arange(1, len(x)), size=min(5, len(x) - 1), replace=False))
        parts = RMinHash.digest_matrix_from_flat_token_hashes(x, np.r_[0, cuts, len(x)].astype(np.uint64), 64, 3)
        assert (np.array(parts.to_rows(), np.uint32).reshape(-1, 64).min(axis=0) == np.array(whole, np.uint32)).all()
