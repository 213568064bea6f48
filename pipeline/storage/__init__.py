"""Storage: every read and write of a path or URI (`io`: fsspec paths, atomic writes, text/JSON/Parquet reads, the
output writer lock, checkpoint copies) and the check of every URI a job will touch before any work (`preflight`).
"""
