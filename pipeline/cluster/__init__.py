"""The Ray cluster: connecting to it or starting a private local one (`connect`), and Ray Train's launch and what a
worker asks of it (`train`). Code that runs on the cluster imports the package (`from pipeline import cluster`)
and calls the names below.
"""

from pipeline.cluster.connect import (
    RayStartError,
    check_local_gpu,
    check_resources,
    connect,
    disconnect,
    environ,
    free_port,
    quiet_ray_data,
    quiet_ray_train,
    read_parquet,
    session_log_dir,
)
from pipeline.cluster.train import (
    Scale,
    checkpoint_dir,
    checkpoint_uri,
    checkpoints,
    fit,
    num_nodes,
    prepare_model,
    report,
    resume_checkpoint,
    uploads_in_background,
    worker,
)

__all__ = [
    "RayStartError",
    "Scale",
    "check_local_gpu",
    "check_resources",
    "checkpoint_dir",
    "checkpoint_uri",
    "checkpoints",
    "connect",
    "disconnect",
    "environ",
    "fit",
    "free_port",
    "num_nodes",
    "prepare_model",
    "quiet_ray_data",
    "quiet_ray_train",
    "read_parquet",
    "report",
    "resume_checkpoint",
    "session_log_dir",
    "uploads_in_background",
    "worker",
]
