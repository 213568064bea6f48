"""Continued pretraining (`pipeline/pretrain/init.py`): resolving `model.init` against the real MiniLM checkpoint
and a saved tiny one, the one-line refusals, the initial weights, and the lineage in the run identity."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import sqlite_store

from pipeline.config import ConfigError, load_config, resolve_paths
from pipeline.pretrain.init import check_prepared, load_initial, resolve_init
from pipeline.pretrain.identity import run_identity, run_name_for
from pipeline.pretrain.job import worker_config


def _cfg(tmp_path: Path, *args: str):
    return resolve_paths(
        load_config(
            None, ["--data.output", str(tmp_path / "data"), "--train.storage_path", str(tmp_path / "runs"), *args]
        )
    )


@pytest.fixture()
def tiny_ckpt(tmp_path):
    """A saved tiny BertForPreTraining (MLM + NSP heads) with a 40-token cased vocabulary."""
    from model import BertConfig, BertForPreTraining
    from model.hf import save_hf

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(35)]
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "vocab.txt").write_text("".join(w + "\n" for w in words))
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    torch.manual_seed(1)
    model = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=len(words)))
    return save_hf(model, tmp_path / "ckpt", tokenizer=tmp_path / "tok"), model


def test_minilm_directory_gives_architecture_vocabulary_and_lowercasing(tmp_path, minilm_dir):
    cfg, init = resolve_init(
        _cfg(
            tmp_path,
            "--model.init",
            str(minilm_dir),
            "--model.preset",
            "null",
            "--model.overrides.hidden_dropout_prob",
            "0.0",
        )
    )
    bc = cfg.model.encoder_config()
    assert (bc.hidden_size, bc.num_hidden_layers, bc.num_attention_heads, bc.vocab_size) == (384, 6, 12, 30522)
    assert bc.hidden_dropout_prob == 0.0  # a non-architecture override applies on top
    assert cfg.data.vocab == str(minilm_dir / "tokenizer.json") and cfg.data.lowercase is True
    assert init.heads == "none" and "fresh MLM head tied to its word embeddings" in init.describe()
    assert init.weights_sha256 == hashlib.sha256((minilm_dir / "model.safetensors").read_bytes()).hexdigest()
    assert init.tags == {"init_model": str(minilm_dir), "init_model_sha256": init.weights_sha256}


def test_minilm_initial_model_has_its_encoder_and_a_fresh_tied_mlm_head(tmp_path, minilm_dir):
    from model import BertModel
    from model.hf import load_hf

    cfg, init = resolve_init(_cfg(tmp_path, "--model.init", str(minilm_dir), "--model.preset", "null"))
    torch.manual_seed(0)
    model = load_initial(worker_config(cfg, init).model, 30522)
    ref = load_hf(minilm_dir, BertModel).state_dict()
    mine = model.bert.state_dict()
    assert set(ref) == set(mine) and all(torch.equal(ref[k], mine[k]) for k in ref)  # the encoder at step 0
    assert not any("decoder" in k for k in model.state_dict())  # the decoder is the word embeddings (tied)
    assert torch.count_nonzero(model.cls.predictions.bias) == 0  # a fresh head
    ids = torch.tensor([[101, 7592, 2088, 102]])
    model.eval()  # no dropout in the comparison
    with torch.no_grad():
        h = model.cls.predictions.transform(model.bert(ids).last_hidden_state)
        expect = h @ model.bert.embeddings.word_embeddings.weight.T
        torch.testing.assert_close(model(ids).mlm_logits, expect)
    torch.manual_seed(0)  # every rank seeds the same way first: identical fresh heads
    again = load_initial(worker_config(cfg, init).model, 30522)
    assert torch.equal(again.cls.predictions.transform.dense.weight, model.cls.predictions.transform.dense.weight)


def test_a_checkpoint_with_heads_loads_them_and_an_agreeing_preset_is_fine(tmp_path, tiny_ckpt):
    path, saved = tiny_ckpt
    cfg, init = resolve_init(_cfg(tmp_path, "--model.init", str(path), "--model.preset", "tiny"))
    assert init.heads == "mlm+nsp" and "MLM and NSP heads loaded" in init.describe()
    assert cfg.data.vocab == str(path / "vocab.txt") and cfg.data.lowercase is False  # do_lower_case: false
    model = load_initial(worker_config(cfg, init).model, 40)
    for k, v in saved.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--model.preset", "base"], "model.preset base: hidden_size 768 != 384 in {src}/config.json"),
        (["--model.preset", "mini"], "model.preset mini: hidden_size 256 != 384 in {src}/config.json"),
        (
            ["--model.preset", "null", "--model.overrides.num_hidden_layers", "4"],
            "model.overrides num_hidden_layers: 4 != 6 in {src}/config.json",
        ),
    ],
)
def test_a_contradicting_architecture_is_one_line_naming_both(tmp_path, minilm_dir, args, expect):
    with pytest.raises(ConfigError) as e:
        resolve_init(_cfg(tmp_path, "--model.init", str(minilm_dir), *args))
    assert str(e.value) == expect.format(src=minilm_dir)


def test_vocabulary_other_than_the_checkpoints_is_refused(tmp_path, minilm_dir, tiny_ckpt):
    base = ["--model.init", str(minilm_dir), "--model.preset", "null"]
    for same in ("vocab.txt", "tokenizer.json"):  # naming the checkpoint's own vocabulary is fine
        cfg, _ = resolve_init(_cfg(tmp_path, *base, "--data.vocab", str(minilm_dir / same)))
        assert cfg.data.vocab == str(minilm_dir / same)
    with pytest.raises(
        ConfigError, match=r"^data.vocab .*vocab.txt \(sha256 [0-9a-f]{12}\) is not the vocabulary of model.init"
    ):
        resolve_init(_cfg(tmp_path, *base, "--data.vocab", str(tiny_ckpt[0] / "vocab.txt")))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "manifest.json").write_text(json.dumps({"vocab_sha256": "ab" * 32}))
    with pytest.raises(ConfigError) as e:
        resolve_init(_cfg(tmp_path, *base))
    assert str(e.value).startswith(
        f"data.output {tmp_path / 'data'} was prepared with vocabulary sha256 abababababab, "
        f"model.init {minilm_dir} has "
    ) and "\n" not in str(e.value)
    resolve_init(_cfg(tmp_path, *base, "--data.overwrite", "true"))  # the user chose to rebuild it
    check_prepared([str(tmp_path / "nothing-yet")], "cd" * 32, "x")  # not prepared yet: fine


def test_a_registered_version_with_storage_on_s3_is_copied_there_and_leaves_no_temporary_directory(
    tmp_path, tiny_ckpt, s3_env, monkeypatch
):
    """On a cluster with object storage every worker (and the data stage) must read the initial checkpoint from
    the storage, not from a temporary directory on the driver, and the driver's download must not be left behind."""
    import os

    import fsspec

    from pipeline import tracking

    path, saved = tiny_ckpt
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_store(tmp_path / "mlflow.db"))
    run_id = tracking.start_run("exp", "reg", {})
    tracking.register_hf_model(str(path), "tiny-init", "champion", {"run_id": run_id}, run_id)
    bucket = s3_env.bucket()
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    before = set(tmp.iterdir())
    cfg, init = resolve_init(
        _cfg(tmp_path, "--model.init", "models:/tiny-init@champion", "--train.storage_path", f"s3://{bucket}/runs")
    )
    assert init.local_dir == f"s3://{bucket}/runs/init/tiny-init-v1"
    assert cfg.data.vocab == f"s3://{bucket}/runs/init/tiny-init-v1/vocab.txt" and cfg.data.lowercase is False
    assert init.weights_sha256 == hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    fs = fsspec.filesystem("s3")
    assert fs.cat(f"{bucket}/runs/init/tiny-init-v1/model.safetensors") == (path / "model.safetensors").read_bytes()
    model = load_initial(worker_config(cfg, init).model, 40)
    assert all(torch.equal(v, saved.state_dict()[k]) for k, v in model.state_dict().items())
    assert set(tmp.iterdir()) == before  # neither the driver's download nor the worker's copy is left


def test_not_a_checkpoint_is_one_line(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"^model.init .*: not models:/name@alias, models:/name/version, or a directory with config.json$",
    ):
        resolve_init(_cfg(tmp_path, "--model.init", str(tmp_path), "--model.preset", "null"))
    with pytest.raises(ConfigError, match="model.preset null needs model.init"):
        _cfg(tmp_path, "--model.preset", "null")


def test_run_identity_without_init_is_unchanged_and_with_init_has_its_sha(tmp_path, tiny_ckpt):
    from pipeline.config import config_hash

    datasets = [SimpleNamespace(config_hash="c" * 64, vocab_sha256="v" * 64)]
    plain = _cfg(tmp_path)
    # what run_identity hashed before model.init existed: the ModelConfig repr, unchanged by the new field
    assert repr(plain.model) == "ModelConfig(preset='tiny', overrides={})"
    assert "init" not in config_hash.__doc__ and run_name_for(plain, datasets).startswith("tiny-")
    cfg, init = resolve_init(_cfg(tmp_path, "--model.init", str(tiny_ckpt[0])))
    other = SimpleNamespace(**{**init.__dict__, "weights_sha256": "0" * 64})
    assert run_identity(cfg, datasets, init) != run_identity(cfg, datasets, other)
    assert run_identity(cfg, datasets, init) != run_identity(cfg, datasets)


def test_run_identity_of_a_warmup_fraction_is_that_of_its_steps(tmp_path):
    """A preset that moved from `warmup_steps: 120` to `warmup_fraction: 0.1` of 1,200 steps keeps its runs' names,
    and so does a run with the default (linear) decay shape; runs that differ only by max_steps still share their
    identity without it (the fraction, not the steps it sets, is in that one). A mixture's weights are in it, as
    numbers (3 and 3.0 alike)."""
    datasets = [SimpleNamespace(config_hash="c" * 64, vocab_sha256="v" * 64)]
    steps = _cfg(tmp_path, "--train.max_steps", "1200", "--train.warmup_steps", "120")
    fraction = _cfg(tmp_path, "--train.max_steps", "1200", "--train.warmup_fraction", "0.1")
    shape = _cfg(tmp_path, "--train.max_steps", "1200", "--train.warmup_steps", "120", "--train.decay_shape", "linear")
    assert run_identity(steps, datasets) == run_identity(fraction, datasets) == run_identity(shape, datasets)
    sqrt = _cfg(
        tmp_path,
        "--train.max_steps",
        "1200",
        "--train.warmup_steps",
        "120",
        "--train.schedule",
        "wsd",
        "--train.decay_shape",
        "1-sqrt",
    )
    assert run_identity(sqrt, datasets) != run_identity(
        dataclasses.replace(sqrt, train=dataclasses.replace(sqrt.train, decay_shape="linear")), datasets
    )
    mixed = [
        _cfg(tmp_path, "--data.sources", f"[{{name: a, inputs: /a, weight: {w}}}, {{name: b, inputs: /b, weight: 1}}]")
        for w in ("3", "3.0", "2")
    ]
    assert run_identity(mixed[0], datasets) == run_identity(mixed[1], datasets) != run_identity(mixed[2], datasets)
    short = _cfg(tmp_path, "--train.max_steps", "30", "--train.warmup_fraction", "0.1")
    assert run_identity(short, datasets) != run_identity(fraction, datasets)
    length = ("max_steps",)
    assert run_identity(short, datasets, without=length) == run_identity(fraction, datasets, without=length)


@pytest.mark.slow
def test_a_run_longer_by_max_steps_only_says_it_is_new_and_how_to_continue(tmp_path, monkeypatch):
    """An earlier run (as train_stage starts it: tagged with its identity without max_steps) in a real SQLite
    store: the same config with another max_steps gets one line naming that run, both lengths and its registered
    version as `--model.init`; the run itself (resumed), another LR, or a chosen run name get none. About 20 s,
    most of it MLflow creating the SQLite store."""
    from pipeline import tracking
    from pipeline.pretrain.identity import longer_run_notice

    def notice(cfg):  # what train_stage passes
        return longer_run_notice(
            cfg, run_name_for(cfg, datasets), run_identity(cfg, datasets, without=("max_steps",)), uri
        )

    uri = sqlite_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    datasets = [SimpleNamespace(config_hash="c" * 64, vocab_sha256="v" * 64)]
    short = _cfg(tmp_path, "--train.max_steps", "24")
    run_id = tracking.start_run(
        "bert-pretrain",
        run_name_for(short, datasets),
        {"identity_without_max_steps": run_identity(short, datasets, without=("max_steps",))},
    )
    tracking.RunLogger(run_id, uri).log_params(short.flat())

    longer = _cfg(tmp_path, "--train.max_steps", "48")
    line = notice(longer)
    assert line.startswith(
        f"[train] only train.max_steps differs from run {run_name_for(short, datasets)} (24 -> 48 steps"
    )
    assert f"{run_name_for(longer, datasets)} is a new run, trained from scratch" in line and "\n" not in line
    assert "no registered version yet" in line and "--model.init models:/bert-pretrain/<version>" in line

    tracking.RunLogger(run_id, uri).set_tags({"registered_model": "models:/bert-pretrain/3"})
    assert "run with --model.init models:/bert-pretrain/3 " in notice(longer)
    assert notice(short) is None  # resuming the earlier run itself
    assert notice(_cfg(tmp_path, "--train.max_steps", "48", "--train.lr", "7e-4")) is None
    assert notice(_cfg(tmp_path, "--train.max_steps", "48", "--train.run_name", "mine")) is None


def test_a_modernbert_checkpoint_continues_as_modernbert(tmp_path, tiny_ckpt):
    """model.init of a saved ModernBERT: its architecture (model_type modernbert), its MLM head, no NSP head; a BERT
    preset is refused in one line, and so is NSP data."""
    from model import ModernBertConfig, ModernBertForMaskedLM
    from model.hf import save_hf

    torch.manual_seed(2)
    saved = ModernBertForMaskedLM(ModernBertConfig.from_preset("modernbert-tiny", vocab_size=40))
    path = save_hf(saved, tmp_path / "mb", tokenizer=tmp_path / "tok")  # tiny_ckpt's 40-token vocabulary
    cfg, init = resolve_init(_cfg(tmp_path, "--model.init", str(path), "--model.preset", "null", "--data.nsp", "false"))
    assert cfg.model.family.name == "modernbert"
    assert cfg.model.encoder_config().local_attention == saved.config.local_attention
    assert init.family == "modernbert" and init.heads == "mlm"
    assert init.describe().endswith("encoder and MLM head loaded")  # no NSP head to speak of
    torch.manual_seed(0)
    model = load_initial(worker_config(cfg, init).model, 40)
    assert type(model).__name__ == "ModernBertForMaskedLM"
    for k, v in saved.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    with pytest.raises(
        ConfigError, match=r"^model.preset tiny is BERT, .* is ModernBERT: choose a modernbert-\* preset or null$"
    ):
        resolve_init(_cfg(tmp_path, "--model.init", str(path), "--model.preset", "tiny", "--data.nsp", "false"))
    cfg, _ = resolve_init(
        _cfg(tmp_path, "--model.init", str(path), "--model.preset", "modernbert-tiny", "--data.nsp", "false")
    )
    assert cfg.model.family.name == "modernbert"  # an agreeing preset of its family is fine
    with pytest.raises(ConfigError, match=r"is MLM-only \(no NSP head\): set data.nsp false"):
        resolve_init(_cfg(tmp_path, "--model.init", str(path), "--model.preset", "null"))
