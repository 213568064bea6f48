"""Masked-LM masking: the policy as configuration and one pure function used both at preparation (static) and
at load time (dynamic).

Google's `create_masked_lm_predictions`: candidates are all non-special positions (grouped with their `##`
continuations under whole-word masking); `num_to_predict = min(max_predictions_per_seq, max(1,
round(len * mask_rate)))`; groups are taken in random order, skipping a group that would overshoot; each chosen
position becomes [MASK] 80%, stays 10%, becomes a random token 10%. Departures: the random token is drawn from
the non-special vocabulary (Google draws from all of it, [PAD] and [unusedN] included), and a `##` token only
joins the group of the position right before it.

Randomness is a counter-based hash (splitmix64) of (seed, epoch, example_id, position), so dynamic masking
gives every example a fresh mask each epoch, the same on every worker and in any batch, static masking is the
same call with epoch 0, and a whole batch is masked with vectorised numpy (no per-example RNG objects).

    >>> p = MaskingPolicy(mask_rate=0.5, max_predictions_per_seq=2, whole_word=False, vocab_size=10,
    ...                   mask_token_id=4, special_ids=(0, 1, 2, 3, 4))
    >>> ids, pos, lab = mask_example(np.array([2, 7, 8, 3], np.int32), p, seed=0, epoch=0, example_id=1)
    >>> pos.tolist(), lab.tolist()
    ([1, 2], [7, 8])
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.specials import Specials, VocabError, word_marks_of_pieces
from pipeline.data.tokenizer import read_vocab


@dataclass(frozen=True)
class MaskingPolicy:
    mask_rate: float = 0.15
    """Fraction of tokens selected for prediction."""
    max_predictions_per_seq: int = 20
    """Cap on masked positions per example."""
    whole_word: bool = False
    """Mask continuations (`##x`; a BPE piece without `Ġ`, a Unigram piece without `▁`: the tokenizer's own rule,
    `Specials.words`) with their word."""
    vocab_size: int = 30522
    mask_token_id: int = 103
    special_ids: tuple[int, ...] = (0, 100, 101, 102, 103)
    """Never masked, never drawn as a random replacement."""
    continuation_ids: tuple[int, ...] = ()
    """Ids of tokens that continue the word before them (whole-word grouping; see `from_vocab`)."""
    _tables: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.mask_rate < 1.0:
            raise ValueError(f"mask_rate {self.mask_rate} is not in (0, 1)")
        if self.max_predictions_per_seq < 1:
            raise ValueError(f"max_predictions_per_seq {self.max_predictions_per_seq} < 1")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the vocabulary ({self.vocab_size})")

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(is_special[vocab], is_continuation[vocab], replacement ids) — built once per process."""
        if not self._tables:
            special = np.zeros(self.vocab_size, bool)
            special[list(self.special_ids)] = True
            cont = np.zeros(self.vocab_size, bool)
            cont[list(self.continuation_ids)] = True
            self._tables["t"] = (special, cont, np.flatnonzero(~special).astype(np.int32))
        return self._tables["t"]

    @classmethod
    def from_vocab(
        cls,
        vocab: list[str] | str | Path,
        *,
        mask_rate: float = 0.15,
        max_predictions_per_seq: int = 20,
        whole_word: bool = False,
        specials: Specials | None = None,
    ) -> MaskingPolicy:
        """Policy for a vocabulary (a vocab.txt path or its token list) and its tokenizer's `Specials` (the mask
        token, the ids never masked); without them, BERT's special tokens by name, which must be in it."""
        if not isinstance(vocab, list):
            vocab = read_vocab(vocab)
        if specials is None:
            try:
                specials = Specials.bert(vocab)
            except VocabError as e:
                raise ValueError(str(e)) from None
        special, cont = _special_and_continuations(vocab, specials.words)
        special = tuple(sorted(set(special) | set(specials.never_masked) | set(specials.ids.values())))
        skip = set(special)
        return cls(
            mask_rate=mask_rate,
            max_predictions_per_seq=max_predictions_per_seq,
            whole_word=whole_word,
            vocab_size=len(vocab),
            mask_token_id=specials.ids["mask"],
            special_ids=special,
            continuation_ids=tuple(i for i in cont if i not in skip),
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "mask_rate": self.mask_rate,
                "max_predictions_per_seq": self.max_predictions_per_seq,
                "whole_word": self.whole_word,
                "vocab_size": self.vocab_size,
                "mask_token_id": self.mask_token_id,
            }
        )


_TRAINED_SPECIAL = re.compile(r"\[(PAD|UNK|CLS|SEP|MASK|unused\d+)\]")


def _special_and_continuations(
    vocab: list[str], words: tuple[str, ...] = ()
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(special ids, ids that continue the word before them) for a vocabulary of any kind. `words` is the
    tokenizer's own rule (`specials.word_marks`, recorded in `Specials.words`):

    - ("continuation", p): every bracketed token ([PAD], [unused0], ...) is special; a piece starting `p` continues;
    - ("start", m): a piece without the leading `m` continues (byte-level BPE's `Ġ`: punctuation joins its word;
      Unigram's `▁`);
    - ("pieces", ""): no piece continues.

    Special in the last two: BERT's five and [unusedN] (`train_tokenizer`'s padding); the tokenizer's own specials
    are added by `MaskingPolicy.from_vocab`. Without `words` (data prepared before they were recorded) the rule is
    told by the pieces (`specials.word_marks_of_pieces`).

        >>> _special_and_continuations(["[PAD]", "[CLS]", "Ġthe", "re", "Ġcat", ","])
        ((0, 1), (3, 5))
        >>> _special_and_continuations(["[PAD]", "the", "~~re"], ("continuation", "~~"))
        ((0,), (2,))
    """
    kind, mark = words or word_marks_of_pieces(vocab)
    if kind == "continuation":
        special = tuple(i for i, t in enumerate(vocab) if t.startswith("[") and t.endswith("]"))
        return special, tuple(i for i, t in enumerate(vocab) if t.startswith(mark))
    special = tuple(i for i, t in enumerate(vocab) if _TRAINED_SPECIAL.fullmatch(t))
    if kind == "pieces":
        return special, ()
    skip = set(special)
    return special, tuple(i for i, t in enumerate(vocab) if i not in skip and not t.startswith(mark))


_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)
_U64 = np.uint64


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLD
        z = (z ^ (z >> _U64(30))) * _M1
        z = (z ^ (z >> _U64(27))) * _M2
        return z ^ (z >> _U64(31))


def _row_keys(seed: int, epoch: int, example_ids: np.ndarray) -> np.ndarray:
    s = _mix(np.array([int(seed) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    s = _mix(s ^ _U64(int(epoch) & 0xFFFFFFFFFFFFFFFF))
    return _mix(s ^ np.asarray(example_ids).astype(np.int64).view(np.uint64))


def _stream(keys: np.ndarray, pos: np.ndarray, stream: int) -> np.ndarray:
    """Counter-based random bits for (row key, position, stream): the same wherever and in whatever batch."""
    with np.errstate(over="ignore"):
        return _mix(keys ^ (pos.astype(np.uint64) * _GOLD + _U64(stream) * _M1))


def _uniform(bits: np.ndarray) -> np.ndarray:
    return (bits >> _U64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def mask_rows(
    rows: list[np.ndarray], example_ids: np.ndarray, policy: MaskingPolicy, *, seed: int, epoch: int
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Mask many examples at once: (masked ids, positions ascending, original ids at them) per row.

    Vectorised over the batch; the random numbers are a hash of (seed, epoch, example_id, position), so each
    row's mask does not depend on the batch it is in.
    """
    special, cont, replacements = policy.tables()
    lens = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    if len(rows) == 0:
        return [], [], []
    if len(rows) >= 1 << 24:
        raise ValueError(f"mask_rows takes fewer than 2**24 rows per call, got {len(rows)}")
    flat = np.concatenate(rows).astype(np.int32, copy=False) if lens.sum() else np.zeros(0, np.int32)
    n = len(flat)
    starts = np.zeros(len(rows), dtype=np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    row = np.repeat(np.arange(len(rows)), lens)
    pos = np.arange(n, dtype=np.int64) - starts[row]
    keys = _row_keys(seed, epoch, example_ids)[row]
    prio = _stream(keys, pos, 1)
    cand = ~special[flat]
    # Python's round(), like Google's int(round(len * rate)): halves go to even
    ntp = np.minimum(policy.max_predictions_per_seq, np.maximum(1, np.rint(lens * policy.mask_rate).astype(np.int64)))
    selected = np.zeros(n, dtype=bool)
    if not policy.whole_word:
        # one sort by (row, priority): row in the high 24 bits, 39 random bits below, non-candidates last
        key = (row.astype(np.uint64) << _U64(40)) | np.where(cand, prio >> _U64(25), _U64((1 << 40) - 1))
        order = np.argsort(key, kind="stable")
        rank = np.arange(n) - starts[row[order]]
        take = (rank < ntp[row[order]]) & cand[order]
        selected[order[take]] = True
    else:
        prev_adjacent = np.zeros(n, dtype=bool)
        prev_adjacent[1:] = cand[:-1] & (pos[1:] > 0)
        start = cand & ~(cont[flat] & prev_adjacent)  # a word starts here; `##` pieces join the word before
        gid = np.cumsum(start) - 1  # group of each candidate
        g_pos = np.flatnonzero(start)
        g_size = np.bincount(gid[cand], minlength=len(g_pos))
        g_row = row[g_pos]
        g_order = np.lexsort((prio[g_pos], g_row))
        chosen = np.zeros(len(g_pos), dtype=bool)
        bounds = np.searchsorted(g_row[g_order], np.arange(len(rows) + 1))
        for r in range(len(rows)):
            got, limit = 0, int(ntp[r])
            for g in g_order[bounds[r] : bounds[r + 1]]:
                if got >= limit:
                    break
                if got + g_size[g] > limit:
                    continue  # Google skips a whole word that would overshoot
                chosen[g] = True
                got += int(g_size[g])
        selected[cand] = chosen[gid[cand]]
    sel = np.flatnonzero(selected)
    u = _uniform(_stream(keys[sel], pos[sel], 2))
    pick = replacements[(_stream(keys[sel], pos[sel], 3) % _U64(len(replacements))).astype(np.int64)]
    masked = flat.copy()
    masked[sel] = np.where(u < 0.8, policy.mask_token_id, np.where(u < 0.9, flat[sel], pick))
    counts = np.bincount(row[sel], minlength=len(rows))
    cut = np.cumsum(counts)[:-1]
    return (
        np.split(masked, np.cumsum(lens)[:-1]),
        np.split(pos[sel].astype(np.int32), cut),
        np.split(flat[sel], cut),
    )


def mask_example(
    ids: np.ndarray, policy: MaskingPolicy, *, seed: int, epoch: int, example_id: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mask one example: (masked ids (L,), positions (k,) ascending, original ids at them (k,))."""
    m, p, labels = mask_rows(
        [np.asarray(ids, np.int32)], np.array([example_id], np.int64), policy, seed=seed, epoch=epoch
    )
    return m[0], p[0], labels[0]


def _ragged(rows: list[np.ndarray]) -> np.ndarray:
    out = np.empty(len(rows), dtype=object)
    for i, r in enumerate(rows):
        out[i] = r
    return out


def mask_batch(batch: dict[str, Any], policy: MaskingPolicy, *, seed: int, epoch: int) -> dict[str, Any]:
    """Mask a batch of unmasked rows (Ray Data numpy batch or lists); deterministic in (seed, epoch, example_id).

    Needs `input_ids` and `example_id`; returns a new dict with `input_ids` masked and `masked_lm_positions`,
    `masked_lm_ids` filled (object arrays of int32 arrays; `input_ids` keeps its 2-D shape if it had one).
    """
    if "example_id" not in batch:
        raise KeyError("mask_batch needs an 'example_id' column (shards written by pipeline.shards have one)")
    ids_col = batch["input_ids"]
    rows = [np.asarray(r, dtype=np.int32) for r in ids_col]
    out_ids, out_pos, out_lab = mask_rows(rows, np.asarray(batch["example_id"]), policy, seed=seed, epoch=epoch)
    res = dict(batch)
    if isinstance(ids_col, np.ndarray) and ids_col.ndim == 2:
        res["input_ids"] = np.stack(out_ids).astype(ids_col.dtype) if out_ids else ids_col.copy()
    else:
        res["input_ids"] = _ragged(out_ids)
    res["masked_lm_positions"] = _ragged(out_pos)
    res["masked_lm_ids"] = _ragged(out_lab)
    return res
