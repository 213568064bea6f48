"""Fine-tune a BERT checkpoint on a task and register the result.

    python jobs/finetune.py --model models:/bert-pretrain@latest-pretrain --task sequence-classification \\
        --train ../shared/tasks/pydocs_topic/train.tsv --eval ../shared/tasks/pydocs_topic/dev.tsv \\
        [--config configs/finetune.yaml] [--train.epochs 2 --data.max_seq_length 64 ...]

--model: models:/name@alias | models:/name/version | a transformers directory | scratch:<preset> (random init;
its vocabulary is --data.tokenizer, by default the one of models:/bert-pretrain@latest-pretrain).
Honours MLFLOW_TRACKING_URI (default sqlite:///mlflow.db here) and RAY_ADDRESS (`ray job submit` sets it).
Progress goes to stdout; the last stdout line is one JSON object of the best epoch's eval metrics. Bad input
(data, config, source) prints one line on stderr and exits 2, without a traceback.
"""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="models:/name@alias, models:/name/version, a HF dir, or scratch:<preset>")
    ap.add_argument("--task", required=True, choices=["sequence-classification", "token-classification", "question-answering"])
    ap.add_argument("--train", required=True, help="training file (TSV/CSV/JSONL, CoNLL, or SQuAD JSON)")
    ap.add_argument("--eval", required=True, help="evaluation file, same format")
    ap.add_argument("--config", default=None, help="YAML with sections data/model/train/eval/tracking")
    ap.add_argument("--output", default=None, help="also keep the fine-tuned HF directory here")
    args, overrides = ap.parse_known_args(argv)

    from pipeline.config import ConfigError
    from pipeline.finetune import load_finetune_config, run_finetune
    from pipeline.finetune_data import FinetuneDataError
    from pipeline.tracking import TrackingError

    try:
        cfg = load_finetune_config(args.config, overrides)
        for p in (args.train, args.eval):
            if not Path(p).is_file():
                raise FinetuneDataError(f"{p}: file does not exist")
        result = run_finetune(cfg, args.model, args.task, args.train, args.eval, args.output)
    except (ConfigError, FinetuneDataError, TrackingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result["registered"]:
        print(f"registered {result['registered']} (run {result['run_id']})", flush=True)
    print(json.dumps(result["metrics"], sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
