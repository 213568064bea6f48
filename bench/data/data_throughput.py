"""Data pipeline throughput and memory, as ratios against references measured in the same run.

    python bench/data/data_throughput.py                          # ~20M tokens (shared corpora repeated), 2 CPUs
    python bench/data/data_throughput.py --target-tokens 5e6 --memory-factors 1,8 --write-results

1. reference: raw `tokenizers.Tokenizer.encode_batch` tokens/s over the same text (paragraphs, batches of 4096),
   with the same number of threads as the pipeline has CPUs; run before and after the pipeline (shared machine).
   Also tokens per CPU-second of each whole process tree, which load from other jobs disturbs less.
2. ours: `jobs/prepare_data` stages (raw text in -> shards + manifest on disk) in a child process, with the
   default settings (up to data.local_max_bytes: local worker processes, no Ray); with `--ray-too` also on Ray
   (`local_max_bytes 0`; Ray is started before the clock starts); tokens = tokens of the input text.
3. the common alternative: `datasets.map` with BertTokenizerFast (num_proc = CPUs), grouping into
   max_seq_length blocks, `DataCollatorForLanguageModeling` masking in a batched map, `to_parquet`.
4. peak memory (sum of PSS over the child and every process it starts, sampled every 0.2 s) of a whole
   pipeline run at 1x and at Nx the corpus.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import SHARED, Sampler, minilm_vocab, run_sampled, tree  # noqa: E402


def corpus_texts(root: Path) -> list[str]:
    from pipeline.data.sources import Document, expand_inputs, read_documents

    files, _ = expand_inputs([str(root)])
    return [d.text for f in files for d in read_documents(f) if isinstance(d, Document)]


def build_corpus(src: Path, dest: Path, factor: int) -> Path:
    """The corpus copied `factor` times (each copy's documents are distinct documents to the pipeline)."""
    for r in range(factor):
        shutil.copytree(src, dest / f"copy{r:03d}")
    return dest


def reference_encode(paras_file: str, vocab: Path, threads: int) -> dict:
    """Raw encode_batch over paragraphs in a child with RAYON_NUM_THREADS=threads: tokens, wall and CPU seconds."""
    code = (
        "import json,sys,time\n"
        "from pipeline.data.tokenizer import load_tokenizer\n"
        f"tok=load_tokenizer({str(vocab)!r})\n"
        "paras=json.load(open(sys.argv[1]))\n"
        "t=time.perf_counter();c=time.process_time();n=0\n"
        "for i in range(0,len(paras),4096):\n"
        "    n+=sum(len(e.ids) for e in tok.encode_batch(paras[i:i+4096],add_special_tokens=False))\n"
        "print(json.dumps({'source_tokens':n,'seconds':time.perf_counter()-t,'cpu_seconds':time.process_time()-c}))\n"
    )
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "true"}
    out = subprocess.run([sys.executable, "-c", code, paras_file], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_child(args: list[str]) -> tuple[dict, int]:
    """Run `args` in a child process; its last JSON line, and the peak PSS summed over its process tree."""
    run = run_sampled(args, pss=True)
    if run.returncode != 0:
        raise RuntimeError(f"child failed ({run.returncode}): {' '.join(args)}\n{run.log[-2000:]}")
    return json.loads(next(x for x in reversed(run.log.splitlines()) if x.startswith("{"))), run.sampler.peak_pss


def child_pipeline(corpus: str, out: str, vocab: str, num_cpus: int, local_max_bytes: int | None) -> None:
    """Child mode: start Ray if the input goes to Ray, then time the data stages from raw text to validated shards."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from pipeline.config import DataConfig
    from pipeline.runner.dag import run_graph
    from pipeline.data.stages import data_stages, needs_ray

    extra = {} if local_max_bytes is None else {"local_max_bytes": local_max_bytes}
    # dedup off: the corpus is the shared corpora repeated, whose copies the default (near) would drop
    cfg = DataConfig(inputs=[corpus], output=out, vocab=vocab, num_actors=num_cpus, dedup="off", **extra)
    on_ray = needs_ray(cfg)  # lists the inputs: once
    if on_ray:
        import ray

        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    cpu = Sampler(tree(os.getpid()))  # the driver, Ray's daemons and every worker it starts, from now on
    cpu.start()
    t = time.perf_counter()
    res = run_graph(data_stages(cfg), remote=False, log=lambda m: None)
    secs = time.perf_counter() - t
    cpu.stop()
    cpu_secs = cpu.cpu_seconds
    m = json.loads(Path(out, "manifest.json").read_text())
    if on_ray:
        ray.shutdown()
    print(
        json.dumps(
            {
                "seconds": secs,
                "cpu_seconds": cpu_secs,
                "source_tokens": m["source_tokens"],
                "examples": m["examples"],
                "tokens": m["tokens"],
                "status": res["shards"].status,
                "path": "Ray" if on_ray else "local",
            }
        )
    )


def child_hf(corpus: str, out: str, model_dir: str, num_cpus: int, max_len: int) -> None:
    """Child mode: the datasets.map + DataCollatorForLanguageModeling pipeline, text -> masked parquet."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_CACHE"] = os.path.join(out, "cache")
    import datasets
    from transformers import BertTokenizerFast, DataCollatorForLanguageModeling

    datasets.disable_progress_bars()
    tok = BertTokenizerFast.from_pretrained(model_dir)
    collator = DataCollatorForLanguageModeling(tok, mlm_probability=0.15, return_tensors="np")
    files = sorted(str(p) for p in Path(corpus).rglob("*.txt"))
    wiki = sorted(str(p) for p in Path(corpus).rglob("*.jsonl.gz"))
    cpu = Sampler(tree(os.getpid()))  # num_proc workers included
    cpu.start()
    t = time.perf_counter()

    def gen():
        for f in files:
            yield {"text": Path(f).read_text()}
        for w in wiki:
            with gzip.open(w, "rt") as fh:
                for line in fh:
                    yield {"text": json.loads(line)["text"]}

    ds = datasets.Dataset.from_generator(gen, cache_dir=os.path.join(out, "cache"))
    ds = ds.map(
        lambda b: {"text": [p for t in b["text"] for p in t.split("\n\n") if p.strip()]},
        batched=True,
        remove_columns=["text"],
        num_proc=num_cpus,
    )
    tokenized = ds.map(
        lambda b: tok(b["text"], add_special_tokens=False), batched=True, num_proc=num_cpus, remove_columns=["text"]
    )
    n_tokens = sum(sum(len(x) for x in b["input_ids"]) for b in tokenized.select_columns("input_ids").iter(10000))
    body = max_len - 2

    def group(b):
        ids = [i for x in b["input_ids"] for i in x]
        blocks = [[tok.cls_token_id, *ids[i : i + body], tok.sep_token_id] for i in range(0, len(ids) - body + 1, body)]
        return {"input_ids": blocks}

    grouped = tokenized.map(group, batched=True, num_proc=num_cpus, remove_columns=tokenized.column_names)

    def mask(b):
        m = collator([{"input_ids": x} for x in b["input_ids"]])
        return {"input_ids": m["input_ids"].tolist(), "labels": m["labels"].tolist()}

    masked = grouped.map(mask, batched=True, batch_size=1000, num_proc=num_cpus)
    masked.to_parquet(os.path.join(out, "hf.parquet"))
    secs = time.perf_counter() - t
    cpu.stop()
    print(
        json.dumps(
            {"seconds": secs, "cpu_seconds": cpu.cpu_seconds, "source_tokens": n_tokens, "examples": len(masked)}
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpora", type=Path, default=SHARED / "corpora", help="the corpus (a directory)")
    ap.add_argument("--target-tokens", type=float, default=20e6, help="repeat the corpus to at least this many tokens")
    ap.add_argument("--memory-factors", default="1,8", help="corpus repetitions for the peak-memory comparison")
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--skip-hf", action="store_true", help="skip the datasets.map reference")
    ap.add_argument(
        "--ray-too",
        action="store_true",
        help="also run the pipeline on Ray (--data.local_max_bytes 0) at the throughput size",
    )
    ap.add_argument("--write-results", metavar="FILE", help="also write the table and the command to FILE (markdown)")
    ap.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, *rest = a.child
        if kind == "pipeline":
            child_pipeline(rest[0], rest[1], rest[2], int(rest[3]), None if rest[4] == "default" else int(rest[4]))
        else:
            child_hf(rest[0], rest[1], rest[2], int(rest[3]), int(rest[4]))
        return

    vocab = minilm_vocab()
    texts = corpus_texts(a.corpora)
    from pipeline.data.tokenizer import load_tokenizer

    tok = load_tokenizer(vocab)
    corpus_tokens = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    factor = max(1, math.ceil(a.target_tokens / corpus_tokens))
    mem_factors = [int(x) for x in a.memory_factors.split(",")]
    rows: list[tuple[str, str]] = []
    work = Path(tempfile.mkdtemp(prefix="bench_data_"))
    me = [sys.executable, str(Path(__file__).resolve()), "--child"]
    try:
        print(
            f"corpus: {corpus_tokens} tokens; throughput run at {factor}x = {factor * corpus_tokens / 1e6:.1f}M tokens"
        )
        big = build_corpus(a.corpora, work / f"corpus{factor}", factor)
        paras_file = str(work / "paras.json")
        Path(paras_file).write_text(json.dumps([p for t in texts * factor for p in t.split("\n\n") if p.strip()]))
        # The machine is shared: the reference runs before and after the pipeline and the wall ratio uses their
        # mean; the CPU-seconds ratio (tokens per CPU-second of the whole process tree) is less load-sensitive.
        ref1 = reference_encode(paras_file, vocab, a.num_cpus)
        print(f"reference encode_batch: {ref1['source_tokens']} tokens in {ref1['seconds']:.1f}s")
        ours, peak_big = run_child(
            [*me, "pipeline", str(big), str(work / "out_big"), str(vocab), str(a.num_cpus), "default"]
        )
        print(f"pipeline: {ours['source_tokens']} tokens in {ours['seconds']:.1f}s, peak {peak_big / 2**20:.0f} MiB")
        ref2 = reference_encode(paras_file, vocab, a.num_cpus)
        print(f"reference encode_batch again: {ref2['seconds']:.1f}s")
        refs = [r["source_tokens"] / r["seconds"] for r in (ref1, ref2)]
        ref_tps = sum(refs) / 2
        ref_cpu = (ref1["cpu_seconds"] + ref2["cpu_seconds"]) / 2
        ours_tps = ours["source_tokens"] / ours["seconds"]
        ref_n = ref1["source_tokens"]
        ref_tpc = ref_n / ref_cpu
        rows += [
            ("corpus tokens (1x)", f"{corpus_tokens:,}"),
            (f"throughput run ({factor}x)", f"{ours['source_tokens']:,} tokens, {ours['examples']:,} examples"),
            (
                f"raw encode_batch ({a.num_cpus} threads), before / after",
                f"{refs[0]:,.0f} / {refs[1]:,.0f} tok/s ({ref1['seconds']:.1f} / {ref2['seconds']:.1f} s)",
            ),
            (
                f"pipeline end-to-end ({a.num_cpus} CPUs, {ours['path']})",
                f"{ours_tps:,.0f} tok/s ({ours['seconds']:.1f} s)",
            ),
            ("wall ratio pipeline / encode_batch (goal >= 0.8)", f"{ours_tps / ref_tps:.2f}"),
            ("CPU-seconds: encode_batch / pipeline", f"{ref_cpu:.1f} / {ours['cpu_seconds']:.1f}"),
            (
                "CPU ratio (tokens per CPU-s) pipeline / encode_batch",
                f"{(ours['source_tokens'] / ours['cpu_seconds']) / ref_tpc:.2f}",
            ),
        ]
        shutil.rmtree(work / "out_big", ignore_errors=True)
        if a.ray_too:
            ray_run, _ = run_child([*me, "pipeline", str(big), str(work / "out_ray"), str(vocab), str(a.num_cpus), "0"])
            print(f"pipeline on Ray: {ray_run['seconds']:.1f}s, {ray_run['cpu_seconds']:.1f} CPU-s")
            rows += [
                (
                    "on Ray (--data.local_max_bytes 0): wall, CPU-s",
                    f"{ray_run['seconds']:.1f} s, {ray_run['cpu_seconds']:.1f} CPU-s (Ray started before the clock)",
                ),
                (
                    "on Ray: wall ratio / CPU ratio vs encode_batch",
                    f"{ray_run['source_tokens'] / ray_run['seconds'] / ref_tps:.2f} / "
                    f"{ray_run['source_tokens'] / ray_run['cpu_seconds'] / ref_tpc:.2f}",
                ),
            ]
            shutil.rmtree(work / "out_ray", ignore_errors=True)
        if not a.skip_hf:
            hf, _ = run_child([*me, "hf", str(big), str(work / "hf"), str(vocab.parent), str(a.num_cpus), "128"])
            hf_tps = hf["source_tokens"] / hf["seconds"]
            print(
                f"datasets.map + collator: {hf['source_tokens']} tokens in {hf['seconds']:.1f}s = {hf_tps:,.0f} tok/s"
            )
            rows += [
                (
                    "datasets.map + DataCollatorForLM",
                    f"{hf_tps:,.0f} tok/s ({hf['seconds']:.1f} s, {hf['cpu_seconds']:.1f} CPU-s)",
                ),
                ("wall ratio pipeline / datasets.map", f"{ours_tps / hf_tps:.2f}"),
                (
                    "CPU ratio pipeline / datasets.map",
                    f"{(ours['source_tokens'] / ours['cpu_seconds']) / (hf['source_tokens'] / hf['cpu_seconds']):.2f}",
                ),
            ]
            shutil.rmtree(work / "hf", ignore_errors=True)
        shutil.rmtree(big, ignore_errors=True)
        peaks = {}
        for f in mem_factors:
            c = build_corpus(a.corpora, work / f"corpus_m{f}", f)
            _, peaks[f] = run_child(
                [*me, "pipeline", str(c), str(work / f"out_m{f}"), str(vocab), str(a.num_cpus), "default"]
            )
            print(f"peak memory at {f}x: {peaks[f] / 2**20:.0f} MiB")
            rows.append((f"peak memory (PSS, whole run) at {f}x", f"{peaks[f] / 2**20:,.0f} MiB"))
            shutil.rmtree(c, ignore_errors=True)
            shutil.rmtree(work / f"out_m{f}", ignore_errors=True)
        lo, hi = min(mem_factors), max(mem_factors)
        rows.append((f"memory ratio {hi}x / {lo}x (goal <= 1.5)", f"{peaks[hi] / peaks[lo]:.2f}"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    w = max(len(k) for k, _ in rows)
    table = "\n".join(
        [f"| {'measure'.ljust(w)} | value |", f"|{'-' * (w + 2)}|-------|"]
        + [f"| {k.ljust(w)} | {v} |" for k, v in rows]
    )
    print(table)
    if a.write_results:
        cmd = "python bench/data/data_throughput.py " + " ".join(sys.argv[1:])
        Path(a.write_results).write_text(
            f"# Data pipeline benchmark\n\nCommand: `{cmd}`  \nMachine: {os.cpu_count()} cores shared with other "
            f"jobs (load varies); run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n\n{table}\n"
        )


if __name__ == "__main__":
    main()
