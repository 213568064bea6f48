"""Masked-LM masking: the policy as configuration and one pure function used both at preparation (static) and
at load time (dynamic).

Google's `create_masked_lm_predictions`: candidates are all non-special positions (grouped with their `##`
continuations under whole-word masking); `num_to_predict = min(max_predictions_per_seq, max(1,
round(len * mask_rate)))`; groups are taken in random order, skipping a group that would overshoot; each chosen
position becomes [MASK] 80%, stays 10%, becomes a random token 10%. Departures: the random token is drawn from
the non-special vocabulary (Google draws from all of it, [PAD] and [unusedN] included), and a `##` token only
joins the group of the position right before it.

Randomness is a function of (seed, epoch, example_id) only, so dynamic masking gives every example a fresh
mask each epoch, the same on every worker, and static masking is the same call with epoch 0.

    >>> p = MaskingPolicy(mask_rate=0.5, max_predictions_per_seq=2, whole_word=False, vocab_size=10,
    ...                   mask_token_id=4, special_ids=(0, 1, 2, 3, 4))
    >>> ids, pos, lab = mask_example(np.array([2, 7, 8, 3], np.int32), p, np.random.default_rng(0))
    >>> pos.tolist(), lab.tolist()
    ([1, 2], [7, 8])
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclass(frozen=True)
class MaskingPolicy:
    mask_rate: float = 0.15
    """Fraction of tokens selected for prediction."""
    max_predictions_per_seq: int = 20
    """Cap on masked positions per example."""
    whole_word: bool = False
    """Mask `##` continuations together with the word they continue."""
    vocab_size: int = 30522
    mask_token_id: int = 103
    special_ids: tuple[int, ...] = (0, 100, 101, 102, 103)
    """Never masked, never drawn as a random replacement."""
    continuation_ids: tuple[int, ...] = ()
    """Ids of `##` WordPiece continuation tokens (whole-word grouping)."""
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
    ) -> MaskingPolicy:
        """Policy for a vocabulary (a vocab.txt path or its token list); BERT's special tokens must be in it."""
        if not isinstance(vocab, list):
            vocab = Path(vocab).read_text(encoding="utf-8").split("\n")
            if vocab and vocab[-1] == "":
                vocab = vocab[:-1]
        index = {t: i for i, t in enumerate(vocab)}
        missing = [t for t in SPECIAL_TOKENS if t not in index]
        if missing:
            raise ValueError(f"vocabulary lacks special token(s) {', '.join(missing)}")
        # Every bracketed token ([PAD], [unused0], ...) is special: never masked nor drawn.
        special = tuple(i for i, t in enumerate(vocab) if t.startswith("[") and t.endswith("]"))
        cont = tuple(i for i, t in enumerate(vocab) if t.startswith("##"))
        return cls(
            mask_rate=mask_rate,
            max_predictions_per_seq=max_predictions_per_seq,
            whole_word=whole_word,
            vocab_size=len(vocab),
            mask_token_id=index["[MASK]"],
            special_ids=special,
            continuation_ids=cont,
        )

    @classmethod
    def from_manifest(cls, manifest_or_dir: dict[str, Any] | str | Path) -> MaskingPolicy:
        """Policy of a prepared dataset: its manifest's data config and the vocab.txt beside it.

        Accepts the output directory, or a manifest dict that carries "output" (as written by shards.py).
        """
        if isinstance(manifest_or_dir, dict):
            manifest = manifest_or_dir
            directory = manifest.get("output")
        else:
            from pipeline.shards import read_manifest

            directory = str(manifest_or_dir)
            manifest = read_manifest(directory)
        cfg = manifest["config"]
        from pipeline.shards import read_text

        vocab = read_text(f"{str(directory).rstrip('/')}/vocab.txt").split("\n")
        if vocab and vocab[-1] == "":
            vocab = vocab[:-1]
        return cls.from_vocab(
            vocab,
            mask_rate=cfg["mask_rate"],
            max_predictions_per_seq=cfg["max_predictions_per_seq"],
            whole_word=cfg["whole_word_mask"],
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


def mask_example(
    ids: np.ndarray, policy: MaskingPolicy, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mask one example: returns (masked ids (L,), positions (k,) ascending, original ids at them (k,))."""
    special, cont, replacements = policy.tables()
    ids = np.asarray(ids, dtype=np.int32)
    n = len(ids)
    cand = np.flatnonzero(~special[ids])  # positions that may be masked
    num_to_predict = min(policy.max_predictions_per_seq, max(1, int(round(n * policy.mask_rate))))
    if len(cand) == 0:
        return ids.copy(), np.zeros(0, np.int32), np.zeros(0, np.int32)
    if policy.whole_word:
        # A group starts at a candidate that is not a `##` continuation of the position just before it.
        is_cont = cont[ids[cand]]
        follows = np.empty(len(cand), bool)
        follows[0] = False
        follows[1:] = cand[1:] == cand[:-1] + 1
        starts = np.flatnonzero(~(is_cont & follows))
        bounds = np.append(starts, len(cand))
        order = rng.permutation(len(starts))
        chosen: list[int] = []
        for g in order:
            if len(chosen) >= num_to_predict:
                break
            size = bounds[g + 1] - bounds[g]
            if len(chosen) + size > num_to_predict:
                continue  # Google skips a whole word that would overshoot
            chosen.extend(cand[bounds[g] : bounds[g + 1]])
        positions = np.sort(np.asarray(chosen, dtype=np.int32))
    else:
        positions = np.sort(cand[rng.permutation(len(cand))[:num_to_predict]]).astype(np.int32)
    labels = ids[positions]
    out = ids.copy()
    r = rng.random(len(positions))
    rand_tok = replacements[rng.integers(0, len(replacements), len(positions))]
    out[positions] = np.where(r < 0.8, policy.mask_token_id, np.where(r < 0.9, labels, rand_tok))
    return out, positions, labels.astype(np.int32)


def example_rng(seed: int, epoch: int, example_id: int) -> np.random.Generator:
    """The masking RNG of one example in one epoch."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, int(epoch), int(example_id) & 0xFFFFFFFFFFFFFFFF])


def _rows(col: Any) -> list[np.ndarray]:
    return [np.asarray(r, dtype=np.int32) for r in col]


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
    out_ids, out_pos, out_lab = [], [], []
    for ids, ex in zip(_rows(ids_col), np.asarray(batch["example_id"]).tolist()):
        m, p, l = mask_example(ids, policy, example_rng(seed, epoch, ex))
        out_ids.append(m)
        out_pos.append(p)
        out_lab.append(l)
    res = dict(batch)
    if isinstance(ids_col, np.ndarray) and ids_col.ndim == 2:
        res["input_ids"] = np.stack(out_ids).astype(ids_col.dtype)
    else:
        res["input_ids"] = _ragged(out_ids)
    res["masked_lm_positions"] = _ragged(out_pos)
    res["masked_lm_ids"] = _ragged(out_lab)
    return res
