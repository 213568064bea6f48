"""Training that outlives a change of cluster size, on the CPU and in this process: the global batches do not
depend on the number of workers (`pipeline.pretrain.loader.StepFeed`), a run on 2 workers resumed on 1 or 3 logs
the same losses (real DDP over gloo, one thread per rank), checkpoints of another world size and of the format
before `world_size` load (`pipeline.core.checkpoint`), and runs named before the number of workers left the
identity keep their names (`pipeline.pretrain.identity`). The same resize through Ray Train:
tests/test_pretrain_job.py::test_a_run_resumes_on_fewer_workers_with_the_same_losses."""

from __future__ import annotations

import copy
import datetime
import json
import threading
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.distributed as dist

from model import BertConfig, BertForPreTraining
from pipeline.core.checkpoint import load_checkpoint, save_checkpoint
from pipeline.core.optim import OptimOptions, make_optimizer
from pipeline.core.step import Trainable, train_step
from pipeline.pretrain.loader import Batches, PhasePlan, StepFeed, split_global_batch
from pipeline.pretrain.metrics import MlmSums, step_loss

VOCAB, SEQ, ROWS, BATCH, CAP, CHUNK, STEPS = 60, 16, 50, 12, 4, 20, 8
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _tables() -> list[pa.Table]:
    """ROWS unmasked-length rows in three "files": lengths 6..16, 1..6 masked positions, NSP labels -1/0/1, so
    that micro-batches of other sizes hold other numbers of masked tokens (a mean of their means would differ)."""
    rng = np.random.default_rng(5)
    rows = []
    for i in range(ROWS):
        n = int(rng.integers(6, SEQ + 1))
        pos = np.sort(rng.choice(np.arange(1, n - 1), size=int(rng.integers(1, min(6, n - 2) + 1)), replace=False))
        rows.append(
            {
                "input_ids": [2, *rng.integers(5, VOCAB, size=n - 2).tolist(), 3],
                "token_type_ids": [0] * n,
                "masked_lm_positions": pos.tolist(),
                "masked_lm_ids": rng.integers(5, VOCAB, size=len(pos)).tolist(),
                "next_sentence_label": int(rng.integers(-1, 2)),
                "num_tokens": n,
            }
        )
    table = pa.Table.from_pylist(rows)
    return [table.slice(0, 17), table.slice(17, 20), table.slice(37)]


TABLES = _tables()
PLAN = PhasePlan(
    SimpleNamespace(dynamic_masking=False, max_seq_length=SEQ), STEPS, BATCH, CAP, ("a", "b", "c"), ROWS, (), False
)


def _feed(rank: int, world: int, done: int, plan: PhasePlan = PLAN, tables: list[pa.Table] = TABLES) -> StepFeed:
    return StepFeed(plan, 0, rank, world, 0, CHUNK, done, lambda: iter(tables), Batches(plan, 0))


def test_every_step_is_the_same_global_batch_at_any_world_size():
    """The rows of each step (all ranks' micro-batches, in rank order) are the same for 1, 2, 3 and 5 workers and
    when resumed at any step; an epoch (4 global batches of 12 of the 50 rows) holds no row twice."""

    def rows(world: int, done: int = 0, steps: int = STEPS) -> list[list[int]]:
        feeds = [iter(_feed(r, world, done)) for r in range(world)]
        out = []
        for _ in range(steps):
            parts = [next(f) for f in feeds]
            assert len({len(p.micro_batches) for p in parts}) == 1  # every rank the same accumulation
            assert all(len(b["input_ids"]) <= CAP for p in parts for b in p.micro_batches)
            assert len({(p.masked_tokens, p.nsp_examples) for p in parts}) == 1  # every rank knows the global counts
            out.append([tuple(seq[seq > 0].tolist()) for p in parts for b in p.micro_batches for seq in b["input_ids"]])
        return out

    one = rows(1)
    for world in (2, 3, 5):
        assert rows(world) == one, world
    for done in (3, 4, 5):
        assert rows(2, done, STEPS - done) == one[done:]
    every = {tuple(ids) for t in TABLES for ids in t["input_ids"].to_pylist()}
    first_epoch = sum(one[:4], [])
    assert len(set(first_epoch)) == 48 and set(first_epoch) <= every and len(every) == ROWS
    assert one[4:] != one[:4]  # the next epoch: another order


def test_dynamic_masks_and_the_global_counts_are_the_same_at_any_world_size():
    """Dynamically masked data: every rank draws the masks of the whole global batch to count them, and its share
    holds the masks the whole batch got (1, 2 and 3 workers: the same positions, ids and counts)."""
    from pipeline.data.masking import MaskingPolicy

    policy = MaskingPolicy(
        mask_rate=0.3, max_predictions_per_seq=4, vocab_size=VOCAB, mask_token_id=4, special_ids=(0, 1, 2, 3, 4)
    )
    dynamic = PhasePlan(
        SimpleNamespace(dynamic_masking=True, policy=lambda: policy, max_seq_length=SEQ),
        STEPS,
        BATCH,
        CAP,
        ("a",),
        ROWS,
        (),
        False,
    )
    table = pa.concat_tables(TABLES).drop_columns(["masked_lm_positions", "masked_lm_ids"])
    table = table.append_column("example_id", pa.array(range(ROWS), pa.int64()))
    batch = table.slice(0, BATCH)
    seen = {}
    for world in (1, 2, 3):
        parts = [Batches(dynamic, 7).step(batch, 2, s) for s in split_global_batch(BATCH, world, CAP)]
        assert len({(p.masked_tokens, p.nsp_examples) for p in parts}) == 1
        micro = [b for p in parts for b in p.micro_batches]
        seen[world] = (
            parts[0].masked_tokens,
            [int((b["masked_lm_positions"] >= 0).sum()) for b in micro],
            sorted(tuple(row[row >= 0].tolist()) for b in micro for row in b["masked_lm_ids"]),
        )
        assert seen[world][0] == sum(seen[world][1])  # the count is the masks the ranks train on
    assert seen[1][0] == seen[2][0] == seen[3][0] > 0 and seen[1][2] == seen[2][2] == seen[3][2]


_KEPT: list = []
"""Every rank's DDP model (and so its process group) of the module, never freed while the tests run. A rank
thread that freed its DDP model on return destroyed its gloo process group, which joins the group's worker
thread while holding the GIL; that thread, releasing the last all-reduce of another rank still in `backward`,
waited for the GIL: a deadlock, seen once in the quick loop (torch 2.13, threads as ranks in one process, which
a real run, a process a rank, never has)."""


def _group(store, rank: int, world: int):
    """This rank's gloo process group in this process (each rank thread makes its own: they meet in `store`), as
    DDP takes it."""
    backend = dist.ProcessGroupGloo(dist.PrefixStore("g", store), rank, world, datetime.timedelta(seconds=60))
    pg = dist.ProcessGroup(dist.PrefixStore("g", store), rank, world)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    return pg


def _model() -> BertForPreTraining:
    torch.manual_seed(0)  # no dropout: each rank's dropout draws are its own, the one thing a resize changes
    cfg = BertConfig.from_preset(
        "tiny", vocab_size=VOCAB, max_position_embeddings=SEQ, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    return BertForPreTraining(cfg)


def _train(
    world: int,
    start: int,
    stop: int,
    ckpt_in=None,
    ckpt_out=None,
    ckpt_at: int | None = None,
    global_mean: bool = True,
    plan: PhasePlan = PLAN,
    tables: list[pa.Table] = TABLES,
) -> dict[int, float]:
    """Steps start+1..stop on `world` ranks (threads, DDP over gloo when several), as the loop runs them: each
    rank its share of the step's global batch, the loss the global batch's mean (`step_loss`; with `global_mean`
    false the mean of the micro-batches' means, as before). Resumes from `ckpt_in`, writes `ckpt_out` after step
    `ckpt_at`. Returns
    {step: train/loss}, from the ranks' summed counts as the loop's all-reduce sums them."""
    store, init = dist.HashStore(), _model()
    sums: dict[tuple[int, int], MlmSums] = {}
    errors: list[BaseException] = []

    def rank_run(rank: int) -> None:
        try:
            model = copy.deepcopy(init)
            if world > 1:
                model = torch.nn.parallel.DistributedDataParallel(model, process_group=_group(store, rank, world))
                _KEPT.append(model)
            t = Trainable(
                model, *make_optimizer(model, OptimOptions("adamw", 3e-3, 0.01, warmup_steps=2, total_steps=STEPS))
            )
            if ckpt_in is not None:
                assert load_checkpoint(str(ckpt_in), rank, t, world)["step"] == start
            feed = iter(_feed(rank, world, start, plan, tables))
            for step in range(start + 1, stop + 1):
                s = next(feed)
                loss = (
                    (lambda out, s=s: step_loss(out, s.masked_tokens, s.nsp_examples, world)) if global_mean else None
                )
                got = train_step(
                    t,
                    s.micro_batches,
                    accumulation=len(s.micro_batches),
                    sums=MlmSums,
                    device=torch.device("cpu"),
                    loss=loss,
                )
                sums[(rank, step)] = got.sums
                if step == ckpt_at:
                    save_checkpoint(
                        str(ckpt_out),
                        rank,
                        t,
                        {"step": step, "position": {"phase": 0, **plan.position(step)}, "world_size": world},
                    )
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=rank_run, args=(r,)) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    if errors:
        raise errors[0]
    return {step: sum(sums[(r, step)] for r in range(world)).figures()["loss"] for step in range(start + 1, stop + 1)}


def test_a_run_on_two_workers_resumed_on_one_or_three_logs_the_same_losses(tmp_path):
    """2 workers for 3 steps, checkpoint (mid-epoch), then steps 4-8 on 1, 2 or 3 workers: every step's loss is
    the uninterrupted 2-worker run's within 1e-3 relative (float reduction order only; measured ~1e-7). The
    micro-batches differ (1 worker: 3 x 4 rows, 2: 2 x 3 each, 3: 1 x 4 each); with the mean of their means as
    the objective instead, the losses part by more than that."""
    whole = _train(2, 0, STEPS, ckpt_out=tmp_path / "ckpt", ckpt_at=3)
    assert whole[STEPS] < whole[1] - 0.1  # it learns
    state = json.loads((tmp_path / "ckpt" / "train_state.json").read_text())
    assert state["world_size"] == 2 and state["position"] == {"phase": 0, "epoch": 0, "batch": 3, "samples": 36}
    for world in (1, 2, 3):
        resumed = _train(world, 3, STEPS, ckpt_in=tmp_path / "ckpt")
        for step in range(4, STEPS + 1):
            assert resumed[step] == pytest.approx(whole[step], rel=1e-3), (world, step)
        print(
            f"resumed on {world}: largest relative loss difference {max(abs(resumed[s] / whole[s] - 1) for s in resumed):.1e}"  # noqa: E501
        )
    means = {w: _train(w, 0, 4, global_mean=False) for w in (1, 2)}
    apart = max(abs(means[1][s] / means[2][s] - 1) for s in range(2, 5))
    print(f"mean of micro-batch means, 1 vs 2 workers: largest relative loss difference {apart:.1e}")
    assert apart > 1e-3


def test_a_mixture_resumed_on_other_worker_counts_logs_the_same_losses(tmp_path):
    """The same with a mixture (`data.sources`, wiki weighted 3 to books' 1, so wiki's 17 rows repeat): 2 workers
    for 3 steps, checkpoint, then steps 4-8 on 1, 2 or 3 workers log the uninterrupted run's losses."""
    from pipeline.config import SourceConfig
    from pipeline.pretrain.mixture import Mixture

    whole_table = pa.concat_tables(TABLES)
    names = ["wiki" if i % 3 == 0 else "books" for i in range(ROWS)]
    tables = [t.append_column("source", pa.array(n)) for t, n in zip(TABLES, [names[:17], names[17:37], names[37:]])]
    count = {
        n: {
            "rows": names.count(n),
            "tokens": sum(k for k, m in zip(whole_table["num_tokens"].to_pylist(), names) if m == n),
        }
        for n in ("books", "wiki")
    }
    mix = Mixture.build(
        [SourceConfig("books", ["/b"], weight=1), SourceConfig("wiki", ["/w"], weight=3)],
        count,
        steps=STEPS,
        global_batch_size=BATCH,
        temperature=1.0,
    )
    plan = PhasePlan(PLAN.dataset, STEPS, BATCH, CAP, ("a", "b", "c"), ROWS, (), False, mixture=mix)
    assert mix.epochs()[1] > 1  # wiki repeats within the run
    whole = _train(2, 0, STEPS, ckpt_out=tmp_path / "ckpt", ckpt_at=3, plan=plan, tables=tables)
    state = json.loads((tmp_path / "ckpt" / "train_state.json").read_text())
    assert state["position"]["source_rows"] == dict(zip(mix.names, mix.before(3)))
    for world in (1, 3):
        resumed = _train(world, 3, STEPS, ckpt_in=tmp_path / "ckpt", plan=plan, tables=tables)
        for step in range(4, STEPS + 1):
            assert resumed[step] == pytest.approx(whole[step], rel=1e-3), (world, step)


def test_a_checkpoint_loads_at_another_world_size_and_in_the_format_before_world_size(tmp_path, capsys):
    """A 2-worker checkpoint on 1 worker: weights, optimizer and step restored, the RNGs not (no rank file of its
    own means nothing); a checkpoint as written before `world_size` existed (the position in the rank file only)
    loads with its position and RNGs at its own size."""
    model = _model()
    t = Trainable(model, *make_optimizer(model, OptimOptions("adamw", 1e-3, 0.01, warmup_steps=2, total_steps=10)))
    save_checkpoint(
        str(tmp_path),
        0,
        t,
        {"step": 5, "position": {"phase": 0, "epoch": 1, "batch": 1, "samples": 60}, "world_size": 2},
    )
    torch.manual_seed(7)
    before = torch.get_rng_state()
    other = _model()
    t2 = Trainable(other, *make_optimizer(other, OptimOptions("adamw", 1e-3, 0.01, warmup_steps=2, total_steps=10)))
    torch.set_rng_state(before)
    state = load_checkpoint(str(tmp_path), 0, t2, world=1)
    assert state == {
        "step": 5,
        "position": {"phase": 0, "epoch": 1, "batch": 1, "samples": 60},
        "world_size": 2,
        "rng": False,
    }
    assert torch.equal(torch.get_rng_state(), before)  # not set from the rank file
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))

    # the format before `world_size`: train_state.json without position or world size, the position per rank
    torch.manual_seed(3)
    save_checkpoint(str(tmp_path), 0, t, {"step": 4, "position": {"phase": 0, "epoch": 2, "micro": 6}})
    expect = torch.rand(2)
    old = json.loads((tmp_path / "train_state.json").read_text())
    del old["position"]
    (tmp_path / "train_state.json").write_text(json.dumps(old))
    torch.manual_seed(99)
    state = load_checkpoint(str(tmp_path), 0, t2, world=1)
    assert state == {"step": 4, "position": {"phase": 0, "epoch": 2, "micro": 6}, "world_size": 1}
    assert torch.equal(torch.rand(2), expect)  # this rank's RNG restored


def test_the_run_name_leaves_the_number_of_workers_out_and_earlier_runs_keep_theirs(repo_root, tmp_path, capsys):
    """Any num_workers or micro_batch_size: one name. A run the code before this change named (its names below,
    computed by that code for tiny.yaml) keeps its name while it has checkpoints and the new name has none."""
    import dataclasses

    from pipeline.config import load_config
    from pipeline.pretrain.identity import legacy_run_notice, run_name_for

    ds = [SimpleNamespace(config_hash="c" * 64, vocab_sha256="v" * 64)]
    tiny = load_config(repo_root / "configs" / "tiny.yaml", ["--train.storage_path", str(tmp_path)])

    def cfg(**train):
        return dataclasses.replace(tiny, train=dataclasses.replace(tiny.train, **train))

    new = run_name_for(cfg(), ds)
    assert new.startswith("tiny-") and new not in ("tiny-f6dfe608fd", "tiny-d6927a33d1")
    assert run_name_for(cfg(num_workers=1, micro_batch_size=32), ds) == new
    assert run_name_for(cfg(num_workers=3), ds) == new
    assert run_name_for(cfg(global_batch_size=64), ds) != new  # the global batch stays in it
    assert legacy_run_notice(cfg(), ds, new) is None

    (tmp_path / "tiny-f6dfe608fd" / "checkpoint_2026-01-01_00-00-00.000000").mkdir(parents=True)
    assert run_name_for(cfg(), ds) == "tiny-f6dfe608fd"  # 2 workers x 16: the name it had
    assert run_name_for(cfg(num_workers=1, micro_batch_size=32), ds) == new  # not at its size
    assert legacy_run_notice(cfg(), ds, "tiny-f6dfe608fd").startswith(
        "[train] tiny-f6dfe608fd was named before the data order stopped depending on the number of workers: it "
        "resumes at its own size (train.num_workers 2)"
    )
    (tmp_path / new / "checkpoint_2026-01-02_00-00-00.000000").mkdir(parents=True)
    assert run_name_for(cfg(), ds) == new  # once the new name has checkpoints, it is the run


def test_min_workers_makes_an_elastic_run_that_says_when_its_size_changes(monkeypatch, tmp_path, capfd):
    """`train.min_workers` -> Ray Train's ScalingConfig(num_workers=(min, max)) (checked on a 2-CPU local Ray by
    hand: (1, 4) workers of 0.75 CPU start 2); its controller callback prints a line at the first start and at
    each start at another size."""
    import ray.train.torch

    from pipeline import cluster
    from pipeline.cluster.resize import WorkerCount
    from pipeline.config import ConfigError, load_config

    assert load_config(None, ["--train.num_workers", "4", "--train.min_workers", "2"]).train.min_workers == 2
    with pytest.raises(ConfigError, match=r"train.min_workers 5 must be >= 1 and <= num_workers 4"):
        load_config(None, ["--train.num_workers", "4", "--train.min_workers", "5"])

    made = {}

    class Trainer:  # what fit hands Ray Train
        def __init__(self, loop, **kwargs):
            made.update(kwargs)

        def fit(self):
            return SimpleNamespace(error=None)

    monkeypatch.setattr(ray.train.torch, "TorchTrainer", Trainer)
    for scale, workers in (
        (cluster.Scale(4, min_workers=2), (2, 4)),
        (cluster.Scale(4), 4),
        (cluster.Scale(4, min_workers=4), 4),
    ):
        cluster.fit(lambda h: None, None, name="r", storage_path=str(tmp_path), scale=scale)
        assert made["scaling_config"].num_workers == workers
    cluster.fit(lambda h: None, None, name="r", storage_path=str(tmp_path), scale=cluster.Scale(4, min_workers=2))
    count = next(c for c in made["run_config"].callbacks if isinstance(c, WorkerCount))
    capfd.readouterr()
    for n in (4, 4, 3, 3, 4):
        count.before_worker_group_start(SimpleNamespace(num_workers=n))
    assert capfd.readouterr().out.splitlines() == [
        "[train] 4 workers (elastic: train.min_workers 2)",
        "[train] worker count 4 -> 3: resuming from the newest checkpoint",
        "[train] worker count 3 -> 4: resuming from the newest checkpoint",
    ]


def test_checkpoints_upload_in_the_background_on_object_storage_and_their_directory_outlives_the_block(
    repo_root, tmp_path
):
    """`train.checkpoint_upload` auto: in the background (Ray Train's ASYNC) for a URI other than file://, in the
    foreground on a disk; the directory of a background checkpoint is left for Ray Train to delete after its
    upload, a foreground one goes with the block. Not part of the run's name. The upload itself, on S3, and the
    exact resume from it:
    tests/test_pretrain_job.py::test_checkpoints_uploaded_in_the_background_to_s3_resume_exactly."""
    import dataclasses
    import os

    from pipeline.cluster import checkpoint_dir, uploads_in_background
    from pipeline.config import load_config
    from pipeline.pretrain.identity import run_name_for

    modes = {
        (m, p): uploads_in_background(m, p)
        for m in ("auto", "sync", "async")
        for p in ("s3://b/runs", "gs://b/runs", "file:///r", "runs")
    }
    assert [k for k, v in modes.items() if v] == [
        ("auto", "s3://b/runs"),
        ("auto", "gs://b/runs"),
        ("async", "s3://b/runs"),
        ("async", "gs://b/runs"),
        ("async", "file:///r"),
        ("async", "runs"),
    ]
    with checkpoint_dir(True) as kept:
        open(os.path.join(kept, "train_state.json"), "w").write("{}")
    assert os.listdir(kept) == ["train_state.json"]
    os.remove(os.path.join(kept, "train_state.json"))
    os.rmdir(kept)
    with checkpoint_dir(False) as gone:
        assert os.path.isdir(gone)
    assert not os.path.exists(gone)
    tiny = load_config(repo_root / "configs" / "tiny.yaml", ["--train.storage_path", str(tmp_path)])
    assert tiny.train.checkpoint_upload == "auto"
    ds = [SimpleNamespace(config_hash="c" * 64, vocab_sha256="v" * 64)]
    other = dataclasses.replace(tiny, train=dataclasses.replace(tiny.train, checkpoint_upload="sync"))
    assert run_name_for(other, ds) == run_name_for(tiny, ds)


def test_mlm_only_batches_give_every_parameter_a_gradient():
    """MLM-only data (configs/tiny.yaml, the main job) has no NSP label: the step's loss must still reach the
    pooler and the NSP head (a zero term), or DDP fails the next step ("Expected to have finished reduction in the
    prior iteration"), as the main job on 2 workers did before this test."""
    from pipeline.pretrain.loader import collate

    torch.manual_seed(0)
    m = BertForPreTraining(BertConfig.from_preset("tiny", vocab_size=50, max_position_embeddings=32))
    g = np.random.default_rng(0)
    rows = {
        "input_ids": [g.integers(5, 50, 20) for _ in range(2)],
        "token_type_ids": [np.zeros(20, np.int64)] * 2,
        "masked_lm_positions": [np.array([1, 4]), np.array([3])],
        "masked_lm_ids": [np.array([7, 8]), np.array([9])],
        "next_sentence_label": np.array([-1, -1]),
    }
    b = collate(rows)
    out = m(**{k: v for k, v in b.items() if k not in ("num_tokens", "spans")})
    loss = step_loss(out, masked_tokens=3, nsp_examples=0, world=2)
    loss.backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None]
    assert missing == [], missing
    assert loss.item() == pytest.approx(2 * out.mlm_loss.item())  # the NSP term adds nothing to the value
