"""Can the CPU loader feed a GPU? Token slots per CPU-second of the pretraining loader, from Parquet shards to
device-ready batches, on one core, against what one H100 consumes training BERT-base.

The loader path is the one a worker runs (`pipeline.pretrain.loader`): read the rank's Parquet shards, permute them
in chunks (`epoch_batches`), mask them when the data is dynamically masked (`mask_batch`) and pad them into
tensors (`Batches` -> `collate`). Here it runs in one process with one thread for pyarrow and torch, and its cost
is read as process CPU time, so the figure is per core whatever else the machine runs. Data: the shared corpora
prepared with `jobs/prepare_data.py` into a temporary folder, in two shapes at 128 tokens:

- `mlm`: configs/tiny.yaml's data (MLM only, packed full-length rows, dynamic masking: the loader masks);
- `nsp`: configs/base.yaml's data (MLM + NSP, static masks made at preparation: the loader only pads).

The GPU consumes token slots (batch x length, padding included): bench/RESULTS.md's BERT-base step at 64 x 128,
bf16, eager, on an H100 ran at 190,465 tokens/s. The goal of the GPU issue: 8 cores feed >= 1.5x that, i.e.
8 x (slots per CPU-second) / 190,465 >= 1.5.

    python bench/train/loader_throughput.py                    # both shapes, 64 x 128, 3 passes over the training rows
    python bench/train/loader_throughput.py --shapes mlm --epochs 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import PREPARE_INPUTS, REPO, SHARED, data_config  # noqa: E402

GPU_TOKENS_PER_S = 190_465  # bench/RESULTS.md, GPU: BERT-base 64 x 128 bf16, ours, H100
CORES = 8

SHAPES = {  # the config whose data section is used, and overrides that keep preparation short
    "mlm": ("tiny.yaml", []),
    "nsp": (
        "base.yaml",
        ["--data.vocab_size", "8000", "--data.dupe_factor", "1", "--data.num_shards", "4", "--data.num_actors", "1"],
    ),
}


def prepare(work: Path, shape: str, corpora: str) -> Path:
    """The shared corpora -> Parquet shards at 128 tokens with `shape`'s data settings (dedup off: its cost is
    not the loader's)."""
    config, extra = SHAPES[shape]
    out = work / shape
    subprocess.run(
        [
            sys.executable,
            str(REPO / "jobs" / "prepare_data.py"),
            "--config",
            str(data_config(config, work / config)),
            "--data.inputs",
            json.dumps([corpora]),
            *PREPARE_INPUTS,
            "--data.output",
            str(out),
            "--data.max_seq_length",
            "128",
            "--data.dedup",
            "off",
            *extra,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out


def measure(output: Path, batch: int, epochs: int, seed: int = 0) -> dict[str, float]:
    """Every training row (all shards but the last, held out as in training) `epochs` times through the loader,
    in `batch`-row micro-batches; CPU seconds, wall seconds, real tokens and token slots."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch

    from pipeline.data.dataset import PreparedDataset
    from pipeline.pretrain.loader import Batches, epoch_batches

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    torch.set_num_threads(1)
    ds = PreparedDataset.load(str(output))
    files = [p for p, _ in ds.shards][:-1]
    rows = sum(r for _, r in ds.shards[:-1])
    to_batch = Batches(SimpleNamespace(dataset=ds, mask_rate=None), seed)  # the data's own rate
    n = tokens = slots = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for epoch in range(epochs):
        tables = (pq.read_table(f, use_threads=False) for f in files)
        for _, tbl in epoch_batches(
            tables, num_rows=rows, chunk_rows=16384, batch_size=batch, seed_key=[seed, 0, epoch, 0]
        ):
            b = to_batch(tbl, epoch)
            n, tokens, slots = n + 1, tokens + int(b["num_tokens"]), slots + b["input_ids"].numel()
    return {
        "batches": n,
        "tokens": tokens,
        "slots": slots,
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.perf_counter() - wall0,
        "dynamic": ds.dynamic_masking,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpora", default=str(SHARED / "corpora"))
    ap.add_argument("--shapes", default="mlm,nsp", help="comma-separated: " + ", ".join(SHAPES))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    a = ap.parse_args(argv)
    print(
        f"| data | masking | batches | token slots | real tokens | CPU s | wall s | slots / CPU-s | real / CPU-s | "
        f"{CORES} cores ÷ {GPU_TOKENS_PER_S:,} |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as work:
        for shape in a.shapes.split(","):
            r = measure(prepare(Path(work), shape, a.corpora), a.batch, a.epochs)
            per_core = r["slots"] / r["cpu_s"]
            print(
                f"| {shape} | {'dynamic' if r['dynamic'] else 'static'} | {r['batches']:,} | {r['slots']:,} | "
                f"{r['tokens']:,} | {r['cpu_s']:.2f} | {r['wall_s']:.2f} | {per_core:,.0f} | {r['tokens'] / r['cpu_s']:,.0f} | "  # noqa: E501
                f"{CORES * per_core / GPU_TOKENS_PER_S:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
