"""A pretraining run's checkpoint directory as an evaluation source, so that a run's checkpoints can be ranked by
their suite score rather than by their MLM loss.

A checkpoint (`train.storage_path`/<run>/checkpoint_*) holds the weights (`model.safetensors`) and
`train_state.json`, whose `run_id` names the MLflow run that wrote it; that run keeps the job's `config.yaml`, the
vocabulary (`data/vocab.txt`) and the tokenizer (`data/tokenizer.json`, which a BPE or Unigram needs; for a run
logged before it was an artifact, the prepared data's while it is there) as artifacts. `export_checkpoint` rebuilds
the model from them and writes a transformers directory, as the main job's `register` stage exports its final
checkpoint.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from pipeline.config import ConfigError


def is_pretraining_checkpoint(path: str) -> bool:
    """A local directory with `train_state.json` and `model.safetensors` and no `config.json`."""
    p = Path(path)
    return (
        p.is_dir()
        and (p / "train_state.json").is_file()
        and (p / "model.safetensors").is_file()
        and not (p / "config.json").is_file()
    )


def export_checkpoint(path: str, dst: str) -> dict[str, str]:
    """Write the checkpoint at `path` as a transformers directory `dst` (with the run's tokenizer); returns its
    lineage tags. One ConfigError line when the run that wrote it is not in the current tracking store."""
    import torch
    from safetensors.torch import load_file

    from model.build import build_model
    from model.hf import save_hf
    from pipeline import tracking
    from pipeline.config import load_config
    from pipeline.core.checkpoint import read_train_state
    from pipeline.data.specials import specials
    from pipeline.data.tokenizer import load_tokenizer

    state = read_train_state(path)
    run_id = state.get("run_id")
    where = f"--model {path}"
    if not run_id or not tracking.run_exists(run_id):
        raise ConfigError(
            f"{where}: the run that wrote this checkpoint ({run_id or 'unnamed'}) is not in the "
            f"tracking store {tracking.redact(tracking.tracking_uri())}: its config and vocabulary "
            "are there"
        )
    c = tracking.client()
    with tempfile.TemporaryDirectory(prefix="checkpoint-source-") as d:
        cfg = load_config(c.download_artifacts(run_id, "config.yaml", d))
        tok = Path(d, "tokenizer")
        tok.mkdir()
        shutil.copy(c.download_artifacts(run_id, "data/vocab.txt", d), tok / "vocab.txt")
        if "data/tokenizer.json" in {a.path for a in c.list_artifacts(run_id, "data")}:  # logged since 2026-11-29
            shutil.copy(c.download_artifacts(run_id, "data/tokenizer.json", d), tok / "tokenizer.json")
        elif (prepared := Path(cfg.data.output or "", "tokenizer.json")).is_file():  # the prepared data's, if there
            shutil.copy(prepared, tok / "tokenizer.json")
        weights = load_file(os.path.join(path, "model.safetensors"))
        emb = next(v for k, v in weights.items() if k.endswith(("word_embeddings.weight", "tok_embeddings.weight")))
        sp = specials(load_tokenizer(tok), str(tok))  # the pad id and roles are the tokenizer's
        model = build_model(cfg.model.encoder_config(vocab_size=emb.shape[0], pad_token_id=sp.ids["pad"]))
        with torch.no_grad():
            model.load_state_dict(weights)
        save_hf(model, dst, tokenizer=str(tok))
        tracking.write_tokenizer_config(
            dst,
            model_max_length=model.config.max_position_embeddings,
            lowercase=bool(cfg.data.lowercase),
            special_tokens=sp.tokens,
        )
    return {
        "source_model": str(Path(path).resolve()),
        "pretrain_run_id": run_id,
        "source_checkpoint_step": str(state.get("step", "")),
    }
