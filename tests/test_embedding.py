"""Sentence embeddings (`--task embedding`, pipeline/finetune/embedding.py): in-batch negatives gathered across
workers (2 workers x batch B train as 1 worker x 2B: the same loss and gradients, in-process DDP over gloo, threads
as ranks as in tests/test_elastic.py), the batches and training figures, the sentence-transformers export (a
SentenceTransformer loads it and embeds as we do, BERT and ModernBERT), and the job end to end on a real local Ray
cluster and MLflow store."""

from __future__ import annotations

import copy
import datetime
import json
import os
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from model.bert import BertModel
from model.build import build_model
from model.config import BertConfig
from model.family import encoder_config
from model.pooling import sentence_embedding
from pipeline.finetune import embedding as E

REPO = Path(__file__).resolve().parents[1]
SEARCH = REPO / "configs" / "eval" / "tasks" / "pydocs_search"
VOCAB, B = 60, 4


def _group(store, rank: int, world: int):
    """This rank's gloo process group (each rank thread makes its own; they meet in `store`)."""
    backend = dist.ProcessGroupGloo(dist.PrefixStore("g", store), rank, world, datetime.timedelta(seconds=60))
    pg = dist.ProcessGroup(dist.PrefixStore("g", store), rank, world)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    return pg


_KEPT: list = []
"""Every rank's DDP model (and its process group), never freed while the tests run (tests/test_elastic.py, _KEPT)."""


def _rows(n: int, negatives: bool) -> dict[str, list]:
    g = torch.Generator().manual_seed(1)

    def text() -> list[int]:
        return [2, *torch.randint(5, VOCAB, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist(), 3]

    rows = {"input_ids": [text() for _ in range(n)], "positive_ids": [text() for _ in range(n)]}
    if negatives:
        rows["negative_ids"] = [text() for _ in range(n)]
    return rows


def _step(world: int, rows: dict[str, list], pooling: str) -> tuple[float, dict[str, torch.Tensor]]:
    """One forward/backward of the global batch (all of `rows`) on `world` rank threads, each taking its stride of
    the rows as `loop.epoch_micro_batches` does: (the loss summed as the loop's counts sum it, rank 0's gradients
    after DDP's average)."""
    torch.manual_seed(0)
    init = BertModel(
        BertConfig.from_preset(
            "tiny",
            vocab_size=VOCAB,
            max_position_embeddings=16,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
    )
    store, sums, grads, errors = dist.HashStore(), {}, {}, []

    def rank_run(rank: int) -> None:
        try:
            group = _group(store, rank, world) if world > 1 else None
            model = E.ContrastiveModel(copy.deepcopy(init), pooling, 0.05, group=group)
            if world > 1:
                model = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
                _KEPT.append(model)
            idx = list(range(rank, len(rows["input_ids"]), world))
            batch = {k: torch.as_tensor(v) for k, v in E.pair_batch(rows, idx).items() if k != "num_tokens"}
            out = model(**batch)
            out.loss.backward()
            sums[rank] = E.PairSums.of(out, batch)
            grads[rank] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=rank_run, args=(r,)) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    if errors:
        raise errors[0]
    total = sum(sums.values())
    return float(total.loss_sum / total.queries), {n.removeprefix("module."): g for n, g in grads[0].items()}


@pytest.mark.parametrize("negatives", [False, True], ids=["pairs", "hard-negatives"])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_two_workers_of_batch_b_train_as_one_worker_of_2b(one_thread, negatives, pooling):
    """The loss and every gradient of 2 workers x B pairs (documents gathered across the workers) equal 1 worker x
    2B's, to fp32 rounding; without the gather a worker would see half the negatives and another loss."""
    rows = _rows(2 * B, negatives)
    loss1, g1 = _step(1, rows, pooling)
    loss2, g2 = _step(2, rows, pooling)
    assert loss2 == pytest.approx(loss1, rel=1e-6, abs=1e-6)
    assert g1.keys() == g2.keys() and not any(k.startswith("encoder.pooler.") for k in g1)  # the pooler is frozen
    for name in g1:
        torch.testing.assert_close(g2[name], g1[name], rtol=1e-4, atol=1e-6, msg=name)
    # each worker alone (its B pairs, its own negatives only) is another loss: the gather is what makes them equal
    half = {k: [v[i] for i in range(0, 2 * B, 2)] for k, v in rows.items()}
    assert abs(_step(1, half, pooling)[0] - loss1) > 1e-3


def test_pair_batch_and_the_training_figures():
    rows = _rows(3, negatives=True)
    b = E.pair_batch(rows, [2, 0])
    assert b["input_ids"].shape[0] == 2 and b["doc_input_ids"].shape[0] == 4  # positives, then negatives
    assert b["doc_input_ids"][2, : len(rows["negative_ids"][2])].tolist() == rows["negative_ids"][2]
    assert int(b["num_tokens"]) == sum(len(rows[k][i]) for k in rows for i in (2, 0))
    # sums: the loss sum, queries, queries whose positive scored highest
    out = E.ContrastiveOutput(
        torch.tensor(0.5), torch.tensor([[3.0, 1.0, 0.0, 0.0], [2.0, 1.0, 0.0, 0.0]]), torch.tensor([0, 1])
    )
    assert E.PairSums.of(out, {}).pack().tolist() == [1.0, 2.0, 1.0]


def test_exact_search_in_chunks_is_one_search(monkeypatch):
    """Scores computed a few queries at a time (`SCORE_ELEMENTS`) rank and score as all at once; each query's run
    holds its top 100 and the loss is the mean over (query, relevant document) pairs."""
    from pipeline.finetune import retrieval

    g = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(7, 16, generator=g), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(150, 16, generator=g), dim=-1)
    qids, dids = [f"q{i}" for i in range(7)], [f"d{i}" for i in range(150)]
    qrels = {f"q{i}": {f"d{3 * i}": 1, f"d{3 * i + 1}": 2} for i in range(7)}
    whole = retrieval.retrieval_scores(q, d, qids, dids, qrels, 0.05)
    monkeypatch.setattr(retrieval, "SCORE_ELEMENTS", 300)  # two queries at a time
    assert retrieval.retrieval_scores(q, d, qids, dids, qrels, 0.05) == pytest.approx(whole, rel=1e-6)  # float32 sums
    s = q @ d.T / 0.05
    want = sum(float(torch.logsumexp(s[i], 0) - s[i, int(k[1:])]) for i in range(7) for k in qrels[f"q{i}"]) / 14
    assert whole["loss"] == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize(
    "module",
    [
        "model.pooling",
        "pipeline.finetune.embedding",
        "pipeline.finetune.retrieval",
        "pipeline.finetune.readers",
        "pipeline.finetune.metrics",
        "pipeline.tracking.runs",
    ],
)
def test_the_worked_examples_in_the_docstrings_hold(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0, result


# -- the sentence-transformers export ----------------------------------------------------------------------------

TEXTS = [
    "How do I read a file line by line?",
    "The json module encodes and decodes JSON.",
    "A short one.",
    "Lists are mutable sequences, typically used to store collections of homogeneous items.",
]


@pytest.mark.parametrize("preset,pooling", [("tiny", "mean"), ("modernbert-tiny", "cls")])
def test_sentence_transformers_loads_the_export_and_embeds_as_we_do(tmp_path, minilm_dir, one_thread, preset, pooling):
    """A fresh encoder of each family saved as the job saves it (transformers directory, the tokenizer files,
    `export_sentence_transformers`): SentenceTransformer(dir) gives our `sentence_embedding`, to 1e-5."""
    from sentence_transformers import SentenceTransformer

    from model.hf import save_hf
    from pipeline.finetune.data import encode_texts, load_tokenizer, pad_batch
    from pipeline.finetune.runs import _copy_tokenizer

    torch.manual_seed(0)
    model = build_model(encoder_config(preset, vocab_size=30522), "embedding").eval()
    out = save_hf(model, tmp_path / "m")
    _copy_tokenizer(str(minilm_dir), out)
    E.export_sentence_transformers(out, pooling, 48)
    ids = encode_texts(load_tokenizer(out), TEXTS, 48)
    x = pad_batch({"input_ids": ids}, range(len(ids)))
    with torch.no_grad():
        ours = sentence_embedding(model, torch.as_tensor(x["input_ids"]), torch.as_tensor(x["attention_mask"]), pooling)
    st = SentenceTransformer(str(out), device="cpu")
    assert st.max_seq_length == 48
    theirs = st.encode(TEXTS, convert_to_tensor=True, batch_size=2)
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)


# -- the job end to end ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_job_trains_registers_exports_and_evaluates(ray_local, tmp_path, minilm_dir, monkeypatch, capsys):
    """`jobs/finetune.py --task embedding` from scratch:tiny (MiniLM's vocabulary) on the derived pydocs_search task
    at its smallest: 2 workers (the negatives gathered across them), 2 epochs of 2 steps, 20 test queries against
    the whole corpus. The JSON line has the contract's metrics, measured again with the corpus embedded by Ray Data
    (equal to the best epoch's own evaluation); the registered version is tagged with its task and pooling, and
    SentenceTransformer loads it and embeds as the job does."""
    from mlflow import MlflowClient
    from sentence_transformers import SentenceTransformer

    from conftest import load_job, sqlite_store
    from model.build import load_model
    from pipeline import tracking
    from pipeline.finetune.data import encode_texts, load_tokenizer, pad_batch

    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_store(tmp_path / "mlflow.db"))
    rc = load_job("finetune").main(
        [
            "--model",
            "scratch:tiny",
            "--task",
            "embedding",
            "--train",
            str(SEARCH / "train.tsv"),
            "--eval",
            str(SEARCH),
            "--data.tokenizer",
            str(minilm_dir),
            "--data.max_seq_length",
            "32",
            "--data.max_train_examples",
            "64",
            "--data.max_eval_examples",
            "20",
            "--train.epochs",
            "2",
            "--train.batch_size",
            "16",
            "--train.lr",
            "1e-3",
            "--train.num_workers",
            "2",
            "--train.cpus_per_worker",
            "0.5",
            "--train.torch_threads",
            "1",
            "--train.storage_path",
            str(tmp_path / "runs"),
            "--tracking.model_name",
            "pydocs-search",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    metrics = json.loads(out.strip().splitlines()[-1])
    assert {"ndcg@10", "mrr@10", "recall@100"} <= set(metrics) and 0 < metrics["recall@100"] <= 1
    assert "registered models:/pydocs-search/1" in out

    c = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    mv = c.get_model_version("pydocs-search", "1")
    assert mv.tags["task"] == "embedding" and mv.tags["pooling"] == "mean"
    assert float(mv.tags["eval_ndcg_at_10"]) == pytest.approx(metrics["ndcg@10"], abs=1e-6)
    history = c.get_metric_history(mv.run_id, "eval/ndcg_at_10")  # MLflow's names take no '@'
    assert len(history) == 2 and len(c.get_metric_history(mv.run_id, "train/accuracy")) == 4
    best = next(m.value for m in history if m.step == metrics["step"])
    assert metrics["ndcg@10"] == pytest.approx(best, abs=1e-5)  # Ray Data's corpus vectors give the loop's figure

    local, _ = tracking.fetch_registered("models:/pydocs-search/1", str(tmp_path / "download"))
    encoder = load_model(local, "embedding").eval()
    ids = encode_texts(load_tokenizer(local), TEXTS, 32)
    x = pad_batch({"input_ids": ids}, range(len(ids)))
    with torch.no_grad():
        ours = sentence_embedding(encoder, torch.as_tensor(x["input_ids"]), torch.as_tensor(x["attention_mask"]))
    theirs = SentenceTransformer(local, device="cpu").encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.bench
def test_the_retrieval_bench_runs_at_its_smallest(ray_local, capsys):
    """bench/quality/retrieval.py on the module's cluster: 32 documents each way, one round, one search size."""
    from conftest import load_bench

    load_bench("retrieval").main(
        [
            "--docs",
            "32",
            "--rounds",
            "1",
            "--search-sizes",
            "1000",
            "--queries",
            "4",
            "--max-seq-length",
            "32",
            "--skip-quality",
        ]
    )
    out = capsys.readouterr().out
    assert "| Ray Data map_batches |" in out and "ratio Ray Data / loop: " in out and "| 1,000 | " in out
