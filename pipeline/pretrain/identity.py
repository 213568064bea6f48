"""A pretraining run's identity and where it resumes: the run name (`<preset>-<identity>`, the identity a hash of
everything the weights depend on), the notice for a run that differs from an earlier one only by its length, the
initial weights a run started from (`init.json`, so resuming from others is refused), the newest intact
checkpoint to resume from (damaged newer ones named and skipped), and the advisory lock one job holds on a run.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

from pipeline import cluster
from pipeline.config import Config, config_hash
from pipeline.console import say
from pipeline.core.checkpoint import CheckpointCorrupt, check_init, damage
from pipeline.data.dataset import PreparedDataset
from pipeline.pretrain.init import InitCheckpoint
from pipeline.storage.io import exists, filesystem, join, output_lock, read_json, read_text, write_bytes_atomic

# TrainConfig fields that do not change the weights a run produces (operational settings).
_NOT_IN_IDENTITY = (
    "storage_path",
    "run_name",
    "max_failures",
    "num_to_keep",
    "checkpoint_every_steps",
    "log_every_steps",
    "eval_every_steps",
    "eval_batches",
    "data_cpus",
    "placement_strategy",
    "materialize_data",
    "cpus_per_worker",
    "use_gpu",
    "compile",
    "unpad",
    "min_workers",
    "checkpoint_upload",
)

# ... and, since the data order and the global batch stopped depending on them (`pipeline.pretrain.loader`), the
# number of workers and the micro-batch cap (also a phase's). Runs named before that keep their names:
# `run_name_for` finds them under their `legacy` identity, which has them.
_SIZE = ("num_workers", "micro_batch_size")


# fields added after runs existed: left out of the identity at their default, so those runs keep their names
_NEWER_DEFAULTS = {"head_only_steps": 0, "decay_fraction": 0.1, "decay_shape": "linear"}
_NEWER_PHASE_DEFAULTS = {"source_weights": None, "mix_temperature": None, "mask_rate": None}  # a phase's, likewise


def run_identity(
    cfg: Config,
    datasets: list[PreparedDataset],
    init: InitCheckpoint | None = None,
    without: tuple[str, ...] = (),
    legacy: bool = False,
) -> str:
    """Hash of what the weights depend on: model, training settings, each phase's data config and vocabulary, and
    the initial weights' sha256 when the run continues a checkpoint (left out without one: identities of runs from
    random weights are what they were before `model.init` existed; the ModelConfig repr leaves `init` out).
    `without` leaves more TrainConfig fields out (`max_steps`: runs that differ only by their length). `legacy`:
    the identity as it was while the data order depended on the number of workers (with `_SIZE`)."""
    out = _NOT_IN_IDENTITY + without + (() if legacy else _SIZE)
    train = {
        k: v for k, v in dataclasses.asdict(cfg.train).items() if k not in out and _NEWER_DEFAULTS.get(k, ...) != v
    }
    # warmup_fraction is in the warmup_steps it sets (a preset that moved from 120 steps to 0.1 of 1,200 keeps its
    # runs' names); only runs compared without their length keep the fraction, which does not change with it
    fraction = train.pop("warmup_fraction", None)
    if fraction is not None and "max_steps" in without:
        del train["warmup_steps"]
        train["warmup_fraction"] = fraction
    size = () if legacy else _SIZE
    train["phases"] = [
        {k: v for k, v in ph.items() if k not in size and _NEWER_PHASE_DEFAULTS.get(k, ...) != v}
        for ph in train.get("phases", [])
    ]
    data = [{"config_hash": d.config_hash, "vocab_sha256": d.vocab_sha256} for d in datasets]
    ident: dict[str, Any] = {"model": cfg.model, "train": train, "data": data}
    if cfg.data.sources:  # the mixture's weights are not in the data's hash (the same shards serve any mixture)
        ident["mixture"] = {
            "sources": [(s.name, s.weight, s.epochs) for s in cfg.data.sources],
            "mix_temperature": cfg.data.mix_temperature,
        }
    if init is not None:
        ident["init_sha256"] = init.weights_sha256
    return config_hash(ident)


def run_name_for(cfg: Config, datasets: list[PreparedDataset], init: InitCheckpoint | None = None) -> str:
    """`train.run_name`, or `<preset>-<first 10 hex of the identity>` (`init-...` for a checkpoint's architecture
    without a preset): the same command and data resume, on any number of workers. A run named before the
    number of workers left the identity keeps its name (its `legacy` identity), when it has checkpoints in
    `train.storage_path` and the new name has none: it resumes at its own size (the same num_workers)."""
    from pipeline.tracking.runs import run_name

    if cfg.train.run_name:
        return cfg.train.run_name
    name = run_name(cfg.model.preset or "init", tag=run_identity(cfg, datasets, init)[:10])
    old = run_name(cfg.model.preset or "init", tag=run_identity(cfg, datasets, init, legacy=True)[:10])
    if not cluster.checkpoints(cfg.train.storage_path, name) and cluster.checkpoints(cfg.train.storage_path, old):
        return old
    return name


def legacy_run_notice(
    cfg: Config, datasets: list[PreparedDataset], name: str, init: InitCheckpoint | None = None
) -> str | None:
    """One console line when `name` is a run named before the number of workers left the identity (`run_name_for`
    found it under its legacy identity): it resumes, at its own size, and its data from then on follow the order
    that does not depend on the number of workers."""
    from pipeline.tracking.runs import run_name

    if cfg.train.run_name or name != run_name(
        cfg.model.preset or "init", tag=run_identity(cfg, datasets, init, legacy=True)[:10]
    ):
        return None
    return (
        f"[train] {name} was named before the data order stopped depending on the number of workers: it resumes "
        f"at its own size (train.num_workers {cfg.train.num_workers}); the steps it has left read the data in "
        "the order a new run reads it (for that step), not the one it started with"
    )


def longer_run_notice(cfg: Config, name: str, base: str, uri: str) -> str | None:
    """One console line when run `name` is new and an earlier run in the store differs from it only by
    `train.max_steps` (its `identity_without_max_steps` tag, `base` for this run): the LR schedule depends on
    max_steps, so this is a new run from scratch; the line says how to continue the earlier model instead
    (`--model.init models:/...`)."""
    from pipeline import tracking

    if cfg.train.run_name or tracking.find_run(cfg.tracking.experiment, name) is not None:
        return None  # a name the user chose, or this very run resumed
    other = tracking.newest_run_tagged(cfg.tracking.experiment, "identity_without_max_steps", base, uri)
    if other is None or other.info.run_name == name:
        return None
    was = other.data.params.get("train.max_steps", "?")
    model = other.data.tags.get("registered_model")
    how = (
        f"to continue its model instead, run with --model.init {model} (its weights, a new LR schedule over "
        f"--train.max_steps more steps)"
        if model
        else f"it has no registered version yet: re-run its command to finish it, then continue it with "
        f"--model.init models:/{cfg.tracking.model_name}/<version>"
    )
    return (
        f"[train] only train.max_steps differs from run {other.info.run_name} ({was} -> {cfg.train.max_steps} "
        f"steps; the LR schedule depends on it): {name} is a new run, trained from scratch; {how}"
    )


def check_run_init(storage_path: str, run_name: str, init: InitCheckpoint | None) -> None:
    """Refuse resuming `run_name` when it started from other initial weights (its `init.json`) than `init`."""
    path = join(storage_path, run_name, "init.json")
    check_init(
        read_json(path) if exists(path) else None, init.weights_sha256 if init else None, join(storage_path, run_name)
    )


def record_run_init(storage_path: str, run_name: str, init: InitCheckpoint | None) -> None:
    """Write the run's `init.json` (only for a run that starts from a checkpoint: others stay as they were)."""
    if init is not None:
        write_bytes_atomic(join(storage_path, run_name, "init.json"), json.dumps(init.tags).encode())


def newest_intact(storage_path: str, run_name: str) -> tuple[tuple[str, dict[str, Any]] | None, list[tuple[str, str]]]:
    """((path, train_state) of the run's newest checkpoint whose files match their recorded sha256s, or None),
    and (path, what is wrong) for each newer one that is damaged or unreadable."""
    bad = []
    for uri, state, why in cluster.checkpoints(storage_path, run_name):
        if state is not None and (why := damage(uri, state)) is None:
            return (uri, state), bad
        bad.append((uri, why))
    return None, bad


def remove_half_written(storage_path: str, run_name: str, bad: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Delete the damaged checkpoints (`bad`, (path, why)) that Ray Train's run snapshot does not list: a host that
    crashed while writing one left it behind, and nothing would ever read or rotate it out. Those the snapshot
    lists stay (Ray Train refuses to restore a snapshot whose checkpoints are gone, and rotates them out itself).
    Returns the ones removed; names them in one console line."""
    snapshot = join(storage_path, run_name, "checkpoint_manager_snapshot.json")
    listed = read_text(snapshot) if exists(snapshot) else ""
    gone = [(uri, why) for uri, why in bad if uri.rstrip("/").rsplit("/", 1)[-1] not in listed]
    for uri, _ in gone:
        fs, path = filesystem(uri)
        fs.rm(path, recursive=True)
    if gone:
        say(
            f"[train] removed {len(gone)} checkpoint{'s' if len(gone) > 1 else ''} a crashed run left half-written: "
            + "; ".join(f"{uri} ({why})" for uri, why in gone),
            sys.stdout,
        )
    return gone


def resume_point(storage_path: str, run_name: str) -> tuple[tuple[str, dict[str, Any]] | None, list[str]]:
    """(the checkpoint a run resumes from, None when it has none yet; the newer, damaged ones it skips). Half-written
    ones no run refers to are removed first (`remove_half_written`); the others are named in one console line; with
    checkpoints but none intact, CheckpointCorrupt says so in one line and how to start over."""
    good, bad = newest_intact(storage_path, run_name)
    gone = remove_half_written(storage_path, run_name, bad)
    bad = [b for b in bad if b not in gone]
    named = "; ".join(f"{uri} ({why})" for uri, why in bad)
    if bad and good is None:
        run_dir = join(storage_path, run_name)
        raise CheckpointCorrupt(
            f"run {run_dir} has no intact checkpoint: {named}; to start over, delete {run_dir} "
            "(or use another --train.run_name)"
        )
    if bad:
        say(
            f"[train] damaged checkpoint{'s' if len(bad) > 1 else ''} {named}: resuming from step "
            f"{good[1].get('step')} ({good[0]})",
            sys.stdout,
        )
    return good, [uri for uri, _ in bad]


def run_lock(storage_path: str, run_name: str):
    """The advisory lock on `<storage_path>/<run_name>` that one job holds while it trains, evaluates and registers
    the run (OutputLockedError, one line naming the holder, for a second one)."""
    return output_lock(
        join(storage_path, run_name),
        busy=f"run {join(storage_path, run_name)} is being trained by another job ({{holder}}); wait "
        "for it to finish (the same command then finds it done)",
    )
