"""The main job with the modern encoder, through the command line (issue 33): `jobs/pretrain.py --config
configs/modernbert-tiny.yaml` on two shared books at a tiny budget prepares rows packed by document, trains
ModernBertForMaskedLM on them and registers a version that transformers' AutoModelForMaskedLM loads with our logits;
`jobs/finetune.py --model models:/...` fine-tunes it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import sqlite_store

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_modernbert_tiny_job_registers_a_version_transformers_loads(tmp_path, shared_dir, monkeypatch, job_cluster):
    import pyarrow.parquet as pq
    from mlflow import MlflowClient
    from transformers import AutoModelForMaskedLM

    from model import ModernBertForMaskedLM
    from model.hf import load_hf
    from pipeline import tracking

    # both jobs join one local Ray cluster (`job_cluster`), as jobs on a cluster do
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": sqlite_store(tmp_path / "mlflow.db"),
        "PYTHONUNBUFFERED": "1",
        "RAY_ADDRESS": job_cluster,
    }
    monkeypatch.setenv("MLFLOW_TRACKING_URI", env["MLFLOW_TRACKING_URI"])  # this process reads the same store
    books = [str(shared_dir / "corpora" / "books" / b) for b in ("08_Ruth.txt", "41_Mark.txt")]
    pre = subprocess.run(
        [
            sys.executable,
            str(REPO / "jobs" / "pretrain.py"),
            "--config",
            str(REPO / "configs" / "modernbert-tiny.yaml"),
            "--data.inputs",
            f"[{', '.join(books)}]",
            "--data.output",
            str(tmp_path / "data"),
            "--data.vocab_size",
            "600",
            "--data.max_document_chars",
            "4000",
            "--data.max_seq_length",
            "256",
            "--data.max_predictions_per_seq",
            "77",
            "--train.max_steps",
            "8",
            "--train.warmup_steps",
            "2",
            "--train.eval_every_steps",
            "4",
            "--train.checkpoint_every_steps",
            "4",
            "--train.storage_path",
            str(tmp_path / "runs"),
            "--tracking.model_name",
            "mb-e2e",
            "--tracking.alias",
            "e2e",
            "--eval.suite",
            "null",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert pre.returncode == 0, pre.stderr[-3000:]
    last = pre.stdout.strip().splitlines()[-1]
    assert last == "registered models:/mb-e2e/1", last

    # the shards carry each row's documents; pieces of 4,000 characters make rows of several
    shards = sorted((tmp_path / "data" / "shards").glob("*.parquet"))
    t = pq.read_table([str(p) for p in shards])
    lens = t.column("doc_lengths").to_pylist()
    assert [sum(d) for d in lens] == t.column("num_tokens").to_pylist() and max(len(d) for d in lens) >= 2

    # the run logged MLM figures and no NSP ones
    c = MlflowClient(env["MLFLOW_TRACKING_URI"])
    mv = c.get_model_version_by_alias("mb-e2e", "e2e")
    assert mv.description.startswith("ModernBERT pretrained for 8 steps"), mv.description[:80]
    run = c.get_run(mv.tags["run_id"])
    metrics = run.data.metrics
    assert {"train/loss", "train/mlm_accuracy", "eval/final/mlm_accuracy"} <= set(metrics)
    assert not any("nsp" in k for k in metrics)
    assert all("doc_lengths" in d.dataset.schema for d in run.inputs.dataset_inputs)  # the logged data's schema

    # transformers loads the registered version as its ModernBertForMaskedLM and gives our logits
    local = tracking.download_model("models:/mb-e2e/1", str(tmp_path / "dl"))
    theirs = AutoModelForMaskedLM.from_pretrained(local).eval()
    assert type(theirs).__name__ == "ModernBertForMaskedLM"
    ours = load_hf(local, ModernBertForMaskedLM).eval()
    ids = torch.from_numpy(np.stack([np.resize(t.column("input_ids")[i].as_py(), 200) for i in range(2)])).long()
    mask = torch.ones_like(ids)
    mask[1, 150:] = 0
    with torch.no_grad():
        a = ours(ids, attention_mask=mask).mlm_logits
        b = theirs(input_ids=ids, attention_mask=mask).logits
    assert (a - b)[mask.bool()].abs().max().item() < 1e-4

    # the preset's byte-level BPE (issue 57) is registered with it: AutoTokenizer and fill-mask read it
    from transformers import AutoTokenizer, pipeline

    from pipeline.data.tokenizer import load_tokenizer

    auto = AutoTokenizer.from_pretrained(local)
    text = (shared_dir / "corpora" / "books" / "01_Ge.txt").read_text()[:3000]  # held out: not in the two books
    assert (
        auto(text, add_special_tokens=False)["input_ids"]
        == load_tokenizer(local).encode(text, add_special_tokens=False).ids
    )
    assert json.loads((tmp_path / "data" / "manifest.json").read_text())["tokenizer"]["kind"] == "bpe"
    assert len(pipeline("fill-mask", model=local, top_k=2)(f"And the {auto.mask_token} said")) == 2

    # fine-tuning starts from the registered version: its class is ModernBERT's, and it trains
    task = shared_dir / "tasks" / "pydocs_topic"
    ft = subprocess.run(
        [
            sys.executable,
            str(REPO / "jobs" / "finetune.py"),
            "--model",
            "models:/mb-e2e@e2e",
            "--task",
            "sequence-classification",
            "--train",
            str(task / "train.tsv"),
            "--eval",
            str(task / "dev.tsv"),
            "--data.max_seq_length",
            "64",
            "--data.max_train_examples",
            "128",
            "--data.max_eval_examples",
            "64",
            "--train.max_steps",
            "8",
            "--train.batch_size",
            "16",
            "--train.lr",
            "1e-3",
            "--train.storage_path",
            str(tmp_path / "ft-runs"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert ft.returncode == 0, ft.stderr[-3000:]
    result = json.loads(ft.stdout.strip().splitlines()[-1])
    assert 0.0 <= result["accuracy"] <= 1.0 and math.isfinite(result["loss"])
    version = c.get_model_version("bert-finetune-sequence-classification", "1")
    assert version.tags["source_model"] == "models:/mb-e2e/1"
    config = json.loads(
        Path(
            tracking.download_model("models:/bert-finetune-sequence-classification/1", str(tmp_path / "ft-dl")),
            "config.json",
        ).read_text()
    )
    assert config["model_type"] == "modernbert" and config["architectures"] == ["ModernBertForSequenceClassification"]
