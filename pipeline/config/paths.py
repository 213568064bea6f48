"""Paths in a config: relative ones resolved against the directory the command runs in (`resolve_paths`), and each
training phase's data config with its own output directory (`phase_data_configs`)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from pipeline.config.sections import Config, DataConfig


def resolve_path(p: str | None, base: str | os.PathLike | None = None) -> str | None:
    """Absolute local path for a relative one (against `base` or the cwd); URIs (`s3://...`) are kept as they are."""
    if p is None or "://" in str(p):
        return p
    return str((Path(base or os.getcwd()) / os.path.expanduser(str(p))).resolve())


def resolve_paths(cfg: Config, base: str | os.PathLike | None = None) -> Config:
    """Resolve every path field against the directory the command runs in, before work is shipped to Ray."""
    cfg.data.inputs = [resolve_path(p, base) for p in cfg.data.inputs]  # type: ignore[misc]
    for source in cfg.data.sources:  # data.inputs is their inputs: resolved alike
        source.inputs = [resolve_path(p, base) for p in source.inputs]  # type: ignore[misc]
    cfg.data.output = resolve_path(cfg.data.output, base)  # type: ignore[assignment]
    cfg.data.vocab = vocab_file(resolve_path(cfg.data.vocab, base))
    if cfg.model.init and not cfg.model.init.startswith("models:/"):
        cfg.model.init = resolve_path(cfg.model.init, base)
    cfg.train.storage_path = resolve_path(cfg.train.storage_path, base)  # type: ignore[assignment]
    cfg.eval.suite = resolve_path(cfg.eval.suite, base)
    cfg.eval.baselines = [b if ":" in b.split("/")[0] else resolve_path(b, base) for b in cfg.eval.baselines]
    return cfg


def vocab_file(path: str | None) -> str | None:
    """`data.vocab` as the file it names: a directory (local or URI) gives the tokenizer.json it holds, else its
    vocab.txt; a file, a missing path or a directory holding neither stay as they are (checked with one line
    before any work, `pipeline.data.stages.check_paths`)."""
    if path is None:
        return None
    from pipeline.storage.io import exists, filesystem, join

    fs, local = filesystem(path)
    if not fs.isdir(local):
        return path
    return next((join(path, n) for n in ("tokenizer.json", "vocab.txt") if exists(join(path, n))), path)


def phase_data_configs(cfg: Config) -> list[DataConfig]:
    """One DataConfig per training phase: phase i's max_seq_length, masking cap and output directory.

    Phases after the first reuse the first phase's vocabulary, so all phases share one embedding table, and its
    tokenizer, so all phases cut text the same way: a trained WordPiece is wholly its vocab.txt (the file later
    phases have always read), a trained BPE or Unigram only with its tokenizer.json (its merges or scores; its
    vocab.txt alone would load as a WordPiece over the same tokens and cut text otherwise, a quarter of it to
    [UNK] on the shared corpora).
    """
    if not cfg.train.phases:
        return [cfg.data]
    out: list[DataConfig] = []
    for i, ph in enumerate(cfg.train.phases):
        changes: dict[str, Any] = {
            "max_seq_length": ph.max_seq_length,
            "output": resolve_path(ph.output) if ph.output else f"{cfg.data.output}-{ph.max_seq_length}",
        }
        if ph.max_predictions_per_seq:
            changes["max_predictions_per_seq"] = ph.max_predictions_per_seq
        if i > 0 and cfg.data.vocab is None:
            changes["vocab"] = (
                f"{out[0].output}/{'vocab.txt' if cfg.data.tokenizer == 'wordpiece' else 'tokenizer.json'}"
            )
        out.append(dataclasses.replace(cfg.data, **changes))
    return out
