"""Score models on an evaluation suite: every task fine-tuned per LR and seed, trials in parallel on Ray.

    python jobs/evaluate.py --model models:/bert-pretrain@latest-pretrain --model scratch:tiny \\
        --suite configs/eval/shared.yaml [--config FILE] [--section.field value ...]

--model (one or more): models:/name@alias | models:/name/version | a transformers directory | scratch:<preset>
(random init; its vocabulary is --data.tokenizer, by default the one of models:/bert-pretrain@latest-pretrain).
--suite: a suite YAML (name, protocol, tasks; docs/evaluation.md). For each task, every LR of the protocol's grid is
fine-tuned with every seed; the LR with the best mean dev score is chosen; the task reports mean ± sd over the seeds
at that LR, on its test file when it has one, else on dev; the suite score is the mean over the tasks.
Every (model, task, LR, seed) is one trial (a fine-tuning run on Ray Train), as many at once as the cluster's CPUs
hold. Each model gets an MLflow evaluation run (experiment bert-evaluate, the trials nested), and a registered
version gets tags `suite.<name>.sha256|score|run_id`; a version already scored on the same suite file is not
evaluated again (--suite.force true does). Prints a table of tasks by models; the last stdout line is one JSON
object: {"suite", "suite_sha256", "models": {SRC: {"score", "tasks": {TASK: {"metric", "mean", "sd", "lr",
"seeds", ...}}}}}. Bad input (suite, files, sources, labels) prints one line on stderr and exits 1 before any trial.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "false")

# `--model` shares its name with the config section `model` (model.overrides): the parser knows it as --model-source
FLAGS = {"--model": "--model-source"}


def parser():
    """The job's flags beside every `--section.field` of its config sections, all in --help."""
    from pipeline.config import config_parser
    from pipeline.evaluate.config import EV_SECTIONS

    ap = config_parser(EV_SECTIONS, __doc__)
    ap.add_argument(
        "--model-source",
        action="append",
        required=True,
        help="--model SRC (repeat for more): models:/name@alias, models:/name/version, a HF dir, or scratch:<preset>",
    )
    ap.add_argument("--suite-file", required=True, help="--suite FILE: the suite YAML (configs/eval/shared.yaml)")
    return ap


def main(argv: list[str] | None = None) -> int:
    from pipeline.runner.cli import run_job

    argv = sys.argv[1:] if argv is None else argv
    argv = [
        "--suite-file"
        if a == "--suite"
        else ("--suite-file=" + a[len("--suite=") :] if a.startswith("--suite=") else a)
        for a in argv
    ]

    def body() -> int:
        from pipeline.config import config_path, parse
        from pipeline.evaluate.config import EV_SECTIONS, EvaluateConfig, check_protocol_owned
        from pipeline.evaluate.suite import load_suite, table
        from pipeline.storage.preflight import check_storage

        check_storage([("--config", config_path(argv), "read")])
        args, sections = parse(parser(), argv, EV_SECTIONS, renames=FLAGS)
        cfg = EvaluateConfig(**sections)
        check_protocol_owned(cfg)  # train.lr, train.epochs, ... are the suite's: refused here, never ignored
        check_storage(
            [
                ("--suite", args.suite_file, "read"),
                ("--data.tokenizer", cfg.data.tokenizer, "read"),
                ("train.storage_path", cfg.train.storage_path, "write"),
            ]
        )
        suite = load_suite(args.suite_file)
        from pipeline.evaluate.job import run_evaluate  # torch and Ray: after the command line is checked

        result = run_evaluate(cfg, list(args.model_source), suite)
        print(table(suite, result["models"]), flush=True)
        print(json.dumps(result, sort_keys=True), flush=True)
        return 0

    return run_job("evaluate", body)


if __name__ == "__main__":
    sys.exit(main())
