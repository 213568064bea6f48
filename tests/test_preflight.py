"""S3 mistakes in one line, against a real S3 API (`moto_server`, tests/conftest.py `s3_server`).

Each finding of issue 26 is a test here: a missing s3fs, a misspelt output bucket (refused, never created), a wrong
endpoint, no credentials, a missing storage-path bucket (before Ray), missing input and config objects, fine-tuning's
task files, `--vocab` and `--config` read from s3://, and the `[io] no lock` notice printed once. The jobs run in
this process (their preflight fails before Ray starts) except where a clean interpreter is the point.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import load_job
from pipeline.storage.io import StorageError, read_text, write_bytes_atomic
from pipeline.storage.preflight import check_storage
from pipeline.tracking.server import artifact_root

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"


def _job_main(name: str):
    """`main` of jobs/<name>.py, run in this process (jobs/ is scripts, not a package)."""
    return load_job(name).main


def _prepare(*args: str) -> int:
    return _job_main("prepare_data")([str(a) for a in args])


def _pretrain(*args: str) -> int:
    return _job_main("pretrain")([str(a) for a in args])


def _one_line(capsys, job: str, expect: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(f"{job}: error: ") and expect in err[0], err[0]
    return err[0]


@pytest.fixture()
def corpus(s3_env):
    """A bucket holding one small text file (prepared in this process, without Ray) and its URI."""
    bucket = s3_env.bucket("corp")
    text = (REPO.parent / "shared" / "corpora" / "books" / "08_Ruth.txt").read_bytes()
    s3_env.client().put_object(Bucket=bucket, Key="in/ruth.txt", Body=text)
    return bucket


def test_misspelt_output_bucket_is_refused_not_created(corpus, s3_env, capsys):
    before = s3_env.buckets()
    rc = _prepare("--input", f"s3://{corpus}/in", "--output", f"s3://{corpus}x/prep", "--vocab-size", "200")
    assert rc == 1
    _one_line(capsys, "prepare_data", f"data.output s3://{corpus}x/prep: bucket {corpus}x does not exist")
    assert s3_env.buckets() == before


def test_a_write_never_creates_a_bucket(s3_env):
    """Below the preflight too: pipeline.storage.io's writes do not mkdir on object stores (s3fs's would make the
    bucket)."""
    before = s3_env.buckets()
    from pipeline.storage.io import StorageError

    with pytest.raises(StorageError, match="bucket does not exist writing s3://no-such-bucket-here/prep/vocab.txt$"):
        write_bytes_atomic("s3://no-such-bucket-here/prep/vocab.txt", b"[PAD]\n")
    assert s3_env.buckets() == before
    bucket = s3_env.bucket()
    write_bytes_atomic(f"s3://{bucket}/a/b/x.json", b"{}")  # no directories needed on a bucket that exists
    assert read_text(f"s3://{bucket}/a/b/x.json") == "{}"


def test_missing_input_bucket_and_object(corpus, s3_env, capsys):
    assert (
        _prepare("--input", f"s3://{corpus}-missing/in", "--output", f"s3://{corpus}/prep", "--vocab-size", "200") == 1
    )
    _one_line(capsys, "prepare_data", f"data.inputs s3://{corpus}-missing/in: bucket {corpus}-missing does not exist")
    assert _prepare("--input", f"s3://{corpus}/nothing", "--output", f"s3://{corpus}/prep", "--vocab-size", "200") == 1
    _one_line(capsys, "prepare_data", f"data.inputs s3://{corpus}/nothing: does not exist")


def test_wrong_endpoint_is_one_line(corpus, monkeypatch, capsys):
    from conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    assert _prepare("--input", f"s3://{corpus}/in", "--output", f"s3://{corpus}/prep", "--vocab-size", "200") == 1
    _one_line(capsys, "prepare_data", f"data.inputs s3://{corpus}/in: the S3 endpoint {dead} does not answer")


def test_no_credentials_is_one_line(corpus, monkeypatch, capsys):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert _prepare("--input", f"s3://{corpus}/in", "--output", f"s3://{corpus}/prep", "--vocab-size", "200") == 1
    _one_line(capsys, "prepare_data", f"data.inputs s3://{corpus}/in: no S3 credentials")


def test_missing_storage_path_bucket_before_ray(corpus, s3_env, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    rc = _pretrain(
        "--config",
        REPO / "configs" / "tiny.yaml",
        "--data.inputs",
        f"s3://{corpus}/in",
        "--data.output",
        f"s3://{corpus}/prep",
        "--train.storage_path",
        f"s3://{corpus}-runs/ckpt",
    )
    assert rc == 1
    _one_line(capsys, "pretrain", f"train.storage_path s3://{corpus}-runs/ckpt: bucket {corpus}-runs does not exist")
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    assert not (tmp_path / "mlflow.db").exists(), "the storage check comes before the tracking store"


def test_config_from_s3(corpus, s3_env, capsys):
    """--config is read through fsspec: a config in the bucket works, a missing one is one line."""
    s3_env.client().put_object(
        Bucket=corpus,
        Key="cfg/prep.yaml",
        Body=f"data:\n  inputs: [s3://{corpus}/in]\n  output: s3://{corpus}x/prep\n".encode(),
    )
    assert _prepare("--config", f"s3://{corpus}/cfg/prep.yaml", "--vocab-size", "200") == 1
    _one_line(capsys, "prepare_data", f"s3://{corpus}x/prep: bucket {corpus}x does not exist")  # the file was read
    assert _prepare("--config", f"s3://{corpus}/cfg/nope.yaml", "--vocab-size", "200") == 1
    _one_line(capsys, "prepare_data", f"--config s3://{corpus}/cfg/nope.yaml: does not exist")


def test_prepare_s3_to_s3_with_an_s3_vocab_and_one_lock_notice(corpus, s3_env, minilm_dir, capsys):
    """s3:// in, s3:// out, `--vocab` from the bucket; the `[io] no lock` notice once, not once per stage."""
    s3_env.client().put_object(Bucket=corpus, Key="vocab/vocab.txt", Body=(minilm_dir / "vocab.txt").read_bytes())
    out = f"s3://{corpus}/prep"
    assert (
        _prepare(
            "--input",
            f"s3://{corpus}/in",
            "--output",
            out,
            "--vocab",
            f"s3://{corpus}/vocab/vocab.txt",
            "--max-seq-length",
            "64",
        )
        == 0
    )
    err = capsys.readouterr().err
    assert err.count(f"[io] no lock on {out}") == 1, err
    assert read_text(f"{out}/vocab.txt") == (minilm_dir / "vocab.txt").read_text()
    from pipeline.data.dataset import PreparedDataset

    assert PreparedDataset.load(out).examples > 0


def test_s3fs_missing_is_one_line_naming_the_extra(corpus, s3_env, tmp_path):
    """A fresh interpreter where `import s3fs` fails, as on a node installed without the s3 extra."""
    code = (
        "import sys, runpy; sys.modules['s3fs'] = None; "  # None in sys.modules: the import raises ImportError
        f"sys.argv = ['prepare_data.py'] + sys.argv[1:]; runpy.run_path({str(REPO / 'jobs' / 'prepare_data.py')!r}, "
        "run_name='__main__')"
    )
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "--input",
            f"s3://{corpus}/in",
            "--output",
            f"s3://{corpus}/p",
            "--vocab-size",
            "200",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, **s3_env.env},
    )
    assert p.returncode == 1, p.stderr[-3000:]
    [line] = p.stderr.strip().splitlines()
    assert line.startswith(
        f"prepare_data: error: data.inputs s3://{corpus}/in: s3:// needs s3fs, which is not "
        f'installed: pip install -e ".[s3]" (log: '
    ), line


def test_finetune_task_files_from_s3(s3_env, minilm_dir):
    """The task readers take s3:// like local paths: the same examples, labels and tokens."""
    from pipeline.finetune.data import prepare_task

    bucket = s3_env.bucket("task")
    c = s3_env.client()
    for name in ("bible_ner_train.conll", "bible_ner_dev.conll"):
        c.put_object(Bucket=bucket, Key=f"ner/{name}", Body=(DATA / name).read_bytes())
    local = prepare_task(
        "token-classification",
        DATA / "bible_ner_train.conll",
        DATA / "bible_ner_dev.conll",
        minilm_dir,
        max_seq_length=64,
        max_train_examples=50,
        max_eval_examples=20,
    )
    remote = prepare_task(
        "token-classification",
        f"s3://{bucket}/ner/bible_ner_train.conll",
        f"s3://{bucket}/ner/bible_ner_dev.conll",
        minilm_dir,
        max_seq_length=64,
        max_train_examples=50,
        max_eval_examples=20,
    )
    assert remote.train == local.train and remote.eval == local.eval and remote.id2label == local.id2label
    assert len(remote.train["input_ids"]) == 50


def test_finetune_cli_reads_s3_task_files(s3_env, minilm_dir, tmp_path, monkeypatch, capsys):
    """jobs/finetune.py: an s3:// task file is read and checked (here: a bad label, found before Ray starts);
    a missing one is one line naming it."""
    bucket = s3_env.bucket("task")
    c = s3_env.client()
    c.put_object(Bucket=bucket, Key="t/train.tsv", Body=b"sentence\tlabel\nNaomi wept\ta\nRuth clave\tb\n")
    c.put_object(Bucket=bucket, Key="t/dev.tsv", Body=b"sentence\tlabel\nBoaz\tc\n")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    main = _job_main("finetune")

    def job(train: str) -> list[str]:
        rc = main(
            [
                "--model",
                str(minilm_dir),
                "--task",
                "sequence-classification",
                "--train",
                train,
                "--eval",
                f"s3://{bucket}/t/dev.tsv",
                "--train.storage_path",
                f"s3://{bucket}/runs",
            ]
        )
        err = capsys.readouterr().err
        assert rc == 1 and "Traceback" not in err, err
        return err.strip().splitlines()

    assert job(f"s3://{bucket}/t/train.tsv")[-1].startswith(
        f"finetune: error: s3://{bucket}/t/dev.tsv: row 2: unknown label 'c'"
    )
    missing = job(f"s3://{bucket}/t/nope.tsv")
    assert len(missing) == 1 and missing[0].startswith(
        f"finetune: error: --train s3://{bucket}/t/nope.tsv: does not exist (log: "
    )
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


@pytest.mark.slow
def test_artifact_root_of_an_existing_experiment_is_checked(s3_env, mlflow_server, tmp_path):
    """A tracking server's artifact location for the job's experiment is checked where the client writes there
    itself (an s3:// location, not the server's mlflow-artifacts:/ proxy). Slow only for the server's start."""
    from mlflow import MlflowClient

    uri = mlflow_server
    MlflowClient(uri).create_experiment("exp", artifact_location="s3://art-missing-bucket/mlflow")
    MlflowClient(uri).create_experiment("proxied")
    assert artifact_root(uri, "proxied") is None  # mlflow-artifacts:/...: the server writes, with its credentials
    assert artifact_root(f"sqlite:///{tmp_path / 'm.db'}", "exp") is None and not (tmp_path / "m.db").exists()
    root = artifact_root(uri, "exp")
    assert root == "s3://art-missing-bucket/mlflow"
    with pytest.raises(
        StorageError,
        match="^MLflow artifact root s3://art-missing-bucket/mlflow: bucket art-missing-bucket does not exist",
    ):
        check_storage([("MLflow artifact root", root, "write")])
    assert artifact_root(uri, "no-such-experiment") is None


def test_local_paths_and_other_schemes(tmp_path):
    """Local paths are left to the jobs' own checks; an uninstalled or unknown scheme is one line."""
    check_storage([("data.inputs", str(tmp_path / "nope"), "read"), ("data.output", None, "write")])
    with pytest.raises(StorageError, match=r"^x gs://b/k: Please install gcsfs"):
        check_storage([("x", "gs://b/k", "read")])
    with pytest.raises(StorageError, match=r"^x nosuch://b/k: unknown storage scheme nosuch://$"):
        check_storage([("x", "nosuch://b/k", "read")])


def test_preflight_command(corpus, s3_env, capsys):
    """`python -m pipeline.storage.preflight`: the same check on its own, before a long run."""
    from pipeline.storage.preflight import main

    assert main(["--read", f"s3://{corpus}/in", "--write", f"s3://{corpus}/prep"]) == 0
    assert capsys.readouterr().out == "this machine: ok\n"
    assert main(["--read", f"s3://{corpus}/in", "--write", f"s3://{corpus}-typo/prep"]) == 1
    assert capsys.readouterr().err == (
        f"this machine: --write s3://{corpus}-typo/prep: bucket {corpus}-typo does not "
        f"exist (endpoint {s3_env.endpoint}); create it first, this job never does\n"
    )


@pytest.mark.slow
def test_preflight_on_every_node_uses_the_nodes_environment(corpus, s3_env, ray_local, capsys):
    """--every-node checks from each Ray node with that node's environment: this test's Ray was started before the
    test pointed its own process at the S3 server, so the node cannot reach the bucket the driver reaches.
    Adds about 10 s (a local Ray start)."""
    from pipeline.storage.preflight import main

    assert main(["--read", f"s3://{corpus}/in", "--every-node"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    node = ray_local.nodes()[0]["NodeManagerAddress"]
    assert len(err) == 1 and err[0].startswith(f"{node}: --read s3://{corpus}/in: "), err
