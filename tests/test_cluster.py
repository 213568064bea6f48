"""cluster.yaml: valid for Ray's cluster launcher (its own schema), and wired the way the pipeline needs."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path

import pytest
import yaml


@pytest.fixture(scope="module")
def cluster(repo_root):
    return yaml.safe_load((repo_root / "cluster.yaml").read_text())


def test_cluster_yaml_passes_ray_schema_validation(cluster):
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(cluster)))


def test_schema_validation_really_rejects_a_broken_config(cluster):
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    broken = copy.deepcopy(cluster)
    broken["available_node_types"]["gpu_worker"]["min_workers"] = "one"
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(broken))


def test_head_runs_mlflow_and_nodes_point_at_it(cluster, repo_root):
    head = " ".join(cluster["head_start_ray_commands"])
    assert "deploy/mlflow_head.sh start" in head and "MLFLOW_ARTIFACTS_DESTINATION=s3://" in head
    assert "MLFLOW_TRACKING_URI=http://" in head and ":5000" in head and "ray start --head" in head
    script = (repo_root / "deploy" / "mlflow_head.sh").read_text()
    for flag in (
        "mlflow server --app-name basic-auth",
        '--port "$port"',
        '--backend-store-uri "postgresql+psycopg2://',
        '--artifacts-destination "$MLFLOW_ARTIFACTS_DESTINATION" --serve-artifacts',
    ):
        assert flag in script, flag
    workers = " ".join(cluster["worker_start_ray_commands"])
    assert "MLFLOW_TRACKING_URI=http://$RAY_HEAD_IP:5000" in workers
    setup = " ".join(cluster["setup_commands"])
    assert "pip install" in setup and '-e ".[s3]"' in setup  # s3fs on every node: any node may read s3://
    head_setup = " ".join(cluster["head_setup_commands"])
    assert "mlflow_head.sh install" in head_setup and "sudo -u postgres bash -s -- init-db" in head_setup
    gpu = cluster["available_node_types"]["gpu_worker"]
    assert gpu["max_workers"] >= 1 and cluster["head_node_type"] == "head"


def _all_commands(cluster) -> str:
    keys = (
        "initialization_commands",
        "setup_commands",
        "head_setup_commands",
        "worker_setup_commands",
        "head_start_ray_commands",
        "worker_start_ray_commands",
    )
    return "\n".join(c for k in keys for c in cluster.get(k) or [])


def test_nothing_listens_on_every_interface_and_ray_keeps_token_auth(cluster, repo_root):
    cmds = _all_commands(cluster)
    assert "0.0.0.0" not in cmds
    assert "RAY_AUTH_MODE=disabled" not in cmds and "auth_mode" not in cmds.lower().replace("ray_auth_mode=token", "")
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = [c for c in cluster[key] if "ray start" in c]
        assert start and all("RAY_AUTH_MODE=token" in c for c in start), key
    head = " ".join(cluster["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head
    # PostgreSQL gets no TCP listener; MLflow binds the private IP (MLFLOW_HOST default), never all interfaces.
    script = repo_root / "deploy" / "mlflow_head.sh"
    assert "listen_addresses = ''" in script.read_text() and "hostname -I" in script.read_text()
    env = {
        **os.environ,
        "MLFLOW_HOST": "0.0.0.0",
        "MLFLOW_ARTIFACTS_DESTINATION": "/nonexistent",
        "MLFLOW_TRACKING_USERNAME": "u",
        "MLFLOW_TRACKING_PASSWORD": "p",
        "MLFLOW_SERVER_DIR": "/nonexistent",
    }
    out = subprocess.run(["bash", str(script), "start"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "not 0.0.0.0" in out.stderr and not os.path.exists("/nonexistent")


def test_security_group_opens_only_ssh_and_intra_cluster_traffic(cluster):
    import importlib.util

    sg = cluster["provider"]["security_group"]
    assert sg["GroupName"] and sg["IpPermissions"] == []  # nothing beyond Ray's defaults
    assert not any("SecurityGroupIds" in t["node_config"] for t in cluster["available_node_types"].values())
    # Ray's defaults for a group it creates (read, not imported: that module needs boto3): all traffic from the
    # group itself, SSH (22/tcp) from anywhere, then the extra rules (none here).
    src = Path(importlib.util.find_spec("ray.autoscaler").origin).parent / "_private" / "aws" / "config.py"
    text = src.read_text()
    assert "intracluster_rules,\n        ssh_rules,\n        extended_rules," in text
    assert '"FromPort": 22,\n            "ToPort": 22,' in text and text.count('"CidrIp": "0.0.0.0/0"') == 1


def test_secrets_come_from_the_users_machine_not_the_repository(cluster, repo_root):
    mounts = cluster["file_mounts"]
    assert mounts["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert mounts["~/.bert-pipeline/mlflow.env"] == "~/.bert-pipeline/mlflow.env"
    for local in mounts.values():
        assert local == "." or local.startswith("~/"), local  # secrets live outside the synced repository
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = [c for c in cluster[key] if "ray start" in c]
        assert all(". ~/.bert-pipeline/mlflow.env" in c for c in start)  # MLFLOW_TRACKING_USERNAME/PASSWORD
    text = (repo_root / "cluster.yaml").read_text()
    assert "MLFLOW_TRACKING_PASSWORD=<" in text and "MLFLOW_AUTH_ADMIN_PASSWORD=" not in text


def test_shared_storage_matches_the_gpu_configs(cluster, repo_root):
    from pipeline.config import load_config

    mounts = " ".join(cluster["initialization_commands"])
    for name in ("base", "large"):
        cfg = load_config(repo_root / "configs" / f"{name}.yaml")
        assert cfg.train.storage_path.startswith("/mnt/shared") and "/mnt/shared" in mounts
        assert all(p.output.startswith("/mnt/shared") for p in cfg.train.phases)
