"""The pretraining job as stages: data (per phase) -> train -> evaluate -> register, each skipped only when its
real output proves it done.

- data: `pipeline.data.stages.data_stages` (a validated manifest with the same config hash).
- train: a Ray Train run of this run name in `train.storage_path` whose newest intact checkpoint is at `max_steps`
  and whose MLflow run exists in the *current* tracking store. Otherwise Ray Train runs, resuming the run's newest
  intact checkpoint when there is one (its vocabulary sha256 must match the data's, or the job refuses in one line).
  Intact: its files match the sha256s its `train_state.json` recorded; a damaged newer one is named in one line and
  skipped, and a run with none intact is refused in one line that says how to start over. The driver holds an
  advisory lock on `<storage_path>/<run_name>` (`pipeline.storage.io.output_lock`) from before this check until the job
  ends, so a second identical command fails at once, naming the holder, instead of training into the same
  directory and MLflow run and registering a second version of it.
- evaluate: always (cheap); it reserves the CPUs (or GPU) it computes on.
- register: a version of `tracking.model_name` in the *current* store tagged with this training run id.

The run name is `<preset>-<identity>`, the identity a hash of everything the weights depend on: the model and
training config, each phase's data config hash and the vocabulary sha256 (`pipeline.pretrain.identity`), and with
`model.init` (continued pretraining, `pipeline.pretrain.init`) the sha256 of the initial weights, which the run also
records in `<storage_path>/<run_name>/init.json` so that resuming it from other weights is refused. The MLflow run is
created on the driver of the train stage and its id handed to rank 0.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

import torch

from model.family import ModelFamily
from pipeline import cluster
from pipeline.config import Config, DataConfig, config_hash, phase_data_configs
from pipeline.console import say
from pipeline.core.checkpoint import (
    CheckpointCorrupt,
    check_vocab,
    damage,
    read_train_state,
    trust,
    verified,
    written_by,
)
from pipeline.core.step import evaluate_sums
from pipeline.data.dataset import PreparedDataset
from pipeline.data.stages import data_stages
from pipeline.pretrain.feed import nothing_held_out
from pipeline.pretrain.identity import (
    check_run_init,
    legacy_run_notice,
    longer_run_notice,
    newest_intact,
    record_run_init,
    resume_point,
    run_identity,
    run_lock,
    run_name_for,
)
from pipeline.pretrain.init import InitCheckpoint
from pipeline.pretrain.loader import Batches, PhasePlan
from pipeline.pretrain.loop import train_loop_per_worker
from pipeline.pretrain.metrics import MlmSums
from pipeline.pretrain.mixture import phase_mixture
from pipeline.pretrain.worker import PretrainHandoff
from pipeline.runner.dag import Stage
from pipeline.storage.io import local_checkpoint_dir, read_bytes
from pipeline.tracking.outbox import read_pending
from pipeline.tracking.wait import server_needed


@dataclass(frozen=True)
class TrainResult:
    checkpoint: str
    """Path or URI of the final checkpoint."""
    run_id: str
    run_name: str
    step: int
    verified: tuple[tuple[str, str, str], ...] = ()
    """The checkpoint's files the driver checked against their sha256s (`pipeline.core.checkpoint.verified`):
    evaluate and register do not hash them again while they are unchanged."""


def worker_config(cfg: Config, init: InitCheckpoint | None) -> Config:
    """The config the workers get: `model.init` is the checkpoint's local directory (a `models:/` URI resolved)."""
    if init is None:
        return cfg
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, init=init.local_dir))


def copy_prepared(ds: PreparedDataset, names: tuple[str, ...], dst: str, optional: tuple[str, ...] = ()) -> None:
    """Copy the files `names` beside a prepared dataset's shards into the local directory `dst`; one of `optional`
    that the dataset lacks is left out (a missing other one raises FileNotFoundError)."""
    for name in names:
        try:
            data = read_bytes(ds.file(name))
        except FileNotFoundError:
            if name in optional:
                continue
            raise
        with open(os.path.join(dst, name), "wb") as f:
            f.write(data)


def phase_plans(cfg: Config, datasets: list[PreparedDataset]) -> list[PhasePlan]:
    """One `PhasePlan` per phase (a single phase when `train.phases` is empty), with its mixture (`data.sources`,
    or the phase's own) and its masking rate."""
    tc, plans = cfg.train, []
    for i, (ds, steps) in enumerate(zip(datasets, tc.phase_steps())):
        ph = tc.phases[i] if tc.phases else None
        mb = (ph.micro_batch_size if ph else None) or tc.micro_batch_size
        gb = (ph.global_batch_size if ph else None) or tc.global_batch_size
        plan = PhasePlan.build(
            ds,
            steps=steps,
            micro_batch_size=mb,
            global_batch_size=gb,
            num_eval_shards=tc.num_eval_shards,
            materialized=tc.materialize_data,
            field=f"train.phases[{i}].global_batch_size" if ph and ph.global_batch_size else "train.global_batch_size",
        )
        plans.append(
            dataclasses.replace(
                plan,
                mixture=phase_mixture(cfg, i, ds, plan.train_files, steps, gb),
                mask_rate=ph.mask_rate if ph else None,
            )
        )
    return plans


def mixture_lines(plans: list[PhasePlan]) -> list[str]:
    """The console's summary of each phase's mixture: every source's share of the tokens, its training tokens, and
    how many times the phase reads it (a small source repeats, a large one is read in part)."""
    out = []
    for i, p in enumerate(plans):
        if p.mixture is None:
            continue
        parts = [
            f"{d['name']} {d['token_share']:.1%} of the tokens ({d['epochs']:.2f} epochs of {d['tokens']:,})"
            for d in p.mixture.describe()
        ]
        out.append(f"[train] mixture{f' of phase {i}' if len(plans) > 1 else ''}: " + ", ".join(parts))
    return out


def mixture_manifest(plan: PhasePlan) -> dict[str, Any] | None:
    """What a run reads of each source in one phase (None without a mixture): the run's `mixture.json`, logged to
    its MLflow run beside the prepared data's manifest.json (which cannot say it: the same shards serve any
    weighting, steps and batch). Per source, in `data.sources` order: its name, weight as given, documents (in
    the prepared data, held-out shards included), training rows and tokens, rows a step, share of the tokens,
    `epochs` (the times the phase reads its training rows: 3.5 is three and a half passes, 0.5 half of it) and
    `tokens_seen` (those epochs' tokens)."""
    if plan.mixture is None:
        return None
    documents = {s["name"]: s.get("documents") for s in plan.dataset.manifest.get("sources", [])}
    return {
        "steps": plan.steps,
        "global_batch_size": plan.global_batch_size,
        "sources": [
            {**d, "documents": documents.get(d["name"]), "tokens_seen": round(d["epochs"] * d["tokens"])}
            for d in plan.mixture.describe()
        ],
    }


# Up to this many bytes of shards (`train.materialize_data`) are read by the driver itself and put in the object
# store as they are: Ray Data's read tasks took 5.8 s of a job for 70 rows on 2 quiet cores (4.4-5.8 s again on a
# warm cluster, the machine busy), against 0.5 s this way; the tiny config's shards (2.3M tokens of corpus) are far
# below it. More is read in parallel by Ray Data's tasks, on every node.
READ_HERE_BYTES = 256 << 20


def _materialized(files: list[str]):
    """Every row of `files`, in file order, as a Ray Dataset held in the object store."""
    import ray.data

    from pipeline.storage.io import filesystem, read_table

    size = 0
    for f in files:
        fs, path = filesystem(f)
        size += fs.size(path)
    if size > READ_HERE_BYTES:
        return cluster.read_parquet(files, shuffle=None).materialize()
    # from_blocks, not from_arrow: from_arrow sends a Ray task per table to read back its row count and schema,
    # which the driver has in hand; each task's worker process imports Ray Data first (1-3 CPU-s a process, two
    # processes a job), and a job's processes are its own, so every job paid them. A table is a block, one per file.
    return ray.data.from_blocks([read_table(f) for f in files])


def _ray_datasets(plans: list[PhasePlan], materialize: bool) -> dict[str, Any]:
    """Per phase one ordered Ray Dataset of the training rows that every rank reads (`p<i>_train`) and the held-out
    rows (`p<i>_eval`)."""
    out: dict[str, Any] = {}
    for i, p in enumerate(plans):
        if materialize:
            # One read of every shard into the object store, cut by row index into the training and held-out rows
            # (split_at_indices is exact and ordered on materialized data).
            every = _materialized(list(p.train_files + p.eval_files))
            out[f"p{i}_train"], held = every.split_at_indices([p.train_rows])
            if p.eval_files:
                out[f"p{i}_eval"] = held
        else:
            out[f"p{i}_train"] = cluster.read_parquet(list(p.train_files), shuffle=None)
            if p.eval_files:
                out[f"p{i}_eval"] = cluster.read_parquet(list(p.eval_files), shuffle=None)
    return out


def run_training(
    cfg: Config,
    datasets: list[PreparedDataset],
    run_id: str,
    run_name: str,
    tracking_uri: str,
    *,
    on_step: Callable[[int, int], None] | None = None,
    init: InitCheckpoint | None = None,
) -> TrainResult:
    """Fit with Ray Train, resuming `run_name` in `train.storage_path` if it exists, from `init`'s weights when it
    is given (`pipeline.pretrain.init.resolve_init`). `on_step(step, rank)` is a test hook called in every worker
    after each step (fault injection)."""
    import ray.data
    from ray.data import ExecutionOptions, ExecutionResources
    from ray.train import DataConfig as RayDataConfig

    tc = cfg.train
    vocab_sha = datasets[0].vocab_sha256
    latest, _ = resume_point(tc.storage_path, run_name)  # the damaged ones named there
    if latest is not None:
        check_vocab(latest[1], vocab_sha, latest[0])  # refuse before any worker starts
        check_run_init(tc.storage_path, run_name, init)
    record_run_init(tc.storage_path, run_name, init)
    plans = phase_plans(cfg, datasets)
    # preserve_order: every rank reads the rows in file order, which is what makes the order (and resumption) exact.
    limits = ExecutionResources(cpu=tc.data_cpus) if tc.data_cpus else ExecutionResources()
    exec_opts = ExecutionOptions(preserve_order=True, resource_limits=limits)
    cluster.quiet_ray_data()  # the datasets carry this context to the workers: no bars in the job log
    ray.data.DataContext.get_current().execution_options = exec_opts  # also for materialize() here
    # Ray Train hands the workers the checkpoint its run snapshot names last: the workers take the driver's newest
    # intact one instead unless this job reported Ray's (cluster.resume_checkpoint)
    at_start = tuple(uri.rstrip("/").rsplit("/", 1)[-1] for uri, _, _ in cluster.checkpoints(tc.storage_path, run_name))
    handoff = PretrainHandoff(
        worker_config(cfg, init),
        plans,
        run_id,
        tracking_uri,
        vocab_sha,
        at_start=at_start,
        resume_from=latest[0] if latest else None,
        verified=tuple(verified(latest[0])) if latest else (),  # the workers need not hash it again
        on_step=on_step,
    )
    scale = cluster.Scale(
        tc.num_workers,
        tc.use_gpu,
        tc.cpus_per_worker,
        tc.placement_strategy,
        tc.max_failures,
        tc.num_to_keep,
        min_workers=tc.min_workers,
    )
    result = cluster.fit(
        train_loop_per_worker,
        handoff,
        name=run_name,
        storage_path=tc.storage_path,
        scale=scale,
        datasets=_ray_datasets(plans, tc.materialize_data),
        dataset_config=RayDataConfig(datasets_to_split=[], execution_options=exec_opts),
    )
    return TrainResult(cluster.checkpoint_uri(result, tc.storage_path), run_id, run_name, tc.max_steps)


def load_trained(
    cfg: Config, checkpoint: str, vocab_size: int, checked: tuple = (), pad_token_id: int = 0
) -> torch.nn.Module:
    """The final weights from a checkpoint (path or URI), as a plain pretraining model in eval mode (its vocabulary
    and pad id the prepared data's, `PreparedDataset.pad_id`); their sha256 is checked unless the driver did
    (`checked`, `TrainResult.verified`) and they are unchanged since."""
    from safetensors.torch import load_file

    from model.build import build_model

    trust(checked)
    local = local_checkpoint_dir(checkpoint)  # (a copy of a URI checkpoint is checked: it is what is read)
    try:
        if (why := damage(local, read_train_state(local), ("model.safetensors",))) is not None:
            raise CheckpointCorrupt(
                f"checkpoint {checkpoint} is damaged: {why}; re-run the command: it resumes from "
                "the newest intact checkpoint"
            )
        arch = cfg.model.encoder_config(vocab_size=vocab_size, pad_token_id=pad_token_id)
        model = build_model(arch)  # the architecture; weights below
        model.load_state_dict(load_file(os.path.join(local, "model.safetensors")))
    finally:
        if local != checkpoint:
            shutil.rmtree(local, ignore_errors=True)
    return model.eval()


# ------------------------------------------------------------------------------------------------- stage bodies


def trained_to_the_end(
    cfg: Config, datasets: list[PreparedDataset], name: str, init: InitCheckpoint | None = None
) -> tuple[str, dict[str, Any]] | None:
    """(path, train_state) of run `name`'s newest intact checkpoint in storage if it is at max_steps (its
    vocabulary and initial weights checked against these), else None."""
    latest, _ = newest_intact(cfg.train.storage_path, name)
    if latest is None or int(latest[1].get("step", -1)) != cfg.train.max_steps:
        return None
    check_vocab(latest[1], datasets[0].vocab_sha256, latest[0])
    check_run_init(cfg.train.storage_path, name, init)
    return latest


def train_done(
    cfg: Config, datasets: list[PreparedDataset], uri: str, init: InitCheckpoint | None = None
) -> TrainResult | None:
    """The finished run in storage, if its newest checkpoint is at max_steps and its MLflow run is in this store."""
    from pipeline import tracking

    name = run_name_for(cfg, datasets, init)
    latest = trained_to_the_end(cfg, datasets, name, init)
    if latest is None:
        return None
    run_id = latest[1].get("run_id")
    if not run_id or not tracking.run_exists(run_id, uri):
        return None
    return TrainResult(latest[0], run_id, name, cfg.train.max_steps, tuple(verified(latest[0])))


def log_prepared_data(
    client, run_id: str, datasets: list[PreparedDataset], num_eval_shards: int, plans: list[PhasePlan] | None = None
) -> None:
    """The run's Datasets panel: each phase's prepared data (context `training`) and held-out shards (`eval`), and
    in a mixture each source of each phase with its weight and the epochs the phase reads (`plans`' mixtures)."""
    from pipeline.data.dataset import shard_schema
    from pipeline.tracking.lineage import log_datasets, prepared_datasets, source_datasets

    def schema(ds: PreparedDataset):  # packed by document: the doc_lengths column too; a mixture's: source
        return shard_schema(bool(ds.manifest["config"].get("pack_documents")), bool(ds.sources))

    entries = [
        entry
        for i, ds in enumerate(datasets)
        for entry in prepared_datasets(ds, phase=i, num_eval_shards=num_eval_shards, arrow_schema=schema(ds))
    ]
    for i, (ds, plan) in enumerate(zip(datasets, plans or [])):
        if plan.mixture is not None:
            entries += source_datasets(ds, plan.mixture.describe(), phase=i, arrow_schema=schema(ds))
    log_datasets(client, run_id, entries)


def train_stage(
    cfg: Config,
    datasets: list[PreparedDataset],
    git_sha: str,
    uri: str,
    attempt: str,
    init: InitCheckpoint | None = None,
) -> TrainResult:
    """Create (or reopen) the MLflow run on this driver, log params and artifacts, then fit on the workers."""
    import yaml

    from pipeline import tracking
    from pipeline.tracking import server as tracking_server

    os.environ["MLFLOW_TRACKING_URI"] = uri
    run_name = run_name_for(cfg, datasets, init)
    first = datasets[0]
    plans = phase_plans(cfg, datasets)  # a mixture the data cannot give is one line here, before any run starts
    for line in mixture_lines(plans):
        say(line, sys.stdout)
    base = run_identity(cfg, datasets, init, without=("max_steps",))  # runs that differ only by their length share it
    for notice in (longer_run_notice(cfg, run_name, base, uri), legacy_run_notice(cfg, datasets, run_name, init)):
        if notice is not None:
            say(notice, sys.stdout)
    run_id = tracking.start_run(
        cfg.tracking.experiment,
        run_name,
        {
            "identity_without_max_steps": base,
            "git_sha": git_sha,
            "config_hash": config_hash(cfg.to_dict()),
            "data_manifest_sha256": first.manifest_sha256,
            "vocab_sha256": first.vocab_sha256,
            "model_preset": cfg.model.preset,
            "attempt": attempt,
            **(init.tags if init else {}),
        },
    )
    if init is not None:
        say(init.describe(), sys.stdout)
    log = tracking.RunLogger(run_id, uri)
    log.log_params(cfg.flat())
    if report := (first.manifest.get("tokenizer") or {}).get("report"):  # issue 57: the vocab stage's figures
        log.log_metrics(
            {
                f"tokenizer/{k}": float(report[k])
                for k in ("fertility", "bytes_per_token", "unknown_rate", "vocab_used")
                if report.get(k) is not None
            },
            step=0,
        )
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.yaml"), "w") as f:
            yaml.safe_dump(cfg.to_dict(), f, sort_keys=False)
        log.log_artifact(os.path.join(d, "config.yaml"))
        for i, ds in enumerate(datasets):
            sub = os.path.join(d, "data" if i == 0 else f"data_phase{i}")
            os.makedirs(sub)
            # a BPE or Unigram is its tokenizer.json (data prepared before it was written has none)
            copy_prepared(ds, ("manifest.json", "vocab.txt", "tokenizer.json"), sub, optional=("tokenizer.json",))
            if (mixed := mixture_manifest(plans[i])) is not None:  # what this run reads of each source
                with open(os.path.join(sub, "mixture.json"), "w") as f:
                    json.dump(mixed, f, indent=2)
            log.log_artifacts(sub, os.path.basename(sub))
    log_prepared_data(log.client, run_id, datasets, cfg.train.num_eval_shards, plans)
    say(f"[train] MLflow run {run_id} ({run_name}) at {tracking_server.redact(uri)}", sys.stdout)
    try:
        # Trained to the end already, under another store's MLflow run (train_done looks in this one): its final
        # checkpoint is this run's result, and no Ray Train run starts only to find nothing to train.
        if (final := trained_to_the_end(cfg, datasets, run_name, init)) is not None:
            log.set_tags({"world_size": written_by(final[0], final[1])})
            say(
                f"[train] {run_name} was trained to step {cfg.train.max_steps} already ({final[0]}): nothing to train",
                sys.stdout,
            )
            return TrainResult(final[0], run_id, run_name, cfg.train.max_steps, tuple(verified(final[0])))
        return run_training(cfg, datasets, run_id, run_name, uri, init=init)
    except BaseException:
        try:
            log.finish("FAILED")
        except Exception:  # noqa: BLE001 - the server may be away; the training error matters more
            pass
        raise


def _eval_batches(ds: PreparedDataset, plan: PhasePlan, seed: int, family: ModelFamily):
    """The held-out rows' micro-batches (fixed masks: epoch 0); none when nothing is held out, never training rows."""
    from pipeline.storage.io import read_table

    to_batch = Batches(plan, seed, family=family)
    for path in plan.eval_files:
        table = read_table(path)
        for i in range(0, table.num_rows, plan.micro_batch_size):
            yield to_batch(table.slice(i, plan.micro_batch_size), 0)


def send_pending(trained: TrainResult, uri: str, wait_s: float) -> None:
    """Send the metrics that rank 0 could not (the tracking server was away), kept in the final checkpoint; those
    the server already has are dropped. A `TrackingError` when they cannot all be sent in a bounded time."""
    from pipeline import tracking

    pending = read_pending(trained.checkpoint, trained.run_id)
    if pending is None:
        return
    log = tracking.RunLogger(trained.run_id, uri, background=True, pending=pending)
    send_s = wait_s + 60 + len(pending["metrics"]) / 1000  # the server answers (server_needed): time to send them
    if not log.close(send_s):
        raise tracking.TrackingError(
            f"could not send the {len(pending['metrics']):,} kept metric values to {uri} in "
            f"{send_s:.0f}s; re-run the same command to send them"
        )
    # (the checkpoint holds what was not yet known sent when it was written, outage or not; sending drops what the
    # server already has)
    say(
        f"[evaluate] {len(pending['metrics']):,} metric value(s) the final checkpoint held as unsent are on the "
        "tracking server",
        sys.stdout,
    )


def evaluate_stage(cfg: Config, trained: TrainResult, ds: PreparedDataset, uri: str) -> dict[str, float]:
    """Evaluate the final weights on the whole held-out set of the last phase; log `eval/final/*` into the run.

    Their own section on the run page (the UI makes one of each prefix, `eval` < `eval/final` < `train`, and sorts
    charts by name), so the run page opens on the `eval/loss` curve, not on these one-point charts. With nothing
    held out (`pipeline.pretrain.feed.nothing_held_out`) the evaluation is skipped, said in one line, and returns
    {}: it never scores training rows as `eval/final/*`."""
    from pipeline import tracking

    os.environ["MLFLOW_TRACKING_URI"] = uri
    tc = cfg.train
    mb = (tc.phases[-1].micro_batch_size if tc.phases else None) or tc.micro_batch_size
    plan = PhasePlan.build(
        ds, steps=1, micro_batch_size=mb, global_batch_size=mb, num_eval_shards=tc.num_eval_shards, materialized=False
    )
    final: dict[str, float] = {}
    if (why := nothing_held_out(plan, tc.num_eval_shards)) is None:
        device = torch.device("cuda" if tc.use_gpu and torch.cuda.is_available() else "cpu")
        model = load_trained(cfg, trained.checkpoint, ds.vocab_size, trained.verified, ds.pad_id).to(device)
        torch.manual_seed(tc.seed)
        batches = _eval_batches(ds, plan, tc.seed, cfg.model.family)
        sums = evaluate_sums(
            model,
            batches,
            sums=MlmSums,
            device=device,
            precision=tc.precision if device.type == "cuda" else "fp32",
        )
        final = {k.replace("eval/", "eval/final/"): v for k, v in sums.eval_metrics().items()}
    with server_needed(uri, cfg.tracking.server_wait_s, "log the final evaluation"):
        send_pending(trained, uri, cfg.tracking.server_wait_s)
        if final:
            tracking.RunLogger(trained.run_id, uri).log_metrics(final, step=tc.max_steps)
    if why is not None:
        say(
            f"[evaluate] skipped: nothing is held out ({why}); the final evaluation never scores training data, so "
            "no eval/final/* is logged"
        )
    else:
        say(f"[evaluate] {json.dumps({k: round(v, 4) for k, v in final.items()})}")
    return final


def register_stage(
    cfg: Config,
    trained: TrainResult,
    ds: PreparedDataset,
    git_sha: str,
    uri: str,
    final_eval: dict[str, float],
    command: str,
    init: InitCheckpoint | None = None,
) -> dict[str, str]:
    """Export the final weights in transformers format, register them with lineage tags, move the alias."""
    from model.hf import save_hf
    from pipeline import tracking
    from pipeline.tracking.lineage import dataset_name

    os.environ["MLFLOW_TRACKING_URI"] = uri
    model = load_trained(cfg, trained.checkpoint, ds.vocab_size, trained.verified, ds.pad_id)
    with tempfile.TemporaryDirectory() as d, server_needed(uri, cfg.tracking.server_wait_s, "register the model"):
        tok = os.path.join(d, "tokenizer")
        os.makedirs(tok)
        copy_prepared(ds, ("vocab.txt", "tokenizer.json"), tok, optional=("vocab.txt", "tokenizer.json"))
        export = save_hf(model, os.path.join(d, "export"), tokenizer=tok)
        tracking.write_tokenizer_config(
            str(export),
            model_max_length=model.config.max_position_embeddings,
            lowercase=bool(ds.manifest["config"].get("lowercase", True)),
            special_tokens=ds.specials.tokens,  # the tokenizer's own
        )
        tags = {
            "data_manifest_sha256": ds.manifest_sha256,
            "vocab_sha256": ds.vocab_sha256,
            "config_hash": config_hash(cfg.to_dict()),
            "git_sha": git_sha,
            "run_id": trained.run_id,
            **(init.tags if init else {}),
        }
        description = tracking.version_description(
            cfg.tracking.model_name,
            data={
                "manifest_sha256": ds.manifest_sha256,
                "documents": ds.manifest["documents_written"],
                "tokens": ds.tokens,
                "examples": ds.examples,
                "dataset": dataset_name(ds.output),
            },
            steps=trained.step,
            final_eval=final_eval,
            command=command,
            init=f"{init.spec} (weights sha256 `{init.weights_sha256[:16]}`)" if init else None,
            architecture=cfg.model.family.architecture,
        )
        version = tracking.register_hf_model(
            str(export), cfg.tracking.model_name, cfg.tracking.alias, tags, trained.run_id, description=description
        )
        logger = tracking.RunLogger(trained.run_id, uri)
        logger.set_tags({"registered_model": f"models:/{cfg.tracking.model_name}/{version}"})
        logger.finish("FINISHED")
    return {"name": cfg.tracking.model_name, "version": version, "uri": f"models:/{cfg.tracking.model_name}/{version}"}


def register_done(cfg: Config, trained: TrainResult, uri: str) -> dict[str, str] | None:
    """The version of `tracking.model_name` in the current store that this training run registered, if any."""
    from pipeline import tracking

    version = tracking.find_version(cfg.tracking.model_name, trained.run_id, uri)
    if version is None:
        return None
    c = tracking.client(uri)
    if c.get_run(trained.run_id).info.status != "FINISHED":  # its training re-done (a damaged final checkpoint)
        c.set_terminated(trained.run_id, status="FINISHED")
    if cfg.tracking.alias:  # the alias follows the newest run's version, as a fresh registration would move it
        c.set_registered_model_alias(cfg.tracking.model_name, cfg.tracking.alias, version)
    return {"name": cfg.tracking.model_name, "version": version, "uri": f"models:/{cfg.tracking.model_name}/{version}"}


# ------------------------------------------------------------------------------------------------- the graph


def _later_phase_stage(name: str, dcfg: DataConfig, deps: tuple[str, ...]) -> Stage:
    """A later phase's data stages, planned when they run (their vocabulary is the first phase's output)."""
    from pipeline.runner.dag import run_graph

    return Stage(name, lambda _deps: run_graph(data_stages(dcfg), remote=False)["validate"].result, deps=deps)


def pretrain_stages(
    cfg: Config, *, git_sha: str, tracking_uri: str, attempt: str, command: str, init: InitCheckpoint | None = None
) -> list[Stage]:
    """data (per phase) -> train -> evaluate -> register, for a config whose paths are absolute (and, with
    `model.init`, resolved by `pipeline.pretrain.init.resolve_init`, which gives `init`)."""
    uri = tracking_uri
    dcfgs = phase_data_configs(cfg)
    stages = data_stages(dcfgs[0])
    data = ["validate"] + [f"data_phase{i}" for i in range(1, len(dcfgs))]
    stages += [_later_phase_stage(f"data_phase{i}", d, ("validate",)) for i, d in enumerate(dcfgs[1:], start=1)]
    eval_cpus = max(1.0, cfg.train.cpus_per_worker) if not cfg.train.use_gpu else 0.0
    return [
        *stages,
        Stage(
            "train",
            lambda deps: train_stage(cfg, [deps[d] for d in data], git_sha, uri, attempt, init),
            deps=tuple(data),
            done=lambda deps: train_done(cfg, [deps[d] for d in data], uri, init),
            hold=lambda deps: run_lock(cfg.train.storage_path, run_name_for(cfg, [deps[d] for d in data], init)),
            describe=lambda r: f"{r.run_name} at step {r.step}, MLflow run {r.run_id}",
        ),
        Stage(
            "evaluate",
            lambda deps: evaluate_stage(cfg, deps["train"], deps[data[-1]], uri),
            deps=("train", data[-1]),
            num_cpus=eval_cpus,
            num_gpus=1 if cfg.train.use_gpu else 0,
            describe=lambda r: ", ".join(
                f"{k.rsplit('/', 1)[-1]} {r[k]:.4f}"
                for k in ("eval/final/loss", "eval/final/mlm_accuracy", "eval/final/nsp_accuracy")
                if k in r
            ),
        ),
        Stage(
            "register",
            lambda deps: register_stage(
                cfg, deps["train"], deps["validate"], git_sha, uri, deps["evaluate"], command, init
            ),
            deps=("train", "evaluate", "validate"),
            done=lambda deps: register_done(cfg, deps["train"], uri),
            describe=lambda r: r["uri"],
        ),
    ]
