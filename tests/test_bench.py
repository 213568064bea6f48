"""Every maintained script in bench/ (all but bench/studies/) runs at its smallest size: the command in SMOKE, or the
test named in ELSEWHERE, which runs it in its own module. Each smoke run is time-boxed (SECONDS) and marked `bench`,
which tests/conftest.py counts as `slow` too: the quick loop (`pytest -m "not slow"`) skips them, CI runs them.
bench/RESULTS.md's links and bench/quality's suites are checked here as well."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

BENCH = REPO / "bench"
SECONDS = 120
"""Each smoke run's time box: a few seconds on 2 quiet cores; the slowest CI machine under load gets more."""

SMOKE: dict[str, tuple[list[str], str]] = {
    # script: (arguments at its smallest size, a line its output must hold). {corpus}: books/ (three short books)
    # and wiki/ (20 articles); {tmp}: an empty directory.
    "data/big_document_memory.py": (["--mb", "0.2", "--dedup", "off"], "(expected {n}: equal)"),
    "data/data_scale.py": (
        ["--corpora", "{corpus}", "--factors", "1", "--ray-factors", "", "--memory-factor", "1"],
        "peak RSS tree 1x (local) ÷ 1x (local): 1.00",
    ),
    "data/data_throughput.py": (
        ["--corpora", "{corpus}", "--target-tokens", "1", "--memory-factors", "1", "--skip-hf"],
        "| CPU ratio (tokens per CPU-s) pipeline / encode_batch |",
    ),
    "data/dedup_cost.py": (["--corpora", "{corpus}", "--factors", "1", "--runs", "1"], "| 1x | "),
    "data/dedup_quality.py": (["--skip-speed", "--skip-planted"], "## The shared corpora themselves: 549 documents"),
    "data/wiki_compare.py": (["--copies", "4", "--repeats", "1"], "ours / wikiextractor: "),
    "data/tokenizer_kinds.py": (["--corpora", "{corpus}", "--vocab-size", "300"], "| unigram | 320 |"),
    "data/tokenizer_sample.py": (
        ["--copies", "20", "--sample-bytes", "20000", "--vocab-size", "300", "--work", "{tmp}"],
        "| 0 MB (220 pages) | unigram | 20,000 |",
    ),
    "data/wiki_dump.py": (["{tmp}", "--copies", "2", "--parts", "2"], "part 2: 11 pages (4 articles)"),
    "train/loader_throughput.py": (["--corpora", "{corpus}", "--shapes", "mlm", "--epochs", "1"], "| mlm | dynamic |"),
    "train/mixture_loader.py": (
        ["--corpora", "{corpus}", "--steps", "10", "--resume-at", "4", "--resume-steps", "3", "--repeats", "1"],
        "mixture / one stream: ",
    ),
}

ELSEWHERE = {
    "measure.py": "tests/test_bench.py::test_measure_examples",
    "cost/capacity.py": "tests/test_capacity.py::test_tables_follow_the_options",
    "cost/suite_cpu.py": "tests/test_suite_cpu.py::test_the_plugin_logs_each_test_and_the_poller_finds_its_children",
    "data/fuzz_readers.py": "tests/test_fuzz_readers.py::test_mutated_inputs_are_all_read_or_rejected_with_reasons",
    "data/reader_timing.py": "tests/test_fuzz_readers.py::test_hostile_markup_timing_table_is_linear_or_rejected",
    "gpu/gpu_bundle.py": "tests/test_gpu_bundle.py::test_repack_drops_jars_and_source_maps_and_their_record_lines",
    "gpu/gpu_e2e.py": "tests/test_bench.py::test_gpu_e2e_script_reports_on_the_cpu",
    "gpu/gpu_e2e.sh": "tests/test_bench.py::test_gpu_e2e_script_reports_on_the_cpu",
    "gpu/gpu_step.sh": "tests/test_bench.py::test_gpu_step_script_runs_every_step_of_its_set",
    "quality/retrieval.py": "tests/test_embedding.py::test_the_retrieval_bench_runs_at_its_smallest",
    "quality/eval_trials.py": "tests/test_evaluate_job.py::test_the_trials_bench_runs_at_its_smallest",
    "train/modernbert_step.py": "tests/test_modernbert_step_bench.py::test_every_implementation_steps_and_is_timed",
    "train/train_step.py": "tests/test_train_step_bench.py::test_tries_run_and_count_the_flops_of_their_own_model",
}


def maintained() -> set[str]:
    """bench/'s scripts outside bench/studies/, relative to bench/."""
    return {
        str(p.relative_to(BENCH))
        for p in BENCH.rglob("*")
        if p.suffix in (".py", ".sh") and "studies" not in p.parts and "__pycache__" not in p.parts
    }


def test_every_maintained_script_has_a_smoke_run():
    """A script added to bench/ outside studies/ gets a line in SMOKE or ELSEWHERE; one moved or deleted loses it."""
    assert maintained() == set(SMOKE) | set(ELSEWHERE)
    for script, test in ELSEWHERE.items():
        path, name = test.split("::")
        assert re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M), f"{script}: {test} does not exist"


def test_every_study_names_its_result_and_commit():
    """A finished study opens with one line: what it found, and the commit it ran at."""
    for p in sorted((BENCH / "studies").glob("*.py")):
        first = p.read_text().splitlines()[0]
        assert re.match(r"# Finished study, ran at [0-9a-f]{7,} \(20\d\d-\d\d-\d\d\): .+", first), (p.name, first)
        assert len(first) <= 120, p.name


def test_results_links_resolve():
    """bench/README.md, RESULTS.md and results/*.md: every relative link and #anchor resolves (as tests/test_docs.py
    checks the guides)."""
    from test_docs import bad_links

    pages = [BENCH / "README.md", BENCH / "RESULTS.md", *sorted((BENCH / "results").glob("*.md"))]
    assert [b for p in pages for b in bad_links(p)] == []


def test_quality_suites_load():
    """bench/quality's suites (jobs/evaluate.py --suite) parse and name task files that exist."""
    from pipeline.evaluate.job import check_files
    from pipeline.evaluate.suite import load_suite

    suites = sorted((BENCH / "quality").glob("*.yaml"))
    assert suites
    for path in suites:
        suite = load_suite(str(path))
        check_files(suite)
        assert suite.name == path.stem


def test_measure_examples():
    import doctest

    from conftest import load_bench

    result = doctest.testmod(load_bench("measure"))
    assert result.attempted >= 3 and result.failed == 0


@pytest.fixture(scope="module")
def corpus(shared_dir, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bench-corpus")
    (root / "books").mkdir()
    (root / "wiki").mkdir()
    for book in ("57_Phmn.txt", "31_Obad.txt", "08_Ruth.txt"):
        shutil.copyfile(shared_dir / "corpora/books" / book, root / "books" / book)
    with (
        gzip.open(shared_dir / "corpora/wiki/pydocs.jsonl.gz", "rt") as src,
        gzip.open(root / "wiki/pydocs20.jsonl.gz", "wt") as dst,
    ):
        for _, line in zip(range(20), src):
            dst.write(line)
    return root


def run(cmd: list[str], cwd: Path, **env: str) -> str:
    p = subprocess.run(
        cmd, cwd=cwd, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, capture_output=True, text=True, timeout=SECONDS
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    return out


@pytest.mark.bench
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_smallest_run(script, corpus, tmp_path):
    args, expect = SMOKE[script]
    (tmp_path / "out").mkdir()
    argv = [a.format(corpus=corpus, tmp=tmp_path / "out") for a in args]
    out = run([sys.executable, str(BENCH / script), *argv], tmp_path, TMPDIR=str(tmp_path))
    if script == "data/big_document_memory.py":  # the token check's own figure, whatever it is
        expect = expect.format(n=re.search(r"tokenize pass\s+(\d+) \(", out)[1])
    assert expect in out, out[-3000:]


@pytest.mark.bench
@pytest.mark.parametrize("step_set", ["goals", "modernbert"])
def test_gpu_step_script_runs_every_step_of_its_set(tmp_path, step_set):
    """bench/gpu/gpu_step.sh's default set and issue 61's ModernBERT set on the CPU, each run's interpreter a stand-in
    that records its command: every run names a script that exists, within the budget; the scripts themselves run
    in their own tests (tests/test_modernbert_step_bench.py runs the ModernBERT set's attention table)."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho "$@" >> "$OUT/commands"\ntest -f "$1"\n')
    fake.chmod(0o755)
    out = run(
        ["bash", str(BENCH / "gpu/gpu_step.sh")],
        tmp_path,
        STEP_DEVICE="cpu",
        PYTHON=str(fake),
        OUT=str(tmp_path),
        TMPDIR=str(tmp_path),
        STEP_SET=step_set,
    )
    commands = (tmp_path / "commands").read_text().splitlines()
    if step_set == "goals":
        assert len(commands) == 8 and all(c.startswith("bench/train/train_step.py --device cpu") for c in commands)
    else:  # steps at 1,024, the attention kernels at both lengths, 8,192, memory at twice the tokens, large
        assert len(commands) == 6 and all(c.startswith("bench/train/modernbert_step.py --device cpu") for c in commands)
        attention = [c for c in commands if "--attention" in c]
        assert len(attention) == 1 and "--attention-seqs 128,256" in attention[0] and "attention.jsonl" in attention[0]
        assert "--impls transformers,ours,ours+jagged" in commands[0]  # no FlexAttention step on a CPU (no backward)
    assert "done, failed=0" in out


@pytest.mark.bench
def test_gpu_e2e_script_reports_on_the_cpu(tmp_path):
    """bench/gpu/gpu_e2e.sh with no part to run (E2E_PARTS none): its set-up and bench/gpu/gpu_e2e.py's report."""
    bin_dir = Path(sys.executable).parent  # the script calls python3: this interpreter
    out = run(
        ["bash", str(BENCH / "gpu/gpu_e2e.sh")],
        tmp_path,
        E2E_DEVICE="cpu",
        E2E_PARTS="none",
        E2E_WORK=str(tmp_path / "work"),
        OUT=str(tmp_path / "out"),
        E2E_CORPUS=str(tmp_path),
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    )
    assert "installed: ray " in out and "0/0 checks passed" in out and "done, exit 0" in out
    assert (tmp_path / "out/summary.md").is_file()
