"""Evaluation suites: every model scored by one pinned protocol (`suite`), its trials run in parallel on the cluster
(`job`, through `pipeline.finetune.trials`), the scorecard stored with the model. Imports `pipeline.finetune`;
`jobs/evaluate.py` and the main job's `scorecard` stage (`jobs/pretrain.py`) call it."""
