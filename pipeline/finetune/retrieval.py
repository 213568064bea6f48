"""Retrieval evaluation of sentence embeddings, BEIR's way: embed the corpus and the queries, rank every document
by cosine similarity for each query (exact search), and score the ranking against the qrels with trec_eval's
measures (`pipeline.finetune.metrics.retrieval_metrics`): `ndcg@10`, `mrr@10`, `recall@100`.

Two ways to embed, one way to score (`retrieval_scores`):
- `evaluate` embeds a tokenized `TaskData` in the calling process: the fine-tuning loop's evaluation after each
  epoch (on rank 0, as every task's), which picks the best epoch, and an evaluation trial's test split.
- `evaluate_on_cluster` embeds a BEIR set with `embed_on_cluster`, a Ray Data `map_batches` over the texts on
  the cluster's CPUs (an actor per free CPU) or GPUs (an actor per GPU), each actor tokenizing and embedding its
  batches: what the job reports for the model it registers, so that a large corpus is not one process's work.

Exact search holds the corpus's vectors in memory (N x H float32: 1.5 GB for a million 384-wide vectors) and
costs Q x N x H multiply-adds; a query chunk's scores are at most `SCORE_ELEMENTS` floats at a time. Where that
stops being enough, and an approximate index (faiss HNSW or IVF) is needed, is in docs/finetuning.md
("Embeddings"), from bench/results/quality.md's measurement.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from model.pooling import Pooling, sentence_embedding
from pipeline.core.precision import autocast
from pipeline.finetune.data import TaskData, pad_batch

TOP_K = 100
"""Documents kept per query: recall@100's depth (nDCG@10 and MRR@10 read the first 10)."""
SCORE_ELEMENTS = 1 << 24
"""Query-by-document scores computed at once (64 MB of float32)."""


def retrieval_scores(
    queries: torch.Tensor,
    docs: torch.Tensor,
    query_ids: list[str],
    doc_ids: list[str],
    qrels: dict[str, dict[str, int]],
    temperature: float,
) -> dict[str, float]:
    """`ndcg@10`, `mrr@10`, `recall@100` of unit vectors `queries` (Q, H) searched exactly against `docs` (N, H),
    and `loss`: the InfoNCE of each (query, relevant document) pair against the whole corpus, at `temperature`.

        >>> q = torch.tensor([[1.0, 0.0], [0.0, 1.0]]); d = torch.tensor([[0.6, 0.8], [1.0, 0.0], [0.0, 1.0]])
        >>> r = retrieval_scores(q, d, ["a", "b"], ["x", "y", "z"], {"a": {"x": 1}, "b": {"z": 1}}, 1.0)
        >>> {k: round(v, 4) for k, v in r.items()}  # a finds x second (1/log2(3) = 0.6309), b finds z first
        {'ndcg@10': 0.8155, 'mrr@10': 0.75, 'recall@100': 1.0, 'loss': 0.9472}
    """
    from pipeline.finetune.metrics import retrieval_metrics

    k = min(TOP_K, len(doc_ids))
    step = max(1, SCORE_ELEMENTS // max(1, len(doc_ids)))
    column = {d: j for j, d in enumerate(doc_ids)}
    run: dict[str, dict[str, float]] = {}
    loss_sum, pairs = 0.0, 0
    for a in range(0, len(query_ids), step):
        s = queries[a : a + step] @ docs.T  # (c, N) cosines
        top_s, top_i = s.topk(k, dim=1)
        lse = torch.logsumexp(s / temperature, dim=1)  # (c,)
        for r, qid in enumerate(query_ids[a : a + step]):
            run[qid] = {doc_ids[j]: float(v) for j, v in zip(top_i[r].tolist(), top_s[r].tolist())}
            for did in qrels[qid]:
                loss_sum += float(lse[r] - s[r, column[did]] / temperature)
                pairs += 1
    return {**retrieval_metrics({q: qrels[q] for q in query_ids}, run), "loss": loss_sum / max(1, pairs)}


@torch.no_grad()
def embed(
    encoder: torch.nn.Module,
    ids: list[list[int]],
    pooling: Pooling,
    batch_size: int,
    device: torch.device | str = "cpu",
    precision: str = "fp32",
) -> torch.Tensor:
    """(N, H) float32 unit vectors of tokenized texts, on the CPU; batches of similar length (longest first)."""
    device = torch.device(device)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    out = torch.empty(len(ids), encoder.config.hidden_size)
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        x = pad_batch({"input_ids": ids}, idx)
        with autocast(device, precision):
            v = sentence_embedding(
                encoder,
                torch.as_tensor(x["input_ids"], device=device),
                torch.as_tensor(x["attention_mask"], device=device),
                pooling,
            )
        out[idx] = v.float().cpu()
    return out


def evaluate(model: torch.nn.Module, td: TaskData, cfg: Any, device: torch.device | str = "cpu") -> dict[str, float]:
    """The loop's evaluation of an embedding task: `td`'s queries against its whole corpus, in this process."""
    from pipeline.finetune.embedding import encoder_of

    encoder = encoder_of(model)
    was_training = encoder.training
    encoder.eval()
    device = torch.device(device)
    precision = cfg.train.precision if device.type == "cuda" else "fp32"  # CPU evaluation stays exact
    e, r = cfg.embedding, td.retrieval
    try:
        q = embed(encoder, td.eval["input_ids"], e.pooling, cfg.train.eval_batch_size, device, precision)
        d = embed(encoder, r.corpus, e.pooling, cfg.train.eval_batch_size, device, precision)
    finally:
        encoder.train(was_training)
    return retrieval_scores(q, d, r.query_ids, r.doc_ids, r.qrels, e.temperature)


# ---------------------------------------------------------------------------------------------------------------
# on the cluster


class CorpusEmbedder:
    """Texts -> unit vectors, in one process: a Ray Data actor of `embed_on_cluster` (or a plain loop). It
    tokenizes its batches itself, so a large corpus is tokenized in parallel too."""

    def __init__(
        self, model: Any, tokenizer: str, pooling: Pooling, max_seq_length: int, threads: int = 1, use_gpu: bool = False
    ) -> None:
        import ray
        from tokenizers import Tokenizer

        from model.build import rebuild

        init = ray.get(model) if isinstance(model, ray.ObjectRef) else model  # {"class", "config", "state_dict"}
        if not use_gpu:
            torch.set_num_threads(threads)
        self.device = torch.device("cuda" if use_gpu else "cpu")
        self.encoder = rebuild(init["class"], init["config"])
        self.encoder.load_state_dict(init["state_dict"])
        self.encoder.eval().to(self.device)
        self.tok = Tokenizer.from_str(tokenizer)
        self.tok.enable_truncation(max_seq_length)
        self.pooling = pooling

    @torch.no_grad()
    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """{"row", "text"} -> {"row", "embedding"} (float32, one vector a row)."""
        ids = [enc.ids for enc in self.tok.encode_batch([str(t) for t in batch["text"]])]
        x = pad_batch({"input_ids": ids}, range(len(ids)))
        v = sentence_embedding(
            self.encoder,
            torch.as_tensor(x["input_ids"], device=self.device),
            torch.as_tensor(x["attention_mask"], device=self.device),
            self.pooling,
        )
        return {"row": np.asarray(batch["row"]), "embedding": v.cpu().numpy()}


def embed_on_cluster(
    model: Any,
    tokenizer: str,
    texts: list[str],
    pooling: Pooling,
    max_seq_length: int,
    batch_size: int = 64,
    use_gpu: bool = False,
    actors: int | None = None,
) -> np.ndarray:
    """(N, H) float32 unit vectors of `texts`, in their order: a Ray Data `map_batches` of `CorpusEmbedder` actors,
    one per GPU with `use_gpu`, else one per free CPU (or `actors`), each on one CPU thread. `model` is the
    encoder as `{"class", "config", "state_dict"}` (or an object ref to it: every actor reads one copy from the
    object store, so the driver's files never need to be on the workers); `tokenizer` a tokenizer.json string."""
    import pyarrow as pa
    import ray

    from pipeline import cluster

    cluster.quiet_ray_data()
    free = ray.available_resources()
    if actors is None:
        actors = max(1, int(free.get("GPU", 0)) if use_gpu else int(free.get("CPU", 1)))
    ref = model if isinstance(model, ray.ObjectRef) else ray.put(model)
    # longest first, so that a batch holds texts of about one length (little padding); rows say where each goes
    order = np.argsort([-len(t) for t in texts], kind="stable")
    per_block = max(batch_size, -(-len(texts) // (4 * actors)) // batch_size * batch_size)  # >= 4 blocks an actor
    blocks = [
        pa.table({"row": order[a : a + per_block], "text": [texts[i] for i in order[a : a + per_block]]})
        for a in range(0, len(texts), per_block)
    ]
    ds = ray.data.from_arrow(blocks).map_batches(
        CorpusEmbedder,
        fn_constructor_kwargs={
            "model": ref,
            "tokenizer": tokenizer,
            "pooling": pooling,
            "max_seq_length": max_seq_length,
            "use_gpu": use_gpu,
        },
        batch_size=batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=actors),
        num_cpus=1,
        num_gpus=1 if use_gpu else 0,
    )
    out: np.ndarray | None = None
    for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
        if out is None:
            out = np.empty((len(texts), b["embedding"].shape[1]), dtype=np.float32)
        out[b["row"]] = b["embedding"]
    assert out is not None
    return out


def evaluate_on_cluster(model_dir: str, eval_path: str, cfg: Any) -> dict[str, float]:
    """A transformers directory holding a bare encoder and its tokenizer, scored on a BEIR set (`eval_path`: a
    directory, or a qrels file inside one) with its corpus and queries embedded on the cluster (`embed_on_cluster`);
    the queries are the first `data.max_eval_examples` as in training."""
    import ray

    from model.build import load_model
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.finetune.readers import read_beir

    beir = read_beir(eval_path)
    qids = list(beir.queries)[: cfg.data.max_eval_examples]
    encoder = load_model(model_dir, "embedding")
    ref = ray.put(
        {"class": type(encoder).__name__, "config": asdict(encoder.config), "state_dict": encoder.state_dict()}
    )
    tok = load_tokenizer(model_dir).to_str()
    e, t = cfg.embedding, cfg.train

    def vectors(texts: list[str]) -> torch.Tensor:
        return torch.from_numpy(
            embed_on_cluster(ref, tok, texts, e.pooling, cfg.data.max_seq_length, t.eval_batch_size, t.use_gpu)
        )

    docs = vectors(list(beir.corpus.values()))
    queries = vectors([beir.queries[q] for q in qids])
    return retrieval_scores(queries, docs, qids, list(beir.corpus), {q: beir.qrels[q] for q in qids}, e.temperature)
