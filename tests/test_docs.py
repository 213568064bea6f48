"""The docs are tested (issue 35): every Markdown file in README.md and docs/ is read, and

- every relative link (and its `#anchor`, GitHub's slug of a heading) resolves;
- every `--section.field` flag shown exists in the matching job's parser (built in-process: the same parser
  `--help` prints, `pipeline.config.parser.config_parser`);
- every shell block with the info string `bash runnable` runs (from a copy of the layout in tmp_path, so outputs
  land there) and succeeds; a plain block right after it is what it prints: each of its lines appears in the output,
  seconds aside;
- the README's progress line is the one `pipeline.tracking.runs.Progress` prints today.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FLAG = re.compile(r"(?<![\w-])--([a-z_]+(?:\.[a-z_0-9]+)+)")
JOB_OF_LINE = re.compile(r"jobs/(pretrain|finetune|prepare_data)\.py")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens.

    >>> slug("GPU (BERT-base / BERT-large, bf16, MFU)")
    'gpu-bert-base--bert-large-bf16-mfu'
    """
    text = re.sub(r"`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    seen: dict[str, int] = {}
    out = set()
    for h in re.findall(r"^#{1,6} (.+)$", text, re.M):
        s = slug(h)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def bad_links(path: Path) -> list[str]:
    """Every relative link of a Markdown file that does not resolve: a missing file, or a missing #anchor in a
    Markdown target."""
    bad = []
    text = FENCE.sub("", path.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{path.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{path.name}: {target} (no such heading)")
    return bad


def job_flags(job: str) -> set[str]:
    """The `--section.field` flags of a job, from the parser its `--help` prints."""
    if job == "pretrain":
        from pipeline.config import SECTIONS, config_parser

        ap = config_parser(SECTIONS)
    else:  # finetune, prepare_data
        from conftest import load_job

        ap = load_job(job).parser()
    return {o[2:] for o in ap._option_string_actions if "." in o}


def flag_known(flag: str, known: set[str]) -> bool:
    """A flag is known when the parser has it, or a dict field above it (`--model.overrides.hidden_size`)."""
    parts = flag.split(".")
    return any(".".join(parts[:i]) in known for i in range(2, len(parts) + 1))


def unknown_flags(text: str, flags: dict[str, set[str]]) -> list[str]:
    """Flags in `text` that no job knows; a flag on a line (or a block) naming a job must be that job's."""
    bad = []
    for block in re.split(r"\n\s*\n", text):  # a paragraph or a code block: a job named in it owns its flags
        jobs = set(JOB_OF_LINE.findall(block))
        allowed = set().union(*(flags[j] for j in jobs)) if jobs else set().union(*flags.values())
        for flag in FLAG.findall(block):
            if flag.endswith(".field"):  # the placeholders `--section.field`, `--data.field`
                continue
            if not flag_known(flag, allowed) and not flag_known(flag, set().union(*flags.values())):
                bad.append(flag)
            elif jobs and not flag_known(flag, allowed) and len(jobs) == 1:
                bad.append(f"{flag} (not a flag of jobs/{next(iter(jobs))}.py)")
    return bad


@pytest.fixture(scope="module")
def flags() -> dict[str, set[str]]:
    return {job: job_flags(job) for job in ("pretrain", "finetune", "prepare_data", "evaluate")}


def test_docs_exist_and_readme_is_short():
    assert (ROOT / "README.md").stat().st_size <= 12_000
    linked = set(LINK.findall((ROOT / "README.md").read_text()))
    for guide in DOCS[1:]:
        assert f"docs/{guide.name}" in linked, f"README does not link {guide.name}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(path):
    assert bad_links(path) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_flags_exist_in_the_jobs_help(path, flags):
    assert unknown_flags(path.read_text(), flags) == []


def test_the_checkers_catch_a_bad_link_and_a_bad_flag(tmp_path, flags):
    (tmp_path / "a.md").write_text(
        "# Top\n\n## Good part\n\n[ok](#good-part) [ok2](b.md) [gone](c.md) [x](b.md#nope)\n"
    )
    (tmp_path / "b.md").write_text("# B\n")
    assert bad_links(tmp_path / "a.md") == ["a.md: c.md (no such file)", "a.md: b.md#nope (no such heading)"]
    assert unknown_flags("python jobs/pretrain.py --train.max_steps 3 --model.overrides.hidden_size 8", flags) == []
    assert unknown_flags("python jobs/pretrain.py --train.max_stepz 3", flags) == ["train.max_stepz"]
    assert unknown_flags("python jobs/prepare_data.py --train.max_steps 3", flags) == [
        "train.max_steps (not a flag of jobs/prepare_data.py)"
    ]


def runnable_blocks() -> list[tuple[str, str, str | None]]:
    """(doc, commands, expected output or None) of every `bash runnable` block; the expected output is the plain
    fenced block that follows it, when only prose stands between them."""
    out = []
    for path in DOCS:
        text = path.read_text()
        blocks = list(FENCE.finditer(text))
        for i, m in enumerate(blocks):
            if m.group(1).strip() != "bash runnable":
                continue
            expected = None
            if (
                i + 1 < len(blocks)
                and blocks[i + 1].group(1).strip() == ""
                and "```" not in text[m.end() : blocks[i + 1].start()]
                and len(text[m.end() : blocks[i + 1].start()]) < 300
            ):
                expected = blocks[i + 1].group(2)
            out.append((path.name, m.group(2), expected))
    return out


def masked(line: str) -> str:
    return re.sub(r"\d+(\.\d+)?s\b", "<s>", line.strip())


@pytest.mark.parametrize("doc,commands,expected", runnable_blocks(), ids=lambda v: v if v and v.endswith(".md") else "")
def test_runnable_blocks_run(doc, commands, expected, tmp_path):
    # The repository's layout under tmp_path (links), so relative paths (jobs/, ../shared) work and outputs land here.
    repo = tmp_path / "repo"
    repo.mkdir()
    for child in ROOT.iterdir():
        if child.name not in {"data", "runs", "mlflow.db", ".git"}:
            (repo / child.name).symlink_to(child)
    (tmp_path / "shared").symlink_to((ROOT.parent / "shared").resolve())
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "PIPELINE_LOG_DIR": str(tmp_path / "logs"),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
    }
    printed = ""
    for line in commands.strip().splitlines():
        argv = shlex.split(line, comments=True)
        if not argv:
            continue
        assert argv[0] == "python", f"{doc}: only python commands run here: {line}"
        proc = subprocess.run(
            [sys.executable, *argv[1:]], cwd=repo, env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, f"{doc}: {line}\n{proc.stderr[-2000:]}"
        printed += proc.stdout + proc.stderr
    if "--help" in commands:
        assert "--config" in printed and "--train." in printed or "--data." in printed
    if expected is not None:
        got = {masked(line) for line in printed.splitlines()}
        for line in expected.strip().splitlines():
            assert masked(line) in got, f"{doc}: the docs show {line!r}; the command printed:\n{printed[-3000:]}"


def test_readme_progress_line_is_what_training_prints(monkeypatch):
    """The README's example progress line, rebuilt from its own numbers by the code that prints it."""
    from pipeline.tracking import runs

    readme = (ROOT / "README.md").read_text()
    line = re.search(r"^step \d+/\d+ .*$", readme, re.M).group(0)
    m = re.match(r"step (\d+)/(\d+)  loss ([\d.]+)  mlm_acc ([\d.]+)  ([\d,]+) tok/s  eta (\d+)m(\d+)s$", line)
    assert m, line
    step, total = int(m[1]), int(m[2])
    eta = int(m[6]) * 60 + int(m[7]) + 0.5
    clock = [0.0]
    monkeypatch.setattr(runs.time, "monotonic", lambda: clock[0])
    printed = []
    progress = runs.Progress(total, every_s=0.0, out=None)
    monkeypatch.setattr(runs, "say", lambda text, out=None: printed.append(text))
    progress.update(1, {})
    clock[0] = eta * (step - 1) / (total - step)  # elapsed / done * left = eta
    got = progress.update(
        step,
        {
            "train/loss": float(m[3]),
            "train/mlm_accuracy": float(m[4]),
            "train/tokens_per_s": float(m[5].replace(",", "")),
        },
    )
    assert got == line
    assert re.search(r"^registered models:/bert-pretrain/<version>$", readme, re.M)
    assert "print(f\"registered {results['register'].result['uri']}\"" in (ROOT / "jobs/pretrain.py").read_text()


def test_the_lr_curves_picture_draws_what_the_scheduler_sets():
    """docs/lr-curves.png (`docs/lr_curves.py`) is drawn from each preset's train section through the function the
    run's scheduler calls: its curve is the scheduler's LR at every step, here for a 1-sqrt wsd preset at 40 steps
    and a head-only start."""
    import torch

    from conftest import _load_script
    from pipeline.config import TrainConfig
    from pipeline.core.optim import OptimOptions, make_optimizer

    script = _load_script(ROOT / "docs" / "lr_curves.py", "lr_curves")
    assert {p.stem for p in script.presets()} >= {"tiny", "modernbert-tiny", "base", "large", "modernbert-base"}
    assert (ROOT / "docs" / "lr-curves.png").is_file()
    for tc in (
        TrainConfig(max_steps=40, warmup_fraction=0.05, lr=8e-4, schedule="wsd", decay_shape="1-sqrt"),
        TrainConfig(max_steps=40, warmup_fraction=0.1, lr=1e-3, head_only_steps=5),
    ):
        model = torch.nn.Sequential()
        model.add_module("body", torch.nn.Linear(2, 2))
        opt, sched = make_optimizer(model, OptimOptions.pretraining(tc))  # the schedule the worker builds
        lrs = []
        for _ in range(tc.max_steps + 1):
            lrs.append(sched.get_last_lr()[-1])  # the last group: the encoder's (with head_only_steps, the body's)
            opt.step()
            sched.step()
        assert script.curve(tc) == pytest.approx(lrs, abs=1e-15)
