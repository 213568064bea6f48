"""The fine-tuning loop that runs in every Ray Train worker: build, resume, then the skeleton pretraining shares
(`pipeline.core.loop`: step, log, evaluate, checkpoint). Optimisation, precision, the step (accumulation,
clipping), checkpoints and the launcher are the ones pretraining uses (`pipeline.core`); what is fine-tuning's own
is the data order (`epoch_micro_batches`), the training figures (`TaskSums`) and evaluation on rank 0 after each
epoch (`evaluate`, with `pipeline.finetune.metrics`) with the best model it keeps (`BestModel`). An embedding task
trains its encoder inside `pipeline.finetune.embedding`'s `ContrastiveModel` (its batches, loss and figures are
that module's) and evaluates by retrieval (`pipeline.finetune.retrieval`).

Every checkpoint holds what an exact resume needs (weights, optimizer, scheduler, scaler, RNGs, and the data
position: epoch and micro-batch index) plus, in `best/`, the best epoch's model as a transformers directory with
its `eval_metrics.json`; the run's latest checkpoint therefore always carries the model the job registers.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch

from pipeline import cluster
from pipeline.console import say
from pipeline.core.checkpoint import resume, unwrap
from pipeline.core.optim import OptimOptions, make_optimizer
from pipeline.core.precision import forward, make_scaler
from pipeline.core.loop import Loop, Planned
from pipeline.core.step import Sums, Trainable
from pipeline.finetune.data import IGNORE_INDEX, TaskData, pad_batch
from pipeline.finetune.metrics import (
    best_null_threshold,
    classification_metrics,
    entity_metrics,
    postprocess_qa,
    regression_metrics,
    squad_metrics,
)


def steps_per_epoch(n_train: int, world: int, batch_size: int, accumulation: int = 1) -> int:
    """Every rank takes the same number of steps: `n_train // world` rows each in micro-batches of `batch_size`
    (the last may be short), `accumulation` micro-batches per step (the last step may have fewer).

    `steps_per_epoch(100, 2, 32) -> 2` (50 rows per rank: 32 + 18); `steps_per_epoch(100, 1, 10, 4) -> 3`
    """
    return max(1, math.ceil(micro_batches_per_epoch(n_train, world, batch_size) / accumulation))


def micro_batches_per_epoch(n_train: int, world: int, batch_size: int) -> int:
    """Micro-batches per epoch on each rank."""
    return max(1, math.ceil((n_train // world) / batch_size))


def epoch_micro_batches(
    rows: dict[str, list],
    epoch: int,
    rank: int,
    world: int,
    batch_size: int,
    seed: int,
    start: int = 0,
    collate: Callable = pad_batch,
) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's padded micro-batches of `epoch` from micro-batch `start` on. The permutation is the same on
    every rank (seeded by seed + epoch) and each rank takes its stride, so a resumed epoch continues exactly, and
    every rank's k-th micro-batch has as many rows (what the embedding task's gather needs). `collate(rows, idx)`
    pads a micro-batch (an embedding task's is `pipeline.finetune.embedding.pair_batch`)."""
    n = len(rows["input_ids"])
    perm = np.random.default_rng(seed + epoch).permutation(n)[: (n // world) * world]
    mine = perm[rank::world]
    for b in range(start * batch_size, len(mine), batch_size):
        yield {k: torch.as_tensor(v) for k, v in collate(rows, mine[b : b + batch_size]).items()}


@dataclass(frozen=True)
class TaskSums(Sums):
    """A task head's training figures of one or more forwards, float64 sums: the loss summed over examples, and for
    classification heads the correct argmax predictions among labelled examples (tokens for token tasks).

    >>> TaskSums.unpack(torch.tensor([1.5, 3.0, 2.0, 4.0], dtype=torch.float64)).figures()
    {'loss': 0.5, 'accuracy': 0.5}
    """

    loss_sum: torch.Tensor
    examples: torch.Tensor
    correct: torch.Tensor
    labelled: torch.Tensor
    """Labelled examples (tokens): 0 for a head that does not classify (regression, QA)."""

    @classmethod
    def of(cls, out, batch: dict[str, torch.Tensor]) -> TaskSums:
        """One forward's sums, on the device: nothing waits."""
        n, dev = batch["input_ids"].shape[0], out.loss.device
        correct = labelled = torch.zeros((), dtype=torch.float64, device=dev)
        logits, labels = getattr(out, "logits", None), batch.get("labels")
        if logits is not None and labels is not None and logits.shape[-1] > 1:  # not regression, not QA
            labels = labels.to(logits.device)
            keep = labels != IGNORE_INDEX
            correct = ((logits.argmax(-1) == labels) & keep).sum().double()
            labelled = keep.sum().double()
        examples = torch.full((), float(n), dtype=torch.float64, device=dev)
        return cls(out.loss.detach().double() * n, examples, correct, labelled)

    def figures(self) -> dict[str, float]:
        """Loss (and accuracy where the head classifies)."""
        out = {"loss": (self.loss_sum / self.examples.clamp(min=1)).item()}
        if self.labelled > 0:
            out["accuracy"] = (self.correct / self.labelled).item()
        return out


@torch.no_grad()
def evaluate(model: torch.nn.Module, td: TaskData, cfg: Any, device: torch.device | str = "cpu") -> dict[str, float]:
    """Eval metrics of `model` on `td.eval` (classification/regression, entities, SQuAD EM/F1, or retrieval)."""
    if td.task == "embedding":
        from pipeline.finetune.retrieval import evaluate as evaluate_retrieval

        return evaluate_retrieval(model, td, cfg, device)
    was_training = model.training
    model.eval()
    n = len(td.eval["input_ids"])
    bs = cfg.train.eval_batch_size
    device = torch.device(device)
    precision = cfg.train.precision if device.type == "cuda" else "fp32"  # CPU evaluation stays exact
    outs: list[Any] = []
    loss_sum = 0.0
    for b in range(0, n, bs):
        idx = list(range(b, min(n, b + bs)))
        batch = {k: torch.as_tensor(v) for k, v in pad_batch(td.eval, idx, td.pad_id).items()}
        out = forward(model, batch, device, precision)
        loss_sum += float(out.loss) * len(idx)
        if td.task == "question-answering":
            lens = batch["attention_mask"].sum(1).tolist()
            outs += [
                (s[:L].float().cpu().numpy(), e[:L].float().cpu().numpy())
                for s, e, L in zip(out.start_logits, out.end_logits, lens)
            ]
        elif td.task == "token-classification":
            lens = batch["attention_mask"].sum(1).tolist()
            outs += [row[:L].cpu().numpy() for row, L in zip(out.logits.argmax(-1), lens)]
        else:
            outs.append(out.logits.float().cpu().numpy())
    model.train(was_training)
    res: dict[str, float]
    if td.task == "sequence-classification":
        logits = np.concatenate(outs)
        gold = np.asarray(td.eval["labels"])
        res = (
            regression_metrics(gold, logits[:, 0])
            if td.problem_type == "regression"
            else classification_metrics(gold, logits.argmax(-1))
        )
    elif td.task == "token-classification":
        preds = []
        for pred_ids, wids, gold in zip(outs, td.eval["word_ids"], td.eval_tags):
            tags = ["O"] * len(gold)  # words cut off by max_seq_length count as O
            prev = -1
            for p, w in zip(pred_ids, wids):
                if w >= 0 and w != prev:
                    tags[w] = td.id2label[int(p)]
                prev = w
            preds.append(tags)
        res = entity_metrics(td.eval_tags, preds)
    else:
        starts = [s for s, _ in outs]
        ends = [e for _, e in outs]
        details: dict[str, dict[str, Any]] = {}
        preds = postprocess_qa(
            td.eval_windows,
            starts,
            ends,
            td.eval_contexts,
            cfg.eval.n_best,
            cfg.eval.max_answer_length,
            td.version_2,
            cfg.eval.null_score_diff_threshold,
            details,
        )
        res = squad_metrics(preds, td.eval_answers)
        if td.version_2:  # as the official v2 script: the scores at the best null threshold, and that threshold
            res.update(best_null_threshold(details["span"], details["score_diff"], td.eval_answers))
    res["loss"] = loss_sum / max(n, 1)
    return res


@dataclass(frozen=True)
class FinetuneHandoff:
    """What the driver gives every fine-tuning worker. The runs of one job (a single run, or each trial of a sweep)
    share all of it but `cfg` (a trial's LR) and `run_id` (`fit_run` sets both)."""

    data_ref: Any
    """Ray object ref to the task's `TaskData` (tokenized once on the driver)."""
    init_ref: Any
    """Ray object ref to the initial model: {"class", "config", "state_dict"}."""
    tracking_uri: str
    primary: str
    """The eval metric that picks the best epoch (accuracy, f1, pearson, ...)."""
    on_step: Callable[[int, int], None] | None = None
    """Test hook called in every worker after each step (fault injection)."""
    cfg: Any = None
    """This run's `FinetuneConfig`."""
    run_id: str | None = None
    """The MLflow run rank 0 logs into; None logs nothing."""
    quiet: bool = False
    """No console lines from the workers (an evaluation suite's trials: its driver prints one line a trial)."""


class BestModel:
    """Rank 0's best epoch so far: a CPU copy of the model in memory (nothing in /tmp to leave behind when a
    worker dies), written into every checkpoint as `best/` (a transformers directory + eval_metrics.json)."""

    def __init__(self) -> None:
        self.model: torch.nn.Module | None = None
        self.info: dict[str, float] = {}

    def update(self, model: torch.nn.Module, ev: dict[str, float], epoch: int, step: int) -> None:
        from pipeline.finetune.embedding import encoder_of

        self.model = copy.deepcopy(encoder_of(unwrap(model))).cpu()  # what is saved: an embedding task's encoder
        self.info = {**ev, "epoch": epoch, "step": step}

    def load(self, checkpoint_dir: str, cls: type) -> None:
        from model.hf import load_hf

        best = os.path.join(checkpoint_dir, "best")
        if os.path.isdir(best):
            self.model = load_hf(best, cls)
            with open(os.path.join(best, "eval_metrics.json")) as f:
                self.info = json.load(f)

    def write(self, checkpoint_dir: str) -> None:
        from model.hf import save_hf

        if self.model is not None:
            best = save_hf(self.model, os.path.join(checkpoint_dir, "best"))
            with open(os.path.join(best, "eval_metrics.json"), "w") as f:
                json.dump(self.info, f, indent=1)


def planned_steps(
    state: dict, td: TaskData, tc: Any, rank: int, world: int, collate: Any, total: int
) -> Iterator[Planned]:
    """The run's steps from where it resumed (`state`'s step and position): each epoch's micro-batches in its
    seeded order, `accumulation_steps` a step (the epoch's last step may have fewer); each epoch ends in an
    evaluation and a checkpoint."""
    micro = micro_batches_per_epoch(len(td.train["input_ids"]), world, tc.batch_size)
    step, epoch, done = state["step"], state["position"]["epoch"], state["position"]["micro"]
    while step < total:
        batches = epoch_micro_batches(td.train, epoch, rank, world, tc.batch_size, tc.seed, start=done, collate=collate)
        while step < total and done < micro:
            k = min(tc.accumulation_steps, micro - done)
            step, done = step + 1, done + k
            end_of_epoch = done == micro or step == total
            every = bool(tc.checkpoint_every_steps and step % tc.checkpoint_every_steps == 0)
            position = {"epoch": epoch + 1, "micro": 0} if done == micro else {"epoch": epoch, "micro": done}
            yield Planned(
                step,
                batches,
                k,
                evaluating=end_of_epoch,
                checkpointing=end_of_epoch or every,
                figures={"train/epoch": epoch},
                state={"position": position},
                report={"epoch": epoch},
                where=epoch,
            )
        epoch, done = epoch + 1, 0


def _worker_model(handoff: FinetuneHandoff, td: TaskData) -> tuple[Any, Any, Any]:
    """(the model as this worker trains it, DDP-wrapped; its collate; its `Sums`): the driver's model rebuilt with
    its initial weights; for the embedding task, inside the contrastive model that scores in-batch negatives."""
    import ray

    from model.build import rebuild

    init = ray.get(handoff.init_ref)  # the driver's model: class name, config, initial weights
    model = rebuild(init["class"], init["config"])
    model.load_state_dict(init["state_dict"])
    collate, task_sums = functools.partial(pad_batch, pad_id=td.pad_id), TaskSums  # the tokenizer's pad token
    if td.task == "embedding":  # DDP wraps the contrastive model
        from pipeline.finetune import embedding

        model = embedding.ContrastiveModel(model, handoff.cfg.embedding.pooling, handoff.cfg.embedding.temperature)
        collate, task_sums = embedding.pair_batch, embedding.PairSums
    return cluster.prepare_model(model), collate, task_sums


def train_loop_per_worker(handoff: FinetuneHandoff) -> None:
    """Fine-tune with DDP; resumes from `ray.train.get_checkpoint()` exactly (weights, optimizer, RNGs, data)."""
    import ray
    import ray.train

    from pipeline.finetune.embedding import encoder_of

    cfg, primary = handoff.cfg, handoff.primary
    td: TaskData = ray.get(handoff.data_ref)
    tc = cfg.train
    cluster.quiet_ray_train()  # Ray Train's per-report INFO line to its log file only
    rank, world, device = cluster.worker()
    if not tc.use_gpu:  # a fixed thread count: bit-identical CPU math on restart
        torch.set_num_threads(tc.torch_threads or max(1, (os.cpu_count() or 1) // world))
    model, collate, task_sums = _worker_model(handoff, td)
    per_epoch = steps_per_epoch(len(td.train["input_ids"]), world, tc.batch_size, tc.accumulation_steps)
    total = tc.max_steps or tc.epochs * per_epoch
    optimizer, scheduler = make_optimizer(model, OptimOptions.finetuning(tc, total))
    trainable = Trainable(model, optimizer, scheduler, make_scaler(device, tc.precision))
    best_model = BestModel()
    # on rank 0 the best model is read first: building its copy draws from the RNGs that the restore then sets
    state, pending = resume(
        ray.train.get_checkpoint(),
        rank,
        trainable,
        {"step": 0, "best": None, "position": {"epoch": 1, "micro": 0}},
        seed=tc.seed,
        run_id=handoff.run_id,
        on_rank0=lambda d: best_model.load(d, type(encoder_of(unwrap(model)))),
    )
    log = None
    if rank == 0 and handoff.run_id:  # mlflow loads on the logging rank only (seconds of CPU per process)
        from pipeline.tracking import RunLogger

        log = RunLogger(
            handoff.run_id,
            handoff.tracking_uri,
            total_steps=total,
            log_every_steps=tc.log_every_steps,
            background=True,
            pending=pending,
            show_progress=not handoff.quiet,
        )

    best = tuple(state["best"]) if state["best"] is not None else None

    def evaluate_epoch(p: Planned) -> dict[str, float]:
        """The evaluation and the best model, on rank 0 (the others wait in the checkpoint's report): its eval/*
        figures join the report."""
        nonlocal best
        if rank != 0:
            return {}
        ev = evaluate(unwrap(model), td, cfg, device)
        if log is not None:
            log.log_metrics({f"eval/{k}": v for k, v in ev.items()}, p.step)
            if not handoff.quiet:
                say(
                    f"[finetune] epoch {p.where} step {p.step}/{total} eval "
                    + "  ".join(f"{k} {v:.4f}" for k, v in ev.items())
                )
        score = (ev[primary], -ev["loss"])  # ties on the metric (e.g. F1 0 early on) go to the lower loss
        if best is None or score > best:
            best = score
            best_model.update(model, ev, p.where, p.step)
        return {f"eval/{k}": v for k, v in ev.items()}

    model.train()
    Loop(
        trainable,
        task_sums,
        device,
        rank,
        world,
        log,
        handoff.run_id,
        total,
        precision=tc.precision,
        max_grad_norm=tc.max_grad_norm,
        log_every_steps=tc.log_every_steps,
        on_step=handoff.on_step,
    ).run(
        planned_steps(state, td, tc, rank, world, collate, total),
        evaluate_epoch,
        state=lambda: {"best": best},
        write=best_model.write if rank == 0 else None,
    )
