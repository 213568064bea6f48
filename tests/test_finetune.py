"""pipeline/finetune/job.py and loop.py without Ray: config, source resolution (local dir, registry, scratch), model
building, and the evaluation bookkeeping (predictions mapped back to labels, words and answer texts)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.config import ConfigError
from pipeline.finetune.data import prepare_task
from pipeline.finetune.config import FinetuneConfig, load_finetune_config, resolve_lr
from pipeline.finetune.job import resolve_source, task_model
from pipeline.finetune.loop import TaskSums, epoch_micro_batches, evaluate, steps_per_epoch

from conftest import sqlite_store

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    """One real SQLite MLflow store for the module."""
    uri = sqlite_store(tmp_path_factory.mktemp("mlflow") / "mlflow.db")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        yield uri


def test_config_file_matches_defaults_and_overrides():
    assert load_finetune_config(REPO / "configs" / "finetune.yaml") == FinetuneConfig()
    cfg = load_finetune_config(
        None,
        [
            "--train.lr",
            "1e-4",
            "--train.max_steps",
            "7",
            "--eval.n_best=5",
            "--model.overrides.hidden_dropout_prob",
            "0.0",
        ],
    )
    assert cfg.train.lr == 1e-4 and isinstance(cfg.train.lr, float)  # YAML 1.1 reads 1e-4 as a string
    assert cfg.train.max_steps == 7 and cfg.eval.n_best == 5
    assert cfg.model.overrides == {"hidden_dropout_prob": 0.0}
    with pytest.raises(ConfigError, match="^unrecognized arguments: --train.lrr 1$"):
        load_finetune_config(None, ["--train.lrr", "1"])
    with pytest.raises(ConfigError, match="^unrecognized arguments: --trian.lr 1$"):
        load_finetune_config(None, ["--trian.lr", "1"])
    with pytest.raises(ConfigError, match="train.lr 'fast' is not a number"):
        load_finetune_config(None, ["--train.lr", "fast"])


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--train.precision", "fp8"], "train.precision 'fp8' is not one of fp32, bf16, fp16"),
        (["--train.accumulation_steps", "0"], "train.accumulation_steps 0 < 1"),
        (["--train.batch_size", "0"], "train.batch_size 0 < 1"),
        (["--train.max_failures", "x"], "train.max_failures 'x' is not an integer"),
        (["--train.use_gpu", "maybe"], "train.use_gpu 'maybe' is not true or false"),
    ],
)
def test_config_errors_name_the_field(args, msg):
    with pytest.raises(ConfigError, match=re.escape(msg)):
        load_finetune_config(None, args)


def test_config_non_mapping_section(tmp_path):
    (tmp_path / "ft.yaml").write_text("train: 3\n")
    with pytest.raises(ConfigError, match="config section train must be a mapping"):
        load_finetune_config(tmp_path / "ft.yaml")


def test_precision_and_accumulation_fields():
    cfg = load_finetune_config(
        None,
        [
            "--train.precision",
            "bf16",
            "--train.accumulation_steps",
            "4",
            "--train.num_workers",
            "2",
            "--train.batch_size",
            "8",
            "--train.max_failures",
            "1",
        ],
    )
    assert (cfg.train.precision, cfg.train.global_batch_size, cfg.train.max_failures) == ("bf16", 64, 1)


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("train.lr", "1e-4", None),
        ("train.lr", "abc", "train.lr 'abc' is not a number or auto"),
        ("tune.lr", "1e-4,3e-4", None),
        ("tune.lr", "1e-4,abc", "tune.lr[1] 'abc' is not a number"),
        ("tune.lr", "0", "tune.lr 0 must be > 0"),
        ("tune.lr", "-1e-3", "tune.lr -0.001 must be > 0"),
    ],
)
def test_cli_lr_value(tmp_path, field, value, error):
    """`--train.lr 1e-4` (a string to YAML 1.1) is a float, `--tune.lr 1e-4,3e-4` a list of them; a bad value is one
    line on stderr naming the field, exit 1, before any data, Ray or MLflow work (the model does not exist, so an
    accepted config fails on --model)."""
    for name in ("train.tsv", "dev.tsv"):
        (tmp_path / name).write_text("sentence\tlabel\nNaomi wept\ta\n")
    p = subprocess.run(
        [
            sys.executable,
            str(REPO / "jobs" / "finetune.py"),
            "--model",
            str(tmp_path / "nomodel"),
            "--task",
            "sequence-classification",
            "--train",
            "train.tsv",
            "--eval",
            "dev.tsv",
            f"--{field}",
            value,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"},
    )
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr, p.stderr
    if error is None:
        assert "--model" in p.stderr and field not in p.stderr, p.stderr
    else:
        assert p.stderr.strip().startswith(f"finetune: error: {error} (log: "), p.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_tune_lr_from_cli_and_yaml(tmp_path):
    """`tune.lr` takes a comma list on the command line and a YAML list (YAML 1.1 strings like 1e-4 included);
    null or an empty list means no sweep."""
    assert load_finetune_config(None, ["--tune.lr", "1e-4, 3e-4,1e-3"]).tune.lr == [1e-4, 3e-4, 1e-3]
    assert load_finetune_config(None, ["--tune.lr", "[1e-4, 0.003]"]).tune.lr == [1e-4, 3e-3]
    assert load_finetune_config(None, ["--tune.lr", "0.001"]).tune.lr == [1e-3]
    (tmp_path / "ft.yaml").write_text("tune:\n  lr: [1e-4, 3e-4]\n  max_concurrent_trials: 2\n")
    cfg = load_finetune_config(tmp_path / "ft.yaml")
    assert cfg.tune.lr == [1e-4, 3e-4] and all(isinstance(x, float) for x in cfg.tune.lr)
    assert cfg.tune.max_concurrent_trials == 2
    (tmp_path / "none.yaml").write_text("tune:\n  lr: []\n")
    assert not load_finetune_config(tmp_path / "none.yaml").tune.lr
    assert load_finetune_config(REPO / "configs" / "finetune.yaml").tune.lr is None  # default: no sweep


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--tune.lr", "abc"], "tune.lr[0] 'abc' is not a number"),
        (["--tune.lr", "1e-4,,3e-4"], "tune.lr[1] '' is not a number"),
        (["--tune.lr", "1e-4,nan"], "tune.lr nan must be > 0"),
        (["--tune.lr", "1e-3,1e-3"], "tune.lr [0.001, 0.001] lists an LR twice"),
        (["--tune.max_concurrent_trials", "0"], "tune.max_concurrent_trials 0 < 1"),
        (["--train.lr", "0"], "train.lr 0.0 must be > 0"),
        (["--train.lr", "-3e-4"], "train.lr -0.0003 must be > 0"),
    ],
)
def test_lr_errors_name_the_field(args, msg):
    with pytest.raises(ConfigError, match=re.escape(msg)):
        load_finetune_config(None, args)


@pytest.mark.parametrize(
    "preset, lr", [("tiny", 1e-3), ("mini", 3e-4), ("small", 1e-4), ("medium", 1e-4), ("base", 5e-5), ("large", 5e-5)]
)
def test_auto_lr_by_model_size(preset, lr):
    """`train.lr: auto` (the default) gives BERT-base's 5e-5 only to base/large; a given LR always wins."""
    from model import BertConfig

    hidden = BertConfig.from_preset(preset).hidden_size
    assert load_finetune_config(REPO / "configs" / "finetune.yaml").train.lr == "auto"
    got, why = resolve_lr("auto", hidden)
    assert got == lr and why.startswith(f"auto: hidden size {hidden}")
    assert resolve_lr(2e-5, hidden) == (2e-5, "train.lr")
    assert resolve_lr("auto", 384)[0] == 1e-4  # MiniLM-L6-H384


def test_pick_best_trial():
    """The best trial as the loop picks the best epoch: the metric first, then the lower loss; NaN ranks last."""
    from pipeline.finetune.sweep import pick_best

    trials = [
        {"eval/accuracy": 0.40, "eval/loss": 1.1},
        {"eval/accuracy": 0.55, "eval/loss": 1.5},
        {"eval/accuracy": 0.55, "eval/loss": 1.2},
        {"eval/accuracy": math.nan, "eval/loss": math.nan},
    ]
    assert pick_best(trials, "accuracy") == 2
    assert pick_best([{"eval/f1": math.nan, "eval/loss": 0.1}, {"eval/f1": 0.0, "eval/loss": 3.0}], "f1") == 1


def test_sweep_refuses_trials_that_never_fit():
    """A trial is its own small actor plus its Train workers; one that can never be placed fails in one line
    instead of Tune waiting for it forever."""
    from pipeline.finetune.trials import check_trial_resources

    check_trial_resources(2, 0.5, 2.0)
    with pytest.raises(
        ConfigError,
        match=r"^tune.lr: a trial needs train.num_workers 2 x train.cpus_per_worker 1 .* = 2.05 CPUs; the cluster has 2$",  # noqa: E501
    ):
        check_trial_resources(2, 1.0, 2.0)


def test_cli_usage_error_is_one_line_exit_1(tmp_path):
    p = subprocess.run(
        [sys.executable, str(REPO / "jobs" / "finetune.py"), "--task", "nonsense"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 1 and p.stderr.strip().count("\n") == 0 and "--task" in p.stderr, p.stderr


def test_epoch_micro_batches_resume_and_rank_split():
    rows = {"input_ids": [[101, i, 102] for i in range(10)], "labels": list(range(10))}
    whole = [b["labels"].tolist() for b in epoch_micro_batches(rows, 2, 0, 2, 2, seed=7)]
    other = [b["labels"].tolist() for b in epoch_micro_batches(rows, 2, 1, 2, 2, seed=7)]
    assert [len(b) for b in whole] == [2, 2, 1] and [len(b) for b in other] == [2, 2, 1]  # 5 rows per rank
    assert not set(sum(whole, [])) & set(sum(other, []))  # ranks take disjoint strides of one permutation
    assert [b["labels"].tolist() for b in epoch_micro_batches(rows, 2, 0, 2, 2, seed=7, start=1)] == whole[1:]
    assert [b["labels"].tolist() for b in epoch_micro_batches(rows, 3, 0, 2, 2, seed=7)] != whole  # new epoch order


def test_task_sums_classification_and_tokens():
    from types import SimpleNamespace

    # sequence classification: 3 examples, 2 correct
    out = SimpleNamespace(loss=torch.tensor(0.5), logits=torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]]))
    c = TaskSums.of(out, {"input_ids": torch.zeros(3, 4), "labels": torch.tensor([0, 1, 1])})
    assert (c.loss_sum, c.examples, c.correct, c.labelled) == (1.5, 3.0, 2.0, 3.0)
    # token classification: the -100 positions are not counted; accumulated sums give the exact mean
    out2 = SimpleNamespace(loss=torch.tensor(1.0), logits=torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]]))
    c2 = TaskSums.of(out2, {"input_ids": torch.zeros(1, 3), "labels": torch.tensor([[0, -100, 1]])})
    assert (c2.loss_sum, c2.examples, c2.correct, c2.labelled) == (1.0, 1.0, 1.0, 2.0)
    assert (c + c2).figures() == {"loss": pytest.approx(2.5 / 4), "accuracy": pytest.approx(3 / 5)}
    # regression and QA heads: loss only
    reg = SimpleNamespace(loss=torch.tensor(2.0), logits=torch.zeros(2, 1))
    assert TaskSums.of(reg, {"input_ids": torch.zeros(2, 3), "labels": torch.zeros(2)}).figures() == {"loss": 2.0}


@pytest.mark.parametrize("n, world, bs, want", [(100, 1, 32, 4), (100, 2, 32, 2), (64, 2, 32, 1), (5, 4, 32, 1)])
def test_steps_per_epoch(n, world, bs, want):
    assert steps_per_epoch(n, world, bs) == want


def test_resolve_local_and_scratch(minilm_dir, mlflow_store):
    src = resolve_source(str(minilm_dir))
    assert src.model_dir == str(minilm_dir.resolve()) and src.preset is None
    s = resolve_source("scratch:tiny", str(minilm_dir / "vocab.txt"))
    assert (s.model_dir, s.preset, s.tokenizer_path) == (None, "tiny", str(minilm_dir / "vocab.txt"))
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        resolve_source("scratch:huge", str(minilm_dir))
    # the default scratch vocabulary is the registered pretrained model's; an empty registry says what to pass
    with pytest.raises(ConfigError, match="pass --data.tokenizer"):
        resolve_source("scratch:tiny")
    with pytest.raises(ConfigError, match="directory with config.json"):
        resolve_source("/nonexistent/model")


def test_resolve_registry_lineage(minilm_dir, mlflow_store, tmp_path):
    from pipeline import tracking

    run_id = tracking.start_run("pretrain-test", "pre", {})
    v = tracking.register_hf_model(
        str(minilm_dir), "minilm", "latest-pretrain", {"run_id": run_id, "config_hash": "abc"}, run_id
    )
    src = resolve_source("models:/minilm@latest-pretrain", download_dir=str(tmp_path / "a"))
    assert (Path(src.model_dir) / "model.safetensors").is_file()
    assert src.tags["source_model"] == f"models:/minilm/{v}"
    assert src.tags["pretrain_run_id"] == run_id and src.tags["source_config_hash"] == "abc"
    # scratch baseline borrows the registered model's vocabulary
    s = resolve_source("scratch:tiny", "models:/minilm@latest-pretrain", download_dir=str(tmp_path / "b"))
    assert (Path(s.tokenizer_path) / "vocab.txt").read_text() == (minilm_dir / "vocab.txt").read_text()
    assert s.tags["scratch_tokenizer_model"] == f"models:/minilm/{v}"


@pytest.fixture(scope="module")
def pydocs_small(shared_dir, minilm_dir):
    t = shared_dir / "tasks" / "pydocs_topic"
    return prepare_task(
        "sequence-classification",
        t / "train.tsv",
        t / "dev.tsv",
        minilm_dir,
        32,
        max_train_examples=12,
        max_eval_examples=40,
    )


def test_task_model_keeps_encoder_and_labels(minilm_dir, pydocs_small):
    from safetensors.torch import load_file

    m = task_model(resolve_source(str(minilm_dir)), pydocs_small, {}, 30522)
    assert m.config.num_labels == 6 and m.config.id2label[2] == "library"
    assert m.load_report["missing"] == ["classifier.bias", "classifier.weight"]
    ref = load_file(str(minilm_dir / "model.safetensors"))
    assert torch.equal(
        m.state_dict()["bert.encoder.layer.5.output.dense.weight"], ref["encoder.layer.5.output.dense.weight"]
    )
    s = task_model(resolve_source("scratch:tiny", str(minilm_dir)), pydocs_small, {}, 30522)
    assert (s.config.hidden_size, s.config.vocab_size, s.config.num_labels) == (128, 30522, 6)


def _force(linear: torch.nn.Linear, bias: list[float]) -> None:
    """Make a head's output the constant `bias` (zero weights), so predictions are known in advance."""
    with torch.no_grad():
        linear.weight.zero_()
        linear.bias.copy_(torch.tensor(bias))


def test_evaluate_classification_bookkeeping(minilm_dir, pydocs_small):
    m = task_model(resolve_source("scratch:tiny", str(minilm_dir)), pydocs_small, {}, 30522)
    _force(m.classifier, [0, 0, 5.0, 0, 0, 0])  # always "library"
    res = evaluate(m, pydocs_small, FinetuneConfig())
    gold = np.asarray(pydocs_small.eval["labels"])
    assert res["accuracy"] == pytest.approx((gold == 2).mean())
    assert res["mcc"] == 0.0  # a constant prediction has no correlation
    # macro-F1: only "library" has non-zero F1 = 2p/(p+1) where p is its share; averaged over 6 labels
    p = (gold == 2).mean()
    assert res["macro_f1"] == pytest.approx(2 * p / (p + 1) / len(set(gold) | {2}))


def test_evaluate_token_bookkeeping(minilm_dir, tmp_path):
    tr = tmp_path / "tr.conll"
    tr.write_text("Naomi B-PER\nwent O\nto O\nBethlehemjudah B-LOC\n\nthe O\nLORD B-DEITY\n")
    ev = tmp_path / "ev.conll"
    ev.write_text("Naomi B-PER\nand O\nBethlehemjudah B-LOC\n\nthe O\nLORD B-DEITY\nGod O\n")
    td = prepare_task("token-classification", tr, ev, minilm_dir, 32)
    m = task_model(resolve_source("scratch:tiny", str(minilm_dir)), td, {}, 30522)
    names = td.id2label
    _force(m.classifier, [5.0 if names[i] == "B-PER" else 0.0 for i in range(len(names))])  # every piece B-PER
    res = evaluate(m, td, FinetuneConfig())
    # word tags predicted: all B-PER (the 3 pieces of bethlehemjudah map to one word) -> 6 predicted entities,
    # gold PER/LOC/DEITY = 3, correct 1 (Naomi); token accuracy 1/6
    assert res["precision"] == pytest.approx(1 / 6) and res["recall"] == pytest.approx(1 / 3)
    assert res["token_accuracy"] == pytest.approx(1 / 6)


def test_evaluate_qa_no_answer_path(minilm_dir):
    td = prepare_task(
        "question-answering",
        DATA / "bible_squad_dev.json",
        DATA / "bible_squad_dev.json",
        minilm_dir,
        96,
        doc_stride=16,
        max_train_examples=4,
        max_eval_examples=30,
    )
    assert td.version_2 and any(not a for a in td.eval_answers.values())
    m = task_model(resolve_source("scratch:tiny", str(minilm_dir)), td, {}, 30522)
    _force(m.qa_outputs, [0.0, 0.0])  # every start/end logit is 0
    # null score 0 − best span score 0 = 0 is not above the default threshold 0.0: every question gets a span
    # (the last tokens by tie order; a span like "." normalises to "" and happens to match a no-answer)
    res = evaluate(m, td, FinetuneConfig())
    assert res["no_ans_exact"] < 100.0
    # with the threshold below 0 every question is answered "" and scores the fraction of unanswerable ones
    res = evaluate(m, td, load_finetune_config(None, ["--eval.null_score_diff_threshold", "-1.0"]))
    frac_no = np.mean([not a for a in td.eval_answers.values()])
    assert res["exact_match"] == pytest.approx(100 * frac_no) and res["f1"] == pytest.approx(100 * frac_no)
    assert res["no_ans_exact"] == 100.0 and res["has_ans_f1"] == 0.0


def test_regression_labels_and_metrics(minilm_dir, tmp_path):
    tr = tmp_path / "sts.tsv"
    tr.write_text("sentence1\tsentence2\tlabel\nNaomi wept\tRuth wept\t3.8\nBoaz slept\tthe LORD spake\t0.5\n")
    ev = tmp_path / "sts_dev.tsv"
    ev.write_text("sentence1\tsentence2\tlabel\nA man\tA man\t5.0\nMoab\tJudah\t1.0\nRuth\tNaomi\t2.0\n")
    td = prepare_task("sequence-classification", tr, ev, minilm_dir, 32)
    assert td.problem_type == "regression" and td.num_labels == 1 and td.eval["labels"] == [5.0, 1.0, 2.0]
    m = task_model(resolve_source("scratch:tiny", str(minilm_dir)), td, {}, 30522)
    assert m.config.problem_type == "regression"
    _force(m.classifier, [2.0])  # predicts 2.0 for every pair
    res = evaluate(m, td, FinetuneConfig())
    assert res["mse"] == pytest.approx((9 + 1 + 0) / 3) and res["pearson"] == 0.0  # constant prediction
    assert res["loss"] == pytest.approx(10 / 3)  # the model's own MSE loss agrees


@pytest.fixture(scope="module")
def modernbert_dir(tmp_path_factory, minilm_dir):
    """A ModernBERT directory written by transformers itself (`save_pretrained` of a modernbert-tiny MLM model,
    random weights) with MiniLM's vocabulary."""
    import shutil

    from transformers import AutoModelForMaskedLM

    from model.build import build_model as build
    from model.family import encoder_config
    from model.hf import save_hf

    torch.manual_seed(0)
    ours, d = tmp_path_factory.mktemp("ours"), tmp_path_factory.mktemp("modernbert")
    save_hf(build(encoder_config("modernbert-tiny", vocab_size=30522)), ours)
    AutoModelForMaskedLM.from_pretrained(ours).save_pretrained(d)
    shutil.copyfile(minilm_dir / "vocab.txt", d / "vocab.txt")
    return d


def _task_files(task, shared_dir, tmp_path):
    if task == "sequence-classification":
        t = shared_dir / "tasks" / "pydocs_topic"
        return t / "train.tsv", t / "dev.tsv", {"max_train_examples": 16, "max_eval_examples": 16}
    if task == "token-classification":
        f = tmp_path / "t.conll"
        f.write_text("Naomi B-PER\nwent O\nto O\nBethlehemjudah B-LOC\n\nthe O\nLORD B-DEITY\n")
        return f, f, {}
    return (
        DATA / "bible_squad_dev.json",
        DATA / "bible_squad_dev.json",
        {"doc_stride": 16, "max_train_examples": 4, "max_eval_examples": 8},
    )


@pytest.mark.parametrize(
    "task,cls,head",
    [
        ("sequence-classification", "ModernBertForSequenceClassification", "classifier"),
        ("token-classification", "ModernBertForTokenClassification", "classifier"),
        ("question-answering", "ModernBertForQuestionAnswering", "classifier"),
    ],
)
def test_a_modernbert_checkpoint_fine_tunes_every_task(modernbert_dir, shared_dir, tmp_path, task, cls, head):
    """The same builder as BERT's: the family from config.json, the encoder's weights from the file, a fresh head;
    BERT's token_type_ids in the task batches stay behind (pipeline.core.precision.forward), and it learns."""
    from safetensors.torch import load_file

    from pipeline.core.precision import forward
    from pipeline.finetune.data import pad_batch

    train, dev, kw = _task_files(task, shared_dir, tmp_path)
    td = prepare_task(task, train, dev, modernbert_dir, 96 if task == "question-answering" else 32, **kw)
    m = task_model(resolve_source(str(modernbert_dir)), td, {}, 30522)
    assert type(m).__name__ == cls and sorted(m.load_report["missing"]) == [f"{head}.bias", f"{head}.weight"]
    ref = load_file(str(modernbert_dir / "model.safetensors"))
    assert torch.equal(m.state_dict()["model.layers.2.mlp.Wo.weight"], ref["model.layers.2.mlp.Wo.weight"])
    res = evaluate(m, td, FinetuneConfig())
    assert {"sequence-classification": "accuracy", "token-classification": "f1", "question-answering": "exact_match"}[
        task
    ] in res and math.isfinite(res["loss"])
    batch = {
        k: torch.as_tensor(v) for k, v in pad_batch(td.train, list(range(min(4, len(td.train["input_ids"]))))).items()
    }
    assert "token_type_ids" in batch
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    m.train()
    losses = []
    for _ in range(8):
        loss = forward(m, batch, torch.device("cpu"), "fp32").loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.7, losses  # it fits one batch: the head and the encoder train
