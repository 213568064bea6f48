"""Mixtures of named sources (`pipeline/pretrain/mixture.py`, and the stream `pipeline.pretrain.loader.StepFeed`
draws from them): each source's rows a step from its weight, epochs or size; the order a function of the seed and
the step alone, so that every step is the same global batch at any number of workers and a resumed stream goes
on with exactly the next one; the tokens each source gave, counted from what the loader yielded. The same through
DDP: tests/test_elastic.py::test_a_mixture_resumed_on_other_worker_counts_logs_the_same_losses."""

from __future__ import annotations

from dataclasses import replace as dataclasses_replace
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from pipeline.config import ConfigError, SourceConfig
from pipeline.pretrain.loader import Batches, PhasePlan, StepFeed
from pipeline.pretrain.mixture import Mixture

BATCH, CAP, CHUNK, STEPS = 12, 4, 16, 30


def mixed_tables(books: int = 30, wiki: int = 400, seed: int = 5) -> list[pa.Table]:
    """`books` long rows (10-16 tokens) and `wiki` short ones (4-8) in file order, mixed over three "files"; every
    row's ids are its own (its first id is its number), so a row yielded says which it is."""
    rng = np.random.default_rng(seed)
    rows = []
    names = ["books"] * books + ["wiki"] * wiki
    rng.shuffle(names)
    for i, name in enumerate(names):
        n = int(rng.integers(10, 17) if name == "books" else rng.integers(4, 9))
        rows.append(
            {
                "input_ids": [i + 100, *rng.integers(5, 60, size=n - 1).tolist()],
                "token_type_ids": [0] * n,
                "masked_lm_positions": [1],
                "masked_lm_ids": [7],
                "next_sentence_label": -1,
                "num_tokens": n,
                "source": name,
            }
        )
    table = pa.Table.from_pylist(rows)
    return [table.slice(0, 40), table.slice(40, 45), table.slice(85)]


TABLES = mixed_tables()
WHOLE = pa.concat_tables(TABLES)
SOURCE_OF = {r[0]: s for r, s in zip(WHOLE["input_ids"].to_pylist(), WHOLE["source"].to_pylist())}
TOKENS_OF = {r[0]: len(r) for r in WHOLE["input_ids"].to_pylist()}


def counts(tables: list[pa.Table]) -> dict[str, dict[str, int]]:
    t = pa.concat_tables(tables)
    return {
        n: {
            "rows": t["source"].to_pylist().count(n),
            "tokens": sum(k for k, s in zip(t["num_tokens"].to_pylist(), t["source"].to_pylist()) if s == n),
        }
        for n in ("books", "wiki")
    }


SOURCES = [SourceConfig("books", ["/b"], weight=3), SourceConfig("wiki", ["/w"], weight=1)]
MIX = Mixture.build(SOURCES, counts(TABLES), steps=STEPS, global_batch_size=BATCH, temperature=1.0)
PLAN = PhasePlan(
    SimpleNamespace(dynamic_masking=False, max_seq_length=16),
    STEPS,
    BATCH,
    CAP,
    ("a", "b", "c"),
    WHOLE.num_rows,
    (),
    False,
    mixture=MIX,
)


def feed(rank: int, world: int, done: int, plan: PhasePlan = PLAN) -> StepFeed:
    return StepFeed(plan, 0, rank, world, 0, CHUNK, done, lambda: iter(TABLES), Batches(plan, 0))


def steps_rows(world: int, done: int = 0, steps: int = STEPS, plan: PhasePlan = PLAN):
    """Each step's rows (their first ids, all ranks' in rank order) and each step's `source_tokens`."""
    feeds = [iter(feed(r, world, done, plan)) for r in range(world)]
    rows, tokens = [], []
    for _ in range(steps):
        parts = [next(f) for f in feeds]
        assert len({len(p.micro_batches) for p in parts}) == 1 and len({str(p.source_tokens) for p in parts}) == 1
        rows.append([int(seq[0]) for p in parts for b in p.micro_batches for seq in b["input_ids"]])
        tokens.append(parts[0].source_tokens)
    return rows, tokens


def test_weights_set_the_token_shares_and_the_rows_a_step_follow_from_the_step():
    """3:1 of tokens, books' rows twice as long: books take 6/7.5 of a step's rows; each step's counts sum to
    the global batch, none negative, and each source's rows over the phase are within one of its rate."""
    assert [round(s, 6) for s in MIX.token_shares()] == [0.75, 0.25]
    assert sum(MIX.per_step) == pytest.approx(BATCH)
    for k in range(STEPS):
        assert sum(MIX.at(k)) == BATCH and min(MIX.at(k)) >= 0
    assert all(abs(n - q * STEPS) <= 1 for n, q in zip(MIX.before(STEPS), MIX.per_step))
    assert MIX.before(7) == [a + b for a, b in zip(MIX.before(3), [sum(x) for x in zip(*map(MIX.at, range(3, 7)))])]


def test_temperature_epochs_and_a_phases_own_weights():
    c = {"a": {"rows": 100, "tokens": 8000}, "b": {"rows": 100, "tokens": 2000}}
    plain = [SourceConfig("a", ["/a"]), SourceConfig("b", ["/b"])]
    by_size = Mixture.build(plain, c, steps=10, global_batch_size=10, temperature=1.0)
    assert [round(s, 6) for s in by_size.token_shares()] == [0.8, 0.2]  # as one stream of both: by size
    flat = Mixture.build(plain, c, steps=10, global_batch_size=10, temperature=0.5)
    assert [round(s, 6) for s in flat.token_shares()] == [round(2 / 3, 6), round(1 / 3, 6)]  # sqrt(4): 2 to 1
    epochs = Mixture.build(
        [SourceConfig("a", ["/a"], epochs=0.5), SourceConfig("b", ["/b"], weight=1)],
        c,
        steps=10,
        global_batch_size=10,
        temperature=1.0,
    )
    assert epochs.per_step == (5.0, 5.0) and epochs.epochs() == [0.5, 0.5]
    phase = Mixture.build(plain, c, steps=10, global_batch_size=10, temperature=1.0, weights={"b": 2})
    assert phase.names == ("b",) and phase.index == (1,) and phase.per_step == (10.0,) and phase.weights == (2,)


@pytest.mark.parametrize(
    "sources,count,message",
    [
        (
            [SourceConfig("a", ["/a"], weight=1), SourceConfig("b", ["/b"], weight=1)],
            {"a": {"rows": 5, "tokens": 50}},
            "data.sources: source b has no training row",
        ),
        (
            [SourceConfig("a", ["/a"], epochs=30), SourceConfig("b", ["/b"], weight=1)],
            None,
            "data.sources: the sources' epochs need 30.0 rows a step, more than the global batch of 10",
        ),
        (
            [SourceConfig("a", ["/a"], epochs=1), SourceConfig("b", ["/b"], epochs=1)],
            None,
            "data.sources: every source has epochs, and they fill 2.0 of the 10 rows a step",
        ),
    ],
)
def test_a_mixture_the_data_cannot_give_is_one_line(sources, count, message):
    count = count or {"a": {"rows": 10, "tokens": 100}, "b": {"rows": 10, "tokens": 100}}
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        Mixture.build(sources, count, steps=10, global_batch_size=10, temperature=1.0)


def test_every_step_is_the_same_mixed_batch_at_any_world_size_and_resumed_at_any_step():
    """The rows of each step (all ranks', in rank order) are the same for 1, 2, 3 and 5 workers and resumed at any
    step, with the same cumulative tokens per source; books (30 rows) repeat, wiki (400) is read in part."""
    one, tokens = steps_rows(1)
    for world in (2, 3, 5):
        assert steps_rows(world)[0] == one, world
    for done in (1, 7, 13, 29):
        rows, toks = steps_rows(2, done, STEPS - done)
        assert rows == one[done:] and toks == tokens[done:], done
    seen = [SOURCE_OF[i] for step in one for i in step]
    assert seen.count("books") == MIX.before(STEPS)[0] > 30 and seen.count("wiki") == MIX.before(STEPS)[1] < 400
    k = max(k for k in range(STEPS + 1) if MIX.before(k)[0] <= 30)  # the steps within books' first pass
    books = [i for step in one[:k] for i in step if SOURCE_OF[i] == "books"]
    assert len(set(books)) == len(books) == MIX.before(k)[0] > 25  # no row twice within a pass


def test_the_counted_tokens_are_the_yielded_rows_and_their_shares_the_weights():
    """`source_tokens` at each step is what the yielded rows held, per source, so far; over the phase books gave
    75% of the tokens to within 2 points (whole passes even out the rows' lengths)."""
    one, tokens = steps_rows(1)
    so_far = {"books": 0, "wiki": 0}
    for step, counted in zip(one, tokens):
        for i in step:
            so_far[SOURCE_OF[i]] += TOKENS_OF[i]
        assert counted == so_far
    assert so_far["books"] / sum(so_far.values()) == pytest.approx(0.75, abs=0.02)


def test_dynamic_masks_are_drawn_per_step_at_the_phases_rate():
    """A row drawn twice gets two masks (the step seeds them); a phase's mask_rate replaces the data's."""
    from pipeline.data.masking import MaskingPolicy

    def policy(rate: float = 0.3) -> MaskingPolicy:
        return MaskingPolicy(
            mask_rate=rate, max_predictions_per_seq=8, vocab_size=600, mask_token_id=4, special_ids=(0, 1, 2, 3, 4)
        )

    tables = [
        t.drop_columns(["masked_lm_positions", "masked_lm_ids"]).append_column(
            "example_id", pa.array(range(k * 100, k * 100 + t.num_rows), pa.int64())
        )
        for k, t in enumerate(TABLES)
    ]
    ds = SimpleNamespace(dynamic_masking=True, policy=lambda rate=None: policy(rate or 0.3), max_seq_length=16)
    masked = {}
    for rate in (None, 0.05):
        plan = PhasePlan(ds, STEPS, BATCH, CAP, ("a",), WHOLE.num_rows, (), False, mixture=MIX, mask_rate=rate)
        steps = iter(StepFeed(plan, 0, 0, 1, 0, CHUNK, 0, lambda: iter(tables), Batches(plan, 0)))
        masked[rate] = sum(next(steps).masked_tokens for _ in range(STEPS))
    assert masked[0.05] < masked[None] / 2  # (at least one a row)
    plan = PhasePlan(ds, STEPS, BATCH, CAP, ("a",), WHOLE.num_rows, (), False, mixture=MIX)
    steps = iter(StepFeed(plan, 0, 0, 1, 0, CHUNK, 0, lambda: iter(tables), Batches(plan, 0)))
    draws: dict[int, list] = {}
    for _ in range(STEPS):
        for b in next(steps).micro_batches:
            for ids, pos in zip(b["input_ids"].tolist(), b["masked_lm_positions"].tolist()):
                draws.setdefault(ids[0], []).append(tuple(pos))
    repeated = [v for v in draws.values() if len(v) > 1]
    assert repeated and any(len(set(v)) > 1 for v in repeated)


def test_the_checkpoint_position_names_each_sources_rows():
    assert PLAN.position(10)["source_rows"] == dict(zip(MIX.names, MIX.before(10)))
    assert "source_rows" not in PhasePlan(None, 10, 4, 4, (), 10, (), False).position(5)


def test_the_runs_mixture_manifest_says_per_source_documents_tokens_and_the_epochs_it_reads():
    """The run's `mixture.json` (pipeline.pretrain.job.mixture_manifest): per source its documents (the prepared
    data's manifest), training rows and tokens, and the epochs the phase reads, which are the rows the loader
    yields over the phase over the source's rows (books, 30 rows, is read several times; wiki, 400, in part)."""
    from pipeline.pretrain.job import mixture_manifest

    manifest = {"sources": [{"name": "books", "documents": 3}, {"name": "wiki", "documents": 40}]}
    plan = dataclasses_replace(
        PLAN, dataset=SimpleNamespace(dynamic_masking=False, max_seq_length=16, manifest=manifest)
    )
    got = mixture_manifest(plan)
    yielded = [SOURCE_OF[i] for step in steps_rows(1)[0] for i in step]
    c = counts(TABLES)
    assert (got["steps"], got["global_batch_size"]) == (STEPS, BATCH)
    for s in got["sources"]:
        n = s["name"]
        assert (s["documents"], s["rows"], s["tokens"]) == ({"books": 3, "wiki": 40}[n], c[n]["rows"], c[n]["tokens"])
        assert s["epochs"] == pytest.approx(yielded.count(n) / c[n]["rows"], abs=1e-4)
        assert s["tokens_seen"] == round(s["epochs"] * s["tokens"])
    assert got["sources"][0]["epochs"] > 1 > got["sources"][1]["epochs"]
    assert mixture_manifest(dataclasses_replace(PLAN, mixture=None)) is None
