"""Fine-tune a BERT checkpoint on a task and register the result.

    python jobs/finetune.py --model models:/bert-pretrain@latest-pretrain --task sequence-classification \\
        --train ../shared/tasks/pydocs_topic/train.tsv --eval ../shared/tasks/pydocs_topic/dev.tsv \\
        [--config configs/finetune.yaml] [--train.epochs 2 --data.max_seq_length 64 ...]

--model: models:/name@alias | models:/name/version | a transformers directory | scratch:<preset> (random init;
its vocabulary is --data.tokenizer, by default the one of models:/bert-pretrain@latest-pretrain).
`--task embedding --train PAIRS --eval BEIR_DIR` trains sentence embeddings with in-batch negatives and scores them
by retrieval (the JSON line's ndcg@10, mrr@10, recall@100); the registered directory is a sentence-transformers
model too.
The LR is train.lr (default `auto`: chosen by the model's hidden size); `--tune.lr 1e-4,3e-4,1e-3` instead runs a
Ray Tune sweep, one trial per LR, and registers only the best trial's model (MLflow: one parent run, a child per LR).
Honours MLFLOW_TRACKING_URI (default sqlite:///mlflow.db here) and RAY_ADDRESS (`ray job submit` sets it; unset,
a private local Ray is started, never a `ray start` cluster found on the machine). Checkpoints go under
`train.storage_path` (default runs/, relative to the current directory). Progress goes to stdout; the last
stdout line is one JSON object of the best epoch's eval metrics. Bad input (data, config, source, resources)
prints one line on stderr and exits 1, without a traceback; any other failure too, naming the log that holds
its traceback (pipeline.runner.cli.run_job, as for every job). Ctrl-C or SIGTERM ends the MLflow run as KILLED
(exit code 130).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# `python jobs/finetune.py` puts jobs/ on sys.path, not the project; the project is pip-installed (-e), but a
# plain checkout (e.g. `ray job submit --working-dir .`) should work too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")


# The flags --model, --train and --eval (DESIGN.md) share their names with config sections, and jsonargparse reads
# `--train.lr` as a key of whatever option is called `--train`: the parser knows them by these names, and
# `parse(..., renames=FLAGS)` rewrites what the user typed.
FLAGS = {"--model": "--model-source", "--train": "--train-file", "--eval": "--eval-file"}


def parser():
    """The job's flags (DESIGN.md) beside every `--section.field` of its config sections, all in --help."""
    from pipeline.config import config_parser
    from pipeline.finetune.config import FT_SECTIONS

    ap = config_parser(FT_SECTIONS, __doc__)
    ap.add_argument(
        "--model-source",
        required=True,
        help="--model SRC: models:/name@alias, models:/name/version, a HF dir, or scratch:<preset>",
    )
    ap.add_argument(
        "--task",
        required=True,
        choices=[
            "sequence-classification",
            "sentence-pair-classification",
            "token-classification",
            "question-answering",
            "embedding",
        ],
    )
    ap.add_argument(
        "--train-file",
        required=True,
        help="--train FILE: training file (TSV/CSV/JSONL, CoNLL, or SQuAD "
        "JSON; embedding: pairs with columns query, positive [, negative])",
    )
    ap.add_argument(
        "--eval-file",
        required=True,
        help="--eval FILE: evaluation file, same format (embedding: a BEIR "
        "directory with corpus.jsonl, queries.jsonl and qrels/test.tsv, or a qrels file inside one)",
    )
    ap.add_argument("--output", default=None, help="also keep the fine-tuned HF directory here")
    return ap


def main(argv: list[str] | None = None) -> int:
    from pipeline.runner.cli import run_job

    argv = sys.argv[1:] if argv is None else argv

    def body() -> int:
        from pipeline.config import ConfigError, config_path, parse
        from pipeline.finetune.config import FT_SECTIONS, FinetuneConfig
        from pipeline.finetune.readers import FinetuneDataError
        from pipeline.storage.io import exists
        from pipeline.storage.preflight import check_storage

        check_storage([("--config", config_path(argv), "read")])
        args, sections = parse(parser(), argv, FT_SECTIONS, renames=FLAGS)
        cfg = FinetuneConfig(**sections)
        check_storage(
            [
                ("--train", args.train_file, "read"),
                ("--eval", args.eval_file, "read"),
                ("--data.tokenizer", cfg.data.tokenizer, "read"),
                ("train.storage_path", cfg.train.storage_path, "write"),
            ]
        )
        if args.output and "://" in args.output:
            raise ConfigError(f"--output {args.output}: a local directory only (the registry keeps the model)")
        for p in (
            args.train_file,
            args.eval_file,
        ):  # local files (URIs were checked above), through fsspec like the reader
            if not exists(p):
                raise FinetuneDataError(f"{p}: file does not exist (relative paths resolve against {os.getcwd()})")
        from pipeline.finetune.job import run_finetune  # torch and Ray: after the command line is checked

        result = run_finetune(cfg, args.model_source, args.task, args.train_file, args.eval_file, args.output)
        if result["registered"]:
            print(f"registered {result['registered']} (run {result['run_id']})", flush=True)
        print(json.dumps(result["metrics"], sort_keys=True), flush=True)
        return 0

    return run_job("finetune", body)


if __name__ == "__main__":
    sys.exit(main())
