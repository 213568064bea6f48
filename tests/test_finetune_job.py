"""Fine-tuning end to end on a real local Ray cluster and a real SQLite MLflow store.

Budgets (2 CPU cores, CI): the real MiniLM checkpoint on pydocs_topic with a 1200-example seeded training subset,
max_seq_length 32, one epoch of 40 steps at batch 16 (LR 3e-4), evaluated on the first 400 dev rows (the quality
at the full budget: bench/results/quality.md); NER (one worker, one epoch of 40 steps at batch 8) and QA (one
epoch) on the Bible-derived fixtures in tests/data with small subsets. The whole path through the
command lines (pretraining, fine-tuning from the registered version, a `--tune.lr` sweep) is
tests/test_secure_tracking.py's, on the cluster's authenticated tracking server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import THREADS, sqlite_store
from pipeline.finetune.config import load_finetune_config
from pipeline.finetune.job import run_finetune

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real SQLite MLflow store and a Ray Train storage dir shared by the module's runs."""
    root = tmp_path_factory.mktemp("ft")
    uri = sqlite_store(root / "mlflow.db")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        yield root


def _cfg(store: Path, *overrides: str):
    return load_finetune_config(
        REPO / "configs" / "finetune.yaml",
        ["--train.storage_path", str(store / "runs"), "--train.torch_threads", str(THREADS), *overrides],
    )


@pytest.mark.slow
def test_pydocs_topic_from_minilm(ray_local, store, shared_dir, minilm_dir):
    from mlflow import MlflowClient

    task = shared_dir / "tasks" / "pydocs_topic"
    cfg = _cfg(
        store,
        "--data.max_seq_length",
        "32",
        "--data.max_train_examples",
        "640",
        "--data.max_eval_examples",
        "400",
        "--train.epochs",
        "1",
        "--train.batch_size",
        "16",
        "--train.lr",
        "3e-4",
        "--tracking.model_name",
        "pydocs-minilm",
    )
    res = run_finetune(
        cfg,
        str(minilm_dir),
        "sequence-classification",
        str(task / "train.tsv"),
        str(task / "dev.tsv"),
        str(store / "pydocs-model"),
    )
    acc = res["metrics"]["accuracy"]
    print(f"pydocs_topic dev accuracy (MiniLM, 40 steps): {acc:.4f}")
    # chance is 1/6; measured 2026-11-28: 0.4525 (at max_seq_length 48, a third more tokens: 0.440, 126 against 108
    # CPU-s for the module's first test alone; at 48: LR 6e-4 0.440 too, 30 steps 0.195, 75 steps 0.550; at 48 and
    # batch 8 on 320 rows: 0.305; the whole train set at 3 LRs and 3 seeds: 0.700 ± 0.013, bench/results/quality.md)
    assert acc >= 0.35, res["metrics"]

    # MLflow: params, a loss per step, eval metrics, the label map, the registered version and its lineage
    c = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    run = c.get_run(res["run_id"])
    assert run.data.params["train.lr"] == "0.0003" and run.data.params["task"] == "sequence-classification"
    assert len(c.get_metric_history(res["run_id"], "train/loss")) == 40
    for key in ("train/lr", "train/grad_norm", "train/tokens_per_s", "train/accuracy"):  # the names pretraining uses
        assert len(c.get_metric_history(res["run_id"], key)) == 40, key
    assert run.info.status == "FINISHED" and "models:" not in res["run_name"] and len(res["run_name"]) <= 60
    assert (store / "runs" / res["run_name"]).is_dir()  # checkpoints under train.storage_path
    assert c.get_metric_history(res["run_id"], "eval/accuracy")[-1].value == pytest.approx(acc)
    assert run.data.tags["source_model"] == str(minilm_dir.resolve())
    label_map = json.loads(Path(c.download_artifacts(res["run_id"], "label_map.json", str(store))).read_text())
    assert label_map["id2label"]["5"] == "whatsnew"
    mv = c.get_model_version("pydocs-minilm", "1")
    assert mv.run_id == res["run_id"] and mv.tags["task"] == "sequence-classification"
    # the run's Datasets panel: the task files, each with its sha256 and what was made of it
    import hashlib

    inputs = {d.tags[0].value: d.dataset for d in run.inputs.dataset_inputs}
    assert {k: d.name for k, d in inputs.items()} == {"training": "train.tsv", "eval": "dev.tsv"}
    assert inputs["training"].digest == hashlib.sha256((task / "train.tsv").read_bytes()).hexdigest()[:36]
    assert (
        json.loads(inputs["eval"].profile)["features"] == 400
        and json.loads(inputs["training"].profile)["features"] == 640
    )

    # the registered directory is a transformers checkpoint with the label names; its logits match ours
    transformers = pytest.importorskip("transformers")
    out = Path(res["model_dir"])
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    hf = transformers.BertForSequenceClassification.from_pretrained(str(out)).eval()
    assert hf.config.id2label[0] == "c-api"
    tok = transformers.BertTokenizerFast.from_pretrained(str(out))
    enc = tok(
        ["Use PyArg_ParseTuple to parse arguments.", "What's new in Python 3.11"], padding=True, return_tensors="pt"
    )
    from model import BertForSequenceClassification
    from model.hf import load_hf

    ours = load_hf(out, BertForSequenceClassification).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(**enc).logits, hf(**enc).logits, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_token_classification_bible(ray_local, store, minilm_dir):
    # one worker, 8 sentences a step, 40 steps (DDP fine-tuning on two workers: test_interrupted_run_resumes_bit_
    # identically). Measured 2026-11-28: entity F1 0.634, token accuracy 0.977; two epochs at batch 16 (the same
    # steps, twice the tokens): F1 0.640, 129 against 94 CPU-s for the test and the module's fixtures alone; one epoch
    # at batch 16 and LR 1e-3: F1 0.222.
    cfg = _cfg(
        store,
        "--data.max_seq_length",
        "48",
        "--data.max_train_examples",
        "320",
        "--data.max_eval_examples",
        "150",
        "--train.epochs",
        "1",
        "--train.num_workers",
        "1",
        "--train.batch_size",
        "8",
        "--train.lr",
        "3e-4",
        "--tracking.register",
        "false",
    )
    res = run_finetune(
        cfg,
        str(minilm_dir),
        "token-classification",
        str(DATA / "bible_ner_train.conll"),
        str(DATA / "bible_ner_dev.conll"),
    )
    m = res["metrics"]
    print(
        f"bible NER entity F1 {m['f1']:.3f} P {m['precision']:.3f} R {m['recall']:.3f} token acc {m['token_accuracy']:.3f}"  # noqa: E501
    )
    # predicting O everywhere scores token accuracy ~0.94 and F1 0; the dev names (Jonah, 1 Samuel 11-16) are
    # partly unseen in training
    assert m["f1"] >= 0.5 and m["token_accuracy"] > 0.96, m


@pytest.mark.slow
def test_question_answering_bible(ray_local, store, minilm_dir, tmp_path):
    """Train on the SQuAD v2-style file (unanswerable questions train the [CLS] target), evaluate on its
    answerable dev questions as a v1.1 file, so the score is the quality of the decoded spans.

    One epoch of 96 questions at LR 3e-4 (7 steps of 16 windows), scored on 40 (measured 2026-11-28: F1 60.0, EM
    60.0, the test 58 s alone; 160 questions, 11 steps, scored on 60: F1 68.7, EM 68.3; 240 questions at LR 2e-4,
    16 steps: F1 58.5, EM 55.0; two epochs cost twice as much and the thresholds hold at one). At this budget the
    v2 abstain decision is not learned reliably (measured at 32 steps: v2 F1 39.5 vs 32.2 for always abstaining,
    best-threshold F1 40.0); the no-answer path is tested with a real model in
    tests/test_finetune.py::test_evaluate_qa_no_answer_path and in tests/test_metrics.py.
    """
    doc = json.loads((DATA / "bible_squad_dev.json").read_text())
    for art in doc["data"]:
        for para in art["paragraphs"]:
            para["qas"] = [
                {k: v for k, v in q.items() if k != "is_impossible"} for q in para["qas"] if not q["is_impossible"]
            ]
    v1 = tmp_path / "bible_squad_dev_v1.json"
    v1.write_text(json.dumps({"version": "1.1", "data": doc["data"]}))
    # 192 tokens hold most contexts whole (the longer ones are split with stride)
    cfg = _cfg(
        store,
        "--data.max_seq_length",
        "192",
        "--data.doc_stride",
        "32",
        "--data.max_train_examples",
        "96",
        "--data.max_eval_examples",
        "40",
        "--train.epochs",
        "1",
        "--train.batch_size",
        "16",
        "--train.lr",
        "3e-4",
        "--tracking.register",
        "false",
    )
    res = run_finetune(cfg, str(minilm_dir), "question-answering", str(DATA / "bible_squad_train.json"), str(v1))
    m = res["metrics"]
    print("bible QA (answerable dev, v1.1): " + json.dumps({k: round(v, 2) for k, v in m.items()}))
    assert "best_f1" not in m and "no_ans_exact" not in m  # v1.1: always answers, no null threshold
    # an untrained head scores ~0 (these 7 steps: F1 60.0); the answer is one name among ~100 words
    assert m["f1"] >= 40 and m["exact_match"] >= 30, m


def _job(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "jobs" / "finetune.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.parametrize(
    "train_text, eval_text, msg",
    [
        (
            "sentence\tlabel\nNaomi wept\ta\nRuth clave\tb\n",
            "sentence\tlabel\nBoaz\tc\n",
            "dev.tsv: row 2: unknown label 'c'",
        ),
        ("text\tlabel\nNaomi wept\ta\n", "sentence\tlabel\nBoaz\ta\n", "train.tsv: row 2: missing column(s) sentence"),
        ("", "sentence\tlabel\nBoaz\ta\n", "train.tsv: file is empty"),
    ],
)
def test_cli_bad_data_one_line(tmp_path, minilm_dir, train_text, eval_text, msg):
    (tmp_path / "train.tsv").write_text(train_text)
    (tmp_path / "dev.tsv").write_text(eval_text)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    p = _job(
        "--model",
        str(minilm_dir),
        "--task",
        "sequence-classification",
        "--train",
        "train.tsv",
        "--eval",
        "dev.tsv",
        cwd=tmp_path,
        env=env,
    )
    assert p.returncode == 1
    assert p.stderr.strip().count("\n") == 0 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not list(tmp_path.glob("runs")), "bad data must fail before any training work"


@pytest.mark.slow  # it joins the module's local Ray cluster
def test_cli_use_gpu_without_gpu_is_one_line(ray_local, tmp_path, minilm_dir):
    """On a cluster without a GPU (the module's, which the job joins through RAY_ADDRESS), `--train.use_gpu true`
    fails right after connecting instead of waiting forever. (A private local cluster is checked before Ray
    starts: tests/test_jobs_cli.py.)"""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    (tmp_path / "train.tsv").write_text("sentence\tlabel\nNaomi wept\ta\nRuth clave\tb\n")
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "RAY_ADDRESS": ray_local.get_runtime_context().gcs_address,
    }
    p = _job(
        "--model",
        str(minilm_dir),
        "--task",
        "sequence-classification",
        "--train",
        "train.tsv",
        "--eval",
        "train.tsv",
        "--train.use_gpu",
        "true",
        cwd=tmp_path,
        env=env,
    )
    assert p.returncode == 1, p.stderr[-2000:]
    assert (
        p.stderr.strip()
        .splitlines()[-1]
        .startswith("finetune: error: train.use_gpu is true but the Ray cluster has no GPU (resources: CPU=2)")
    ), p.stderr
    assert "Traceback" not in p.stderr


def _weights(model_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(Path(model_dir) / "model.safetensors"))


def _history(run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow import MlflowClient

    return sorted(
        (m.step, m.value) for m in MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_metric_history(run_id, key)
    )


@pytest.mark.slow
def test_interrupted_run_resumes_bit_identically(ray_local, store, shared_dir, minilm_dir, tmp_path):
    """Two DDP workers, 2 accumulation micro-steps, checkpoints every 2 steps: a worker failure after step 5
    (checkpoint at step 4, mid epoch 2) is recovered by Ray Train from that checkpoint, and the run ends with
    the same best model, eval metrics and per-step training metrics as an uninterrupted run."""
    task = shared_dir / "tasks" / "pydocs_topic"

    def finetune(name: str, *extra: str, on_step=None) -> dict:
        # 48 rows: 24 per rank, 6 micro-batches of 4, 3 steps per epoch, 6 steps in all
        cfg = _cfg(
            store,
            "--data.max_seq_length",
            "32",
            "--data.max_train_examples",
            "48",
            "--data.max_eval_examples",
            "24",
            "--data.tokenizer",
            str(minilm_dir / "vocab.txt"),
            "--train.epochs",
            "2",
            "--train.num_workers",
            "2",
            "--train.torch_threads",
            "1",
            "--train.batch_size",
            "4",
            "--train.accumulation_steps",
            "2",
            "--train.checkpoint_every_steps",
            "2",
            "--train.lr",
            "1e-3",
            "--tracking.register",
            "false",
            "--tracking.run_name",
            name,
            *extra,
        )
        return run_finetune(
            cfg,
            "scratch:tiny",
            "sequence-classification",
            str(task / "train.tsv"),
            str(task / "dev.tsv"),
            str(tmp_path / name),
            on_step=on_step,
        )

    marker, steps_seen = tmp_path / "fault_injected", tmp_path / "steps_seen"

    def fail_once_after_step_5(step: int, rank: int) -> None:  # pickled by value into the workers
        if rank == 0:
            with open(steps_seen, "a") as f:
                f.write(f"{step}\n")
        if step == 5 and rank == 0 and not marker.exists():
            marker.write_text("injected")
            raise RuntimeError("injected worker failure after step 5")

    base = finetune("ft-baseline")
    resumed = finetune("ft-resumed", "--train.max_failures", "1", on_step=fail_once_after_step_5)
    assert marker.exists()  # the failure really happened
    # and the restarted workers went on from the step-4 checkpoint (not from the start)
    assert steps_seen.read_text().split() == ["1", "2", "3", "4", "5", "5", "6"]
    assert resumed["metrics"] == base["metrics"]
    w0, w1 = _weights(base["model_dir"]), _weights(resumed["model_dir"])
    assert w0.keys() == w1.keys() and all(torch.equal(w0[k], w1[k]) for k in w0)
    for key in ("train/loss", "train/lr", "train/grad_norm", "train/accuracy", "eval/accuracy", "eval/loss"):
        assert _history(resumed["run_id"], key) == _history(base["run_id"], key), key
    assert [s for s, _ in _history(resumed["run_id"], "train/loss")] == [1, 2, 3, 4, 5, 6]  # each step once
    # checkpoints live under train.storage_path, in a directory named by the (short) run name
    assert list((store / "runs" / "ft-resumed").glob("checkpoint_*/best/model.safetensors"))

    # a failure that is not recovered ends the MLflow run FAILED, never left RUNNING: the error Ray Train raises
    # on the driver once its retries are spent (what it raises after a worker error: tests/test_jobs_cli.py's
    # garbled-state test), without paying for a third Train run
    import ray.train

    from pipeline.finetune import runs

    def train_fails(*args, **kwargs):
        raise ray.train.TrainingFailedError("injected failure")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runs, "fit_run", train_fails)
        with pytest.raises(ray.train.TrainingFailedError, match="injected failure"):
            finetune("ft-failed")
    from mlflow import MlflowClient

    from pipeline import tracking

    failed = tracking.find_run("bert-finetune", "ft-failed")
    assert MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_run(failed).info.status == "FAILED"
