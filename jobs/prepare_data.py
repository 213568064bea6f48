"""Raw text -> masked-example Parquet shards + manifest (DESIGN.md), as the data part of the stage graph.

    python jobs/prepare_data.py --input ../shared/corpora --output data/prepared --vocab-size 8000
    python jobs/prepare_data.py --input books/ --input wiki.jsonl.gz --output s3://bucket/prep --vocab vocab.txt

Also accepts `--config FILE` (its `data` section) and `--data.field value` overrides. Inputs up to
data.local_max_bytes (1 GiB) are prepared on this machine without Ray (in this process, or on local worker
processes from 2 MiB up); larger ones on the Ray cluster in RAY_ADDRESS, or a local one it starts. Re-running
with the same config and inputs does nothing; an interrupted run resumes. Bad input exits 1 with one line on
stderr. One writer per output directory: a second preparation into the same local directory exits 1 at once,
naming the holder (pipeline.storage.io.output_lock; no lock on s3:// etc.).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parser():
    """The job's flags (DESIGN.md) beside the `data` section's `--data.field` overrides, all in --help."""
    from pipeline.runner.cli import config_parser
    from pipeline.config import DataConfig

    ap = config_parser({"data": DataConfig}, __doc__)
    ap.add_argument("--input", action="append", default=None, help="file or folder; repeat for several")
    ap.add_argument("--output", default=None, help="output directory or URI")
    voc = ap.add_mutually_exclusive_group()
    voc.add_argument("--vocab", default=None, help="existing vocab.txt or tokenizer.json")
    voc.add_argument("--vocab-size", type=int, default=None, help="train a WordPiece vocabulary of this size")
    ap.add_argument("--max-seq-length", type=int, default=None)
    ap.add_argument("--masking", choices=["static", "dynamic"], default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--config", default=None, help="YAML with a `data` section")
    ap.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray started when RAY_ADDRESS is unset")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pipeline.runner.cli import run_job

    def body() -> int:
        from pipeline.runner.cli import parse_cli
        from pipeline.config import load_config, resolve_paths
        from pipeline.data.stages import check_paths
        from pipeline.storage.preflight import check_storage, data_targets

        args, rest = parse_cli(parser(), argv)
        check_storage([("--config", args.config, "read")])

        flags = {"inputs": args.input, "output": args.output, "vocab": args.vocab, "vocab_size": args.vocab_size,
                 "max_seq_length": args.max_seq_length, "masking": args.masking, "seed": args.seed}
        overrides = list(rest)
        if args.vocab_size is not None:  # training a vocabulary: a config file's `vocab` must not win
            overrides += ["--data.vocab", "null"]
        for k, v in flags.items():
            if v is not None:
                overrides += [f"--data.{k}", json.dumps(v)]
        cfg = resolve_paths(load_config(args.config, overrides))
        check_storage(data_targets(cfg.data))  # every URI: filesystem, credentials, endpoint, bucket
        check_paths(cfg.data)  # before Ray starts
        return run(cfg.data, args.num_cpus)

    return run_job("prepare_data", body)


def run(data, num_cpus: int | None) -> int:
    from pipeline import cluster
    from pipeline.runner.dag import run_graph, summary_table
    from pipeline.data.stages import data_stages, needs_ray
    from pipeline.storage.io import output_lock

    with output_lock(data.output):  # held by this process for the whole run; fails before Ray starts
        stages = data_stages(data)  # lists inputs and checks the output before Ray starts
        if needs_ray(data):  # inputs up to data.local_max_bytes are prepared without Ray, which never starts
            cluster.connect(num_cpus)
        try:
            results = run_graph(stages, remote=False, log=lambda m: print(m, flush=True))
        finally:
            if "ray" in sys.modules:  # not imported at all when the data was prepared in this process
                cluster.disconnect()
    v = results["validate"].result
    shards = results["shards"]
    print(summary_table(results))
    s = shards.result
    rows = [
        ("documents read / written / rejected", f"{s['documents_read']} / {s['documents_written']} / {s['documents_rejected']}"),
        ("rejected reasons", ", ".join(f"{k}={n}" for k, n in s["rejected_reasons"].items()) or "-"),
        ("duplicates dropped (exact / near)", "dedup off" if not s.get("duplicates") else
         f"{s['duplicates']['exact']} / {s['duplicates']['near']}  ({v.file('duplicates.jsonl')})"),
        ("examples", str(v.examples)),
        ("tokens", str(v.tokens)),
        ("masked tokens", str(s["masked_tokens"])),
        ("nsp random fraction", "-" if s["nsp_random_fraction"] is None else f"{s['nsp_random_fraction']:.4f}"),
        ("shards (rows)", f"{len(v.shards)} ({', '.join(str(r) for _, r in v.shards)})"),
        ("config_hash", v.config_hash[:16]),
        ("manifest", v.file("manifest.json")),
    ]
    w = max(len(k) for k, _ in rows)
    print("\n".join(f"{k.ljust(w)}  {val}" for k, val in rows))
    if shards.status == "skipped":
        print(f"output {data.output} is up to date (config_hash {v.config_hash[:12]}); nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main())
