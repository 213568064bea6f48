"""Checkpoints: weights (safetensors), optimizer/scheduler/scaler, the train state, and per-rank RNG states and
data positions — everything a restarted worker needs to continue bit-identically.

Layout of one checkpoint directory:

    model.safetensors    weights of the unwrapped model (rank 0)
    optimizer.pt         optimizer, scheduler and scaler state dicts (rank 0; tensors only, weights_only load)
    train_state.json     {"step", "position", "world_size", "vocab_sha256", "run_id", ..., "files"}: the driver
                         reads it without torch (rank 0, written last)
    rank_<r>.pt          this rank's RNG states (and the position, as checkpoints before `world_size` kept it)

A checkpoint resumes at any number of workers: its position is global (pretraining's follows from the step), and
a rank that finds no RNG file of its own, or one written at another world size, draws its streams afresh
(`resume`). Checkpoints written before `world_size` existed (their position in the rank files only) are read too.

`train_state.json` carries the vocabulary's sha256 so that weights are never resumed, exported or registered
with a vocabulary they were not trained on (`check_vocab`), and `files`, the sha256 of every other file
({name: sha256}, every rank's), so that a damaged checkpoint (a truncated copy, a bad disk) is found before it is
used (`damage`): the driver resumes from the newest intact one, and workers and the export check what they load.
Checkpoints written before `files` existed carry no hashes and are used unchecked. A file is hashed once per
process while it stays as it was (its fsspec `ukey`: size, mtime, inode; an S3 ETag), and the driver hands what it
verified to the workers, evaluate and register (`verified`, `trust`): a base-size checkpoint takes seconds to hash.

A checkpoint uploaded in the background (`save_checkpoint(background=True)`, object storage) has the same files;
rank 0's weights, optimizer state and `train_state.json` are written from a snapshot in memory by Ray Train's
upload thread (`DeferredFiles`), the rank files and the gathering of their hashes stay in the loop.
"""

from __future__ import annotations

import copy
import json
import os
import random
import threading
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from pipeline.console import say
from pipeline.core.step import Trainable
from pipeline.errors import PipelineError
from pipeline.storage.io import StorageError, filesystem, join, sha256_file
from pipeline.tracking.outbox import read_pending


class CheckpointMismatch(PipelineError, ValueError):
    """A checkpoint that belongs to other data than the run about to use it; the message says what differs."""


class CheckpointCorrupt(StorageError):
    """A checkpoint whose files are not the ones it recorded; the message names the checkpoint and the file."""


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DDP (or the module itself)."""
    return getattr(model, "module", model)


def rng_state() -> dict[str, Any]:
    st = {
        "torch": torch.get_rng_state(),
        "numpy": json.dumps(np.random.get_state(legacy=False), default=lambda a: a.tolist()),
        "python": json.dumps(random.getstate()),
    }
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(json.loads(st["numpy"]))
    py = json.loads(st["python"])
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def _gather(files: dict[str, str]) -> dict[str, str]:
    """Every rank's {name: sha256} merged (a collective when there are several ranks: all call it together)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return files
    every: list[dict[str, str]] = [{}] * dist.get_world_size()
    dist.all_gather_object(every, files)
    return {k: v for d in every for k, v in d.items()}


def save_checkpoint(
    path: str, rank: int, t: Trainable, state: dict[str, Any], *, background: bool = False
) -> DeferredFiles | None:
    """Rank 0 writes the shared state; every rank writes its own RNG states and `state["position"]`. Every rank
    calls it at the same step (it gathers the ranks' file hashes); `train_state.json`, with them, comes last.

    With `background` (a checkpoint that Ray Train uploads in its own thread: `cluster.report`), rank 0 writes
    only its rank file here and returns the rest as `DeferredFiles`: a snapshot in host memory (every tensor
    copied: the next step changes the weights and Adam's moments in place), written, hashed and completed with
    `train_state.json` in the upload thread, so that the loop pays for a copy in memory (~1.3 GB at BERT-base)
    instead of the write and the sha256s. The collective stays here, in the training thread. One snapshot is held
    at a time: a checkpoint that comes while the previous one still waits for its write (Ray Train's one upload
    thread is busy with the one before) waits for it, so host memory holds one snapshot at most (and the local
    disk one written checkpoint: the thread writes the next after it has uploaded and deleted this one). None on
    other ranks and in the foreground."""
    os.makedirs(path, exist_ok=True)
    mine = f"rank_{rank}.pt"
    torch.save({"rng": rng_state(), "position": state.get("position")}, os.path.join(path, mine))
    files = _gather({mine: sha256_file(os.path.join(path, mine))})
    if rank != 0:
        return None
    global _held
    if background and _held is not None:
        _held.done.wait()
    deferred = DeferredFiles(path, *_snapshot(t, held=background), files, state)
    if not background:
        deferred.write()
        return None
    _held = deferred
    return deferred


def _snapshot(t: Trainable, held: bool) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(weights, {"optimizer", "scheduler", "scaler"} state dicts) of `t` as the checkpoint holds them, the weights
    copied to CPU memory; `held` (written later) copies the state dicts too, every tensor in them and every
    container (Adam's `exp_avg`, `exp_avg_sq` and `step` change in place at every step)."""
    weights = {k: v.detach().cpu().contiguous().clone() for k, v in unwrap(t.model).state_dict().items()}
    opt = {
        "optimizer": t.optimizer.state_dict(),
        "scheduler": t.scheduler.state_dict(),
        "scaler": t.scaler.state_dict() if t.scaler is not None else None,
    }
    return weights, (_host_copy(opt) if held else opt)


def _host_copy(x: Any) -> Any:
    """`x` (dicts, lists and tuples of tensors and plain values) copied deep, its tensors to CPU memory. It is
    `copy.deepcopy` with each tensor's copy given: what is shared in `x` stays shared in the copy (AdamW's param
    groups share one `betas` tuple), so that `torch.save` writes the bytes it writes for `x`.

    >>> a = {"state": {0: {"exp_avg": torch.zeros(2)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    >>> b = _host_copy(a)
    >>> a["state"][0]["exp_avg"] += 1; a["param_groups"][0]["lr"] = 0.2  # what the next step does
    >>> b
    {'state': {0: {'exp_avg': tensor([0., 0.])}}, 'param_groups': [{'lr': 0.1, 'params': [0]}]}
    """
    copies: dict[int, Any] = {}  # deepcopy's memo: {id(original): its copy}

    def find(y: Any) -> None:
        if isinstance(y, torch.Tensor):
            copies.setdefault(id(y), y.detach().to("cpu", copy=True))
        elif isinstance(y, (list, tuple, dict)):
            for v in y.values() if isinstance(y, dict) else y:
                find(v)

    find(x)
    return copy.deepcopy(x, copies)


class DeferredFiles:
    """Rank 0's part of one checkpoint, `model.safetensors`, `optimizer.pt` and then `train_state.json` with every
    file's sha256, held as a snapshot until `write` puts it into the checkpoint's directory. `write` writes once
    (Ray Train retries a failed upload whole: the second call finds the files there, or raises again when the
    first write failed); `drop` lets an unwritten snapshot go (its upload will never run). Either ends it:
    `done`, which the next background `save_checkpoint` waits for."""

    def __init__(
        self,
        path: str,
        weights: dict[str, torch.Tensor],
        opt: dict[str, Any],
        files: dict[str, str],
        state: dict[str, Any],
    ):
        self.path, self.files, self.state = path, files, state
        self._snapshot: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = (weights, opt)
        self._written = False
        self.done = threading.Event()

    def write(self) -> None:
        from safetensors.torch import save_file

        if self.done.is_set():
            if not self._written:
                raise RuntimeError(f"checkpoint {self.path} was not written: its first write failed or was dropped")
            return
        try:
            weights, opt = self._snapshot
            save_file(weights, os.path.join(self.path, "model.safetensors"), metadata={"format": "pt"})
            torch.save(opt, os.path.join(self.path, "optimizer.pt"))
            files = {
                **self.files,
                **{n: sha256_file(os.path.join(self.path, n)) for n in ("model.safetensors", "optimizer.pt")},
            }
            with open(os.path.join(self.path, "train_state.json"), "w") as f:
                json.dump({**self.state, "files": dict(sorted(files.items()))}, f)
            self._written = True
        finally:
            self.drop()

    def drop(self) -> None:
        self._snapshot = None
        self.done.set()


_held: DeferredFiles | None = None  # this process's newest background snapshot (`save_checkpoint`)


# {(file path or URI, the sha256 its checkpoint recorded): the file's ukey when its bytes matched it}, in this process
_verified: dict[tuple[str, str], str] = {}


def _ukey(path: str) -> str:
    """fsspec's "hash of file properties, to tell if it has changed" (stat for local files), asked afresh."""
    fs, p = filesystem(path)
    fs.invalidate_cache(p)  # s3fs answers from its listing cache otherwise
    return fs.ukey(p)


def verified(path: str) -> list[tuple[str, str, str]]:
    """The files of the checkpoint at `path` whose sha256 this process checked (`damage`), to hand to another
    process (`trust`): (file, recorded sha256, its ukey then)."""
    under = join(path, "")
    return [(f, want, key) for (f, want), key in _verified.items() if f.startswith(under)]


def trust(entries: list[tuple[str, str, str]] | tuple = ()) -> None:
    """Take the files another process verified (`verified`) as checked here too, while they stay as they were."""
    _verified.update({(f, want): key for f, want, key in entries})


def damage(path: str, state: dict[str, Any], names: tuple[str, ...] | None = None) -> str | None:
    """What is wrong with the files of the checkpoint at `path` (local path or URI) against the sha256s its
    `train_state.json` (`state`) recorded, or None when they match (all of them, or `names`). A checkpoint
    written before hashes were recorded has nothing to check against: None. A file that matched before, in this
    process or in the one it `trust`s, and has not changed since (its ukey) is not read again.

    >>> import tempfile; d = tempfile.mkdtemp(); open(f"{d}/model.safetensors", "wb").write(b"ab")
    2
    >>> damage(d, {"files": {"model.safetensors": "fb8e20fc2e4c3f248c60c39bd652f3c1347298bb977b8b4d5903b85055620603"}})
    >>> damage(d, {"files": {"model.safetensors": "00" * 32}})
    'model.safetensors has sha256 fb8e20fc2e4c, not the 000000000000 recorded when it was written'
    >>> damage(d, {"files": {"optimizer.pt": "00" * 32}})
    'optimizer.pt is missing'
    >>> import shutil; shutil.rmtree(d)
    """
    for name, want in state.get("files", {}).items():
        if names is not None and name not in names:
            continue
        file = join(path, name)
        try:
            key = _ukey(file)  # before reading: a change while it is read shows next time
            if _verified.get((file, want)) == key:
                continue
            got = sha256_file(file)
        except FileNotFoundError:
            return f"{name} is missing"
        if got != want:
            return f"{name} has sha256 {got[:12]}, not the {want[:12]} recorded when it was written"
        _verified[(file, want)] = key
    return None


def check_intact(path: str, state: dict[str, Any], names: tuple[str, ...] | None = None) -> None:
    """Raise CheckpointCorrupt (one line naming the checkpoint and the file) when `damage` finds something."""
    if (why := damage(path, state, names)) is not None:
        raise CheckpointCorrupt(f"checkpoint {path} is damaged: {why}")


def written_by(path: str, state: dict[str, Any]) -> int:
    """How many workers wrote the checkpoint at `path`: its `world_size`, else (written before that key) its rank
    files, as recorded in `files` or found in the directory."""
    if "world_size" in state:
        return int(state["world_size"])
    names = state.get("files") or os.listdir(path)
    return sum(1 for n in names if n.startswith("rank_") and n.endswith(".pt"))


def load_checkpoint(path: str, rank: int, t: Trainable, world: int | None = None) -> dict[str, Any]:
    """Restore everything `save_checkpoint` wrote (its files checked against their recorded sha256s first);
    returns the train state with its data position. This rank's RNG states are restored when the checkpoint was
    written by `world` workers (any number when None); otherwise the state says `"rng": False`."""
    from safetensors.torch import load_file

    state = read_train_state(path)
    state["world_size"] = written_by(path, state)
    same = world is None or state["world_size"] == world
    check_intact(path, state, ("model.safetensors", "optimizer.pt", *([f"rank_{rank}.pt"] if same else [])))
    unwrap(t.model).load_state_dict(load_file(os.path.join(path, "model.safetensors")))
    opt = torch.load(os.path.join(path, "optimizer.pt"), map_location="cpu", weights_only=True)
    t.optimizer.load_state_dict(opt["optimizer"])
    t.scheduler.load_state_dict(opt["scheduler"])
    if t.scaler is not None and opt["scaler"]:
        t.scaler.load_state_dict(opt["scaler"])
    state.pop("files", None)
    if not same:
        return {**state, "rng": False}
    mine = torch.load(os.path.join(path, f"rank_{rank}.pt"), map_location="cpu", weights_only=True)
    set_rng_state(mine["rng"])
    state.setdefault("position", mine["position"])  # before `world_size`, the position was the rank file's
    return state


def read_train_state(path: str) -> dict[str, Any]:
    """The `train_state.json` of a checkpoint directory (local path or URI)."""
    from pipeline.storage.io import read_json

    return read_json(join(path, "train_state.json"))


def check_vocab(state: dict[str, Any], vocab_sha256: str, where: str) -> None:
    """Refuse (one line) a checkpoint trained with another vocabulary than the data about to be used."""
    had = state.get("vocab_sha256")
    if had and had != vocab_sha256:
        raise CheckpointMismatch(
            f"checkpoint {where} was trained with vocabulary sha256 {had[:12]}, but the prepared data's vocab.txt "
            f"is {vocab_sha256[:12]}; its ids would mean other words. Use a new --train.run_name (or storage_path), "
            f"or prepare the data with the vocabulary it was trained on (--data.vocab)"
        )


def check_init(recorded: dict[str, Any] | None, init_sha256: str | None, run_dir: str) -> None:
    """Refuse (one line) resuming a run that started from other weights than `model.init` now names.

    `recorded` is the run's `init.json` ({"init_model", "init_model_sha256"}; None for a run that predates it or
    started from random weights, recorded as {"init_model": null}).

    >>> check_init({"init_model": "/m", "init_model_sha256": "ab" * 32}, "cd" * 32, "runs/x")
    Traceback (most recent call last):
    ...
    pipeline.core.checkpoint.CheckpointMismatch: run runs/x started from /m (weights sha256 abababababab), but model.init is now weights sha256 cdcdcdcdcdcd; use a new --train.run_name (or storage_path), or the model.init it started from
    """  # noqa: E501
    if recorded is None:
        if init_sha256 is None:
            return
        recorded = {"init_model": None}
    had = recorded.get("init_model_sha256")
    if had == init_sha256:
        return
    was = f"{recorded['init_model']} (weights sha256 {had[:12]})" if had else "random weights"
    now = f"weights sha256 {init_sha256[:12]}" if init_sha256 else "unset (random weights)"
    raise CheckpointMismatch(
        f"run {run_dir} started from {was}, but model.init is now {now}; use a new "
        f"--train.run_name (or storage_path), or the model.init it started from"
    )


def resume(
    ckpt: Any,
    rank: int,
    t: Trainable,
    fresh: dict[str, Any],
    *,
    seed: int,
    run_id: str | None,
    world: int | None = None,
    on_rank0: Callable[[str], None] | None = None,
    check: Callable[[dict[str, Any], str], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Where a worker starts, the one resume of pretraining and fine-tuning: (`fresh`, None) with this rank's own
    dropout stream when `ckpt` (a Ray Train checkpoint) is None; else its state restored exactly (weights,
    optimizer, scheduler, scaler, RNGs, data position: `load_checkpoint`) and, on rank 0, the metric values it had
    not sent to the tracking server (`pending`). A checkpoint written by another number of workers than `world`
    leaves the RNGs of the ranks drawn afresh from (seed, step, rank): the same resize resumes the same way.
    `on_rank0(dir)` runs on rank 0 before the restore (a reader that draws from the RNGs the restore then sets);
    `check(state, path)` may refuse the checkpoint before the console line says it resumed."""
    if ckpt is None:
        torch.manual_seed(seed * 1000 + rank + 1)  # each rank its own dropout stream
        return fresh, None
    pending = None
    with ckpt.as_directory() as d:
        if rank == 0:
            if on_rank0 is not None:
                on_rank0(d)
            pending = read_pending(d, run_id or "")
        state = load_checkpoint(d, rank, t, world)
    if check is not None:
        check(state, ckpt.path)
    resized = ""
    if state.pop("rng", True) is False:
        torch.manual_seed((seed * 1000 + rank + 1) * 1_000_003 + int(state["step"]))
        n = state["world_size"]
        resized = f" (written by {n} worker{'s' if n != 1 else ''}, now {world}: RNG streams drawn afresh)"
    say(f"[rank {rank}] resumed at step {state['step']} position {state.get('position')}{resized}")
    return state, pending
