"""What every Ray Train run of one fine-tuning job shares on the driver, a single run's or a sweep's trial:
`Job` (params, label map, export of the best epoch, registration), `fit_run` (the Ray Train run of
`loop.train_loop_per_worker`), `best_metrics` and `with_lr`. `job` (a single run) and `sweep` (Ray Tune) both use
these; neither imports the other's internals, so imports run one way: job -> sweep -> runs, job -> runs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.config import resolve_path
from pipeline.console import say
from pipeline.finetune.data import TaskData

if TYPE_CHECKING:
    from pipeline.finetune.loop import FinetuneHandoff

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _copy_tokenizer(src: str, dst: Path) -> None:
    p = Path(src)
    files = [p / f for f in TOKENIZER_FILES if (p / f).is_file()] if p.is_dir() else [p]
    for f in files:
        shutil.copyfile(f, dst / f.name)


def with_lr(cfg: Any, lr: float) -> Any:
    """A copy of `cfg` (a `FinetuneConfig`) training at peak LR `lr` (a resolved `auto`, or one trial of a sweep)."""
    return replace(cfg, train=replace(cfg.train, lr=lr))


def fit_run(cfg: Any, shared: FinetuneHandoff, run_id: str, name: str):
    """One Ray Train run of `train_loop_per_worker` at `cfg` (checkpoints in `train.storage_path`/`name`), rank 0
    logging into MLflow run `run_id`; `shared` is what every run of the job hands its workers. A single run and
    every Tune trial of a sweep train through this. Returns Ray's Result."""
    from pipeline import cluster
    from pipeline.finetune.loop import train_loop_per_worker

    t = cfg.train
    scale = cluster.Scale(t.num_workers, t.use_gpu, t.cpus_per_worker, max_failures=t.max_failures, num_to_keep=1)
    return cluster.fit(
        train_loop_per_worker,
        replace(shared, cfg=cfg, run_id=run_id),
        name=name,
        storage_path=resolve_path(t.storage_path),
        scale=scale,
    )


def best_metrics(checkpoint) -> dict[str, float]:
    """The best epoch's eval metrics (and its epoch and step) that a run's final checkpoint carries in `best/`."""
    with checkpoint.as_directory() as d:
        return json.loads(Path(d, "best", "eval_metrics.json").read_text())


@dataclass
class Job:
    """What the runs of one fine-tuning job share on the driver: a single run, or every trial of a sweep."""

    cfg: Any
    """The job's `FinetuneConfig`."""
    source: Any
    """Where the model and tokenizer come from (`job.Source`)."""
    task: str
    td: TaskData
    primary: str
    """The eval metric that picks the best epoch (and the best trial)."""
    tags: dict[str, str]
    """Every run's MLflow tags: the source's lineage, the task and its files."""
    shared: FinetuneHandoff
    """The loop config every Ray Train run shares (see `fit_run`)."""
    work: str
    """The job's temporary directory (removed at the end)."""
    output_dir: str | None = None

    def params(self, cfg: Any) -> dict[str, Any]:
        """The MLflow params of a run at `cfg`."""
        td = self.td
        return {
            **cfg.flat(),
            "task": self.task,
            "source": self.source.spec,
            "num_train_features": len(td.train["input_ids"]),
            "num_eval_features": len(td.eval["input_ids"]),
            "problem_type": td.problem_type,
            "num_labels": td.num_labels,
            "train.global_batch_size": cfg.train.global_batch_size,
        }

    def log_inputs(self, logger, cfg: Any, extra: dict[str, Any]) -> None:
        """Params (plus `extra`) and the label map of a run that trains."""
        logger.log_params({**self.params(cfg), **extra})
        label_map = Path(self.work, "label_map.json")
        label_map.write_text(
            json.dumps(
                {
                    "task": self.task,
                    "problem_type": self.td.problem_type,
                    "id2label": {str(k): v for k, v in self.td.id2label.items()},
                },
                indent=1,
            )
        )
        logger.log_artifact(str(label_map))
        self.log_task_files(logger)

    def log_task_files(self, logger) -> None:
        """The run's Datasets panel: the training file (context `training`) and the evaluation file (`eval`), each
        with its sha256 and what was made of it (pipeline.tracking.lineage)."""
        import hashlib

        from pipeline.finetune.readers import beir_files
        from pipeline.storage.io import sha256_file
        from pipeline.tracking.lineage import PreparedData, log_datasets

        entries = []
        for key, context, feats in (("train_file", "training", self.td.train), ("eval_file", "eval", self.td.eval)):
            path = self.tags[key]
            profile = {
                "task": self.task,
                "features": len(feats["input_ids"]),
                "labels": [self.td.id2label[k] for k in sorted(self.td.id2label)],
            }
            if self.task == "embedding" and key == "eval_file":  # a BEIR set: the sha256 of its files' sha256s
                sha = hashlib.sha256(" ".join(sha256_file(f) for f in beir_files(path)).encode()).hexdigest()
                profile["documents"] = len(self.td.retrieval.doc_ids)
            else:
                sha = sha256_file(path)
            entries.append((PreparedData(path, os.path.basename(path), sha, None, profile), context))
        log_datasets(logger.client, logger.run_id, entries)

    def export(self, checkpoint) -> tuple[dict[str, float], Path]:
        """The best epoch's model out of a run's final checkpoint, with the tokenizer: (its eval metrics, directory).
        An embedding model's directory is made a sentence-transformers model too, and its metrics are measured again
        with the corpus embedded on the cluster (`pipeline.finetune.retrieval.evaluate_on_cluster`)."""
        out = Path(self.output_dir or os.path.join(self.work, "model"))
        out.mkdir(parents=True, exist_ok=True)
        with checkpoint.as_directory() as ck:
            shutil.copytree(os.path.join(ck, "best"), out, dirs_exist_ok=True)
        _copy_tokenizer(self.source.tokenizer_path, out)
        best = json.loads((out / "eval_metrics.json").read_text())
        if self.task == "embedding":  # a sentence-transformers model too, scored with its corpus embedded on Ray Data
            from pipeline.finetune.embedding import export_sentence_transformers
            from pipeline.finetune.metrics import RETRIEVAL_MEASURES
            from pipeline.finetune.retrieval import evaluate_on_cluster

            export_sentence_transformers(out, self.cfg.embedding.pooling, self.cfg.data.max_seq_length)
            final = evaluate_on_cluster(str(out), self.tags["eval_file"], self.cfg)
            say(
                "[finetune] the best epoch's model, its corpus embedded on the cluster: "
                + ", ".join(f"{k} {final[k]:.4f} (in training {best[k]:.4f})" for k in RETRIEVAL_MEASURES),
                sys.stdout,
            )
            best = {**best, **final}
            (out / "eval_metrics.json").write_text(json.dumps(best, indent=1))
        return best, out

    def register(
        self, out: Path, best: dict[str, float], run_id: str, logger, tags: dict[str, str] | None = None
    ) -> str | None:
        """Register `out` as a new version made by run `run_id` (lineage tags, alias); None when registering is off."""
        from pipeline import tracking

        tr = self.cfg.tracking
        if not tr.register:
            return None
        name = tr.model_name or f"bert-finetune-{self.task}"
        own = {"pooling": self.cfg.embedding.pooling} if self.task == "embedding" else {}
        version = tracking.register_hf_model(
            str(out),
            name,
            tr.alias,
            {
                **self.source.tags,
                "task": self.task,
                "run_id": run_id,
                **own,
                tracking.metric_key(f"eval_{self.primary}"): f"{best[self.primary]:.6g}",
                **(tags or {}),
            },
            run_id,
        )
        logger.set_tags({"registered_model": f"models:/{name}/{version}"})
        return f"models:/{name}/{version}"
