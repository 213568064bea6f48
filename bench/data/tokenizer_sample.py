"""The vocab stage on a synthetic multistream Wikipedia dump, per tokenizer kind (issue 57): its time and peak memory
are set by the training sample (`data.tokenizer_sample_bytes`), not by the size of the dump.

    python bench/data/tokenizer_sample.py                                   # 520,000 copies: the ~1 GB two-host dump
    python bench/data/tokenizer_sample.py --copies 10000 40000 --sample-bytes 10000000

Each dump is bench/data/wiki_dump.py's, in two parts as bench/studies/wiki_two_hosts.py builds the gigabyte one
(`--copies` copies of the shared sample's 11 pages: 1,950 B of bz2 a copy). For each (dump, kind) a child process
runs the vocab stage as the job runs it (`pipeline.data.stages.plan` + `run_vocab`: read the sample spread over the
files, train, write vocab.txt and tokenizer.json, the tokenizer report on the text after the sample), cased, at
modernbert-tiny's 8,000 tokens. Printed, one Markdown row each: the stage's seconds, the child's peak RSS (VmHWM,
its own: not the forking parent's), the sample's bound in bytes (the trainer's input), and the report's figures. The
dumps are written under `--work` (a temporary directory, removed at the end).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import REPO  # noqa: E402

_CHILD = """
import json, sys, time
from pipeline.config import DataConfig
from pipeline.data.stages import plan, run_vocab
kind, dump, out, nbytes, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
cfg = DataConfig(inputs=[dump], output=out, tokenizer=kind, vocab_size=size, tokenizer_sample_bytes=nbytes,
                 lowercase=False)
t = time.perf_counter()
run_vocab(plan(cfg))
seconds = time.perf_counter() - t
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
meta = json.load(open(out + "/vocab.meta.json"))
print(json.dumps({"seconds": round(seconds, 1), "peak_mib": hwm // 1024, **meta["report"]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, nargs="+", default=[520_000], help="dump sizes, in copies of 11 pages")
    ap.add_argument("--kinds", nargs="+", default=["wordpiece", "bpe", "unigram"])
    ap.add_argument("--sample-bytes", type=int, default=50_000_000, help="data.tokenizer_sample_bytes (its default)")
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--work", type=Path, default=REPO.parent, help="where the dumps are written (removed after)")
    a = ap.parse_args()
    sys.path.insert(0, str(REPO / "bench" / "studies"))
    sys.path.insert(0, str(REPO / "tests"))
    from wiki_two_hosts import build

    work = Path(tempfile.mkdtemp(prefix="tokenizer_sample-", dir=a.work))
    try:
        print(
            "| dump (bz2) | kind | sample bytes | seconds | peak MiB | fertility | bytes/token | unknown | vocab used |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for copies in a.copies:
            dump = work / f"dump-{copies}"
            dump.mkdir()
            b = build(dump, copies, 2)
            for kind in a.kinds:
                out = work / f"out-{copies}-{kind}"
                args = [kind, str(dump), str(out), str(a.sample_bytes), str(a.vocab_size)]
                res = subprocess.run(
                    [sys.executable, "-c", _CHILD, *args], cwd=REPO, capture_output=True, text=True, check=True
                )
                r = json.loads(res.stdout.strip().splitlines()[-1])
                print(
                    f"| {b['bz2'] / 1e6:,.0f} MB ({b['pages']:,} pages) | {kind} | {a.sample_bytes:,} | "
                    f"{r['seconds']} | {r['peak_mib']} | {r['fertility']} | {r['bytes_per_token']} | "
                    f"{100 * r['unknown_rate']:.2f}% | {100 * r['vocab_used']:.1f}% |",
                    flush=True,
                )
                shutil.rmtree(out)
            shutil.rmtree(dump)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
