"""What a person sees in the MLflow UI after a real (short) pretraining job, checked in a real browser: Debian's
Chromium driven by playwright (never a downloaded browser), against a real `mlflow server` on loopback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


@pytest.fixture()
def registered(mlflow_server, repo_root, shared_dir, tmp_path):
    """A 6-step main job against the server; returns (server URI, version info, experiment id, the job's stdout)."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow_server}
    env.pop("RAY_ADDRESS", None)
    books = [str(shared_dir / "corpora/books" / b) for b in ("08_Ruth.txt", "32_Jonah.txt", "31_Obad.txt")]
    out = subprocess.run(
        [sys.executable, "jobs/pretrain.py", "--config", "configs/tiny.yaml", "--data.inputs", repr(books).replace("'", '"'),
         "--data.output", str(tmp_path / "data"), "--data.vocab_size", "600", "--data.num_shards", "4",
         "--train.storage_path", str(tmp_path / "runs"), "--train.max_steps", "6", "--train.micro_batch_size", "8",
         "--train.global_batch_size", "16", "--train.eval_every_steps", "3", "--train.checkpoint_every_steps", "3"],
        cwd=repo_root, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    os.environ["MLFLOW_TRACKING_URI"] = mlflow_server
    try:
        from pipeline import tracking

        info = tracking.model_version_info("models:/bert-pretrain@latest-pretrain")
        exp = tracking.client().get_experiment_by_name("bert-pretrain")
    finally:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    return mlflow_server, info, exp, out.stdout


@pytest.fixture()
def page():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        yield pg
        browser.close()


def test_run_charts_and_registered_version_in_the_browser(registered, page, tmp_path):
    uri, info, exp, stdout = registered
    assert exp.tags.get("mlflow.experimentKind") == "custom_model_development"  # opens on the training view
    run_id = info["run_id"]

    page.goto(f"{uri}/#/experiments/{exp.experiment_id}/runs/{run_id}/model-metrics")
    # Metric names grouped by prefix: the UI makes a section of each ("train (N)", "eval (N)", "system (N)").
    page.get_by_text("eval", exact=True).first.wait_for(timeout=60_000)
    assert page.get_by_text("train", exact=True).count() >= 1
    page.get_by_placeholder("Search metric charts").fill("train/loss")
    page.get_by_text("(train/loss)").first.wait_for(timeout=30_000)  # the chart's legend: run name (metric)
    page.screenshot(path=str(tmp_path / "run.png"))

    page.goto(f"{uri}/#/models/bert-pretrain/versions/{info['version']}")
    page.get_by_text("latest-pretrain").first.wait_for(timeout=60_000)
    text = page.inner_text("body")
    for tag in ("data_manifest_sha256", "vocab_sha256", "config_hash", "git_sha", "run_id"):
        assert tag in text, tag
    assert info["tags"]["run_id"] in text
    assert "BERT pretrained for 6 steps" in text and "jobs/pretrain.py" in text and "from_pretrained" in text
    page.screenshot(path=str(tmp_path / "version.png"))
