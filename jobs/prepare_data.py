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

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parser():
    """The job's flags (DESIGN.md): short names of `data` fields in the same parser as every `--data.field`, all in
    --help. A flag given overrides the config file; `--vocab-size` also drops a config file's `vocab`."""
    from pipeline.config import DataConfig, alias, config_parser
    from pipeline.config.parser import AppendAlias

    class VocabSize(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):  # noqa: ARG002 - argparse's signature
            namespace["data.vocab_size"], namespace["data.vocab"] = values, None

    ap = config_parser({"data": DataConfig}, __doc__)
    alias(ap, "--input", "data.inputs", action=AppendAlias, help="file or folder; repeat for several (data.inputs)")
    alias(ap, "--output", "data.output", help="output directory or URI (data.output)")
    voc = ap.add_mutually_exclusive_group()
    alias(voc, "--vocab", "data.vocab", help="existing vocab.txt or tokenizer.json (data.vocab)")
    alias(
        voc,
        "--vocab-size",
        "data.vocab_size",
        type=int,
        action=VocabSize,
        help="train a vocabulary of this size (data.vocab_size), of the kind --tokenizer says",
    )
    alias(ap, "--tokenizer", "data.tokenizer", choices=["wordpiece", "bpe", "unigram"], help="(data.tokenizer)")
    alias(ap, "--max-seq-length", "data.max_seq_length", type=int, help="(data.max_seq_length)")
    alias(ap, "--masking", "data.masking", choices=["static", "dynamic"], help="(data.masking)")
    alias(ap, "--seed", "data.seed", type=int, help="(data.seed)")
    ap.add_argument(
        "--num-cpus", type=int, default=None, help="CPUs of the local Ray started when RAY_ADDRESS is unset"
    )
    return ap


def _tokenizer_row(t: dict | None) -> str:
    """The manifest's tokenizer entry in one line: kind, size and its report (pipeline.data.tokenizer)."""
    from pipeline.data.tokenizer import report_line

    if not t:
        return "-"
    return f"{t['kind']}, {t['vocab_size']} tokens ({t['unused_tokens']} unused)" + (
        f"; {report_line(t['report'])}" if t.get("report") else ""
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pipeline.runner.cli import run_job

    def body() -> int:
        from pipeline.config import config_parser, config_path, parse, resolve_paths
        from pipeline.config.sections import Config, DataConfig, ModelConfig
        from pipeline.data.stages import check_paths
        from pipeline.storage.preflight import check_storage, data_targets

        check_storage([("--config", config_path(argv), "read")])
        # a preset's data section; DataConfig gives the defaults that --data.sources / --data.inputs clear
        args, sections = parse(parser(), argv, {"data": DataConfig}, config_sections=("data",))
        # the preset's model, so that data.max_seq_length is checked against its positions (modernbert-tiny's 1,024
        # is over the default BERT's 512)
        path = config_path(argv)
        models = {"model": ModelConfig}
        model = parse(config_parser(models), ["--config", path], models, config_sections=("model",))[1] if path else {}
        cfg = resolve_paths(Config(data=sections["data"], **model))
        check_storage(data_targets(cfg.data))  # every URI: filesystem, credentials, endpoint, bucket
        check_paths(cfg.data)  # before Ray starts
        if cfg.data.sources:  # a source with no readable file: one line before the output is locked (created)
            from pipeline.data.sources import check_sources

            check_sources(cfg.data.sources)
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
        (
            "documents read / written / rejected",
            f"{s['documents_read']} / {s['documents_written']} / {s['documents_rejected']}",
        ),
        ("rejected reasons", ", ".join(f"{k}={n}" for k, n in s["rejected_reasons"].items()) or "-"),
        (
            "duplicates dropped (exact / near)",
            "dedup off"
            if not s.get("duplicates")
            else f"{s['duplicates']['exact']} / {s['duplicates']['near']}  ({v.file('duplicates.jsonl')})",
        ),
        ("examples", str(v.examples)),
        ("tokens", str(v.tokens)),
        ("masked tokens", str(s["masked_tokens"])),
        ("nsp random fraction", "-" if s["nsp_random_fraction"] is None else f"{s['nsp_random_fraction']:.4f}"),
        ("shards (rows)", f"{len(v.shards)} ({', '.join(str(r) for _, r in v.shards)})"),
        ("tokenizer", _tokenizer_row(v.manifest.get("tokenizer"))),
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
