"""cluster.yaml: valid for Ray's cluster launcher (its own schema), and wired the way the pipeline needs."""

from __future__ import annotations

import copy

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


def test_head_runs_mlflow_and_nodes_point_at_it(cluster):
    head = " ".join(cluster["head_start_ray_commands"])
    assert "mlflow server" in head and "--port 5000" in head and "--backend-store-uri" in head
    assert "--artifacts-destination" in head and "--serve-artifacts" in head
    assert "MLFLOW_TRACKING_URI=http://" in head and "ray start --head" in head
    workers = " ".join(cluster["worker_start_ray_commands"])
    assert "MLFLOW_TRACKING_URI=http://$RAY_HEAD_IP:5000" in workers
    setup = " ".join(cluster["setup_commands"])
    assert "pip install" in setup and "-e ." in setup
    gpu = cluster["available_node_types"]["gpu_worker"]
    assert gpu["max_workers"] >= 1 and cluster["head_node_type"] == "head"


def test_shared_storage_matches_the_gpu_configs(cluster, repo_root):
    from pipeline.config import load_config

    mounts = " ".join(cluster["initialization_commands"])
    for name in ("base", "large"):
        cfg = load_config(repo_root / "configs" / f"{name}.yaml")
        assert cfg.train.storage_path.startswith("/mnt/shared") and "/mnt/shared" in mounts
        assert all(p.output.startswith("/mnt/shared") for p in cfg.train.phases)
