"""Regenerate the README's pictures from a real run: `python docs/screenshots.py` (about 5 minutes on 2 cores).

Runs the main job (`jobs/pretrain.py --config configs/tiny.yaml`, on a few books of ../shared/corpora, `--steps`
steps) against a throw-away `mlflow server` on loopback, then opens the MLflow UI in Debian's Chromium (playwright,
never a downloaded browser) and saves, in this folder:

    ui-runs.png       the experiment's runs in MLflow's model-training view
    ui-datasets.png   the run's overview: its Datasets panel (the prepared data, its held-out shard), parameters
    ui-metrics.png    the run's model metrics as the page opens: the eval/loss curve first
    ui-version.png    the registered version: alias, description, lineage tags
    loss-curve.png    train/loss and eval/loss against the step (matplotlib, from the run's metric history)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
BOOKS = ("08_Ruth.txt", "32_Jonah.txt", "31_Obad.txt", "41_Mark.txt", "57_Phmn.txt")


def start_server(work: Path) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{work / 'mlflow.db'}",
            "--artifacts-destination",
            str(work / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        # no GenAI job consumers, whose job stores outlive the server in /dev/shm
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    uri = f"http://127.0.0.1:{port}"
    for _ in range(480):
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2):
                return proc, uri
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("mlflow server did not start")


def run_job(uri: str, work: Path, steps: int) -> None:
    books = [str(REPO.parent / "shared" / "corpora" / "books" / b) for b in BOOKS]
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    env.pop("RAY_ADDRESS", None)
    cmd = [
        sys.executable,
        "jobs/pretrain.py",
        "--config",
        "configs/tiny.yaml",
        "--data.inputs",
        json.dumps(books),
        "--data.output",
        str(work / "data"),
        "--data.vocab_size",
        "2000",
        "--train.storage_path",
        str(work / "runs"),
        "--train.max_steps",
        str(steps),
        "--train.eval_every_steps",
        str(max(1, steps // 6)),
        "--train.checkpoint_every_steps",
        str(steps),
        "--tracking.system_metrics_every_s",
        "2",
    ]
    subprocess.run(cmd, cwd=REPO, env=env, check=True)


def loss_curve(uri: str, run_id: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mlflow import MlflowClient

    c = MlflowClient(uri)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for key in ("train/loss", "eval/loss"):
        hist = sorted((m.step, m.value) for m in c.get_metric_history(run_id, key))
        ax.plot([s for s, _ in hist], [v for _, v in hist], marker="o" if key.startswith("eval") else None, label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (MLM + NSP)")
    ax.set_title("configs/tiny.yaml on a few books of ../shared/corpora")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)


def screenshots(uri: str, exp_id: str, run_id: str, version: str, digest: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})

        def close_assistant() -> None:
            button = page.get_by_role("button", name="Close")
            if button.count():
                button.first.click()

        page.goto(f"{uri}/#/experiments/{exp_id}/runs?workflowType=machine_learning")
        page.get_by_text("tiny-", exact=False).first.wait_for(timeout=60_000)
        close_assistant()
        page.wait_for_timeout(2000)
        page.screenshot(path=str(out / "ui-runs.png"))

        page.goto(f"{uri}/#/experiments/{exp_id}/runs/{run_id}?workflowType=machine_learning")
        page.get_by_text(f"({digest[:36]})").first.wait_for(timeout=60_000)  # the Datasets panel: "<name> (<digest>)"
        close_assistant()
        page.get_by_text("+1", exact=True).first.click()  # the held-out shard's entry, behind a "+1"
        page.get_by_text("-heldout (").first.wait_for(timeout=30_000)
        page.wait_for_timeout(2000)
        page.screenshot(path=str(out / "ui-datasets.png"))

        # as a person first sees it: sections eval/, eval/final/, train/ (by name), charts by name in each
        page.goto(f"{uri}/#/experiments/{exp_id}/runs/{run_id}/model-metrics?workflowType=machine_learning")
        page.get_by_text("(eval/loss)").first.wait_for(timeout=60_000)  # the first chart's legend
        close_assistant()
        page.mouse.move(0, 0)  # no hover toolbar on a chart
        page.wait_for_timeout(3000)
        page.screenshot(path=str(out / "ui-metrics.png"))

        page.goto(f"{uri}/#/models/bert-pretrain/versions/{version}?workflowType=machine_learning")
        page.get_by_text("latest-pretrain").first.wait_for(timeout=60_000)
        close_assistant()
        page.wait_for_timeout(2000)
        page.screenshot(path=str(out / "ui-version.png"), full_page=True)
        browser.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=120, help="training steps of the job the pictures show")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bert-docs-"))
    proc, uri = start_server(work)
    try:
        run_job(uri, work, args.steps)
        from mlflow import MlflowClient

        c = MlflowClient(uri)
        mv = c.get_model_version_by_alias("bert-pretrain", "latest-pretrain")
        exp = c.get_experiment_by_name("bert-pretrain")
        args.out.mkdir(parents=True, exist_ok=True)
        loss_curve(uri, mv.run_id, args.out / "loss-curve.png")
        screenshots(uri, exp.experiment_id, mv.run_id, mv.version, mv.tags["data_manifest_sha256"], args.out)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {', '.join(sorted(p.name for p in args.out.glob('*.png')))} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
