"""Per-document memory: one ~100 MB document (a .txt book is one document) through `jobs/prepare_data.py`.

    python bench/data/big_document_memory.py                      # 100 MB, bert-base-uncased vocab, 2 CPUs, dedup near
    python bench/data/big_document_memory.py --dedup off          # the same without the dedup pass
    python bench/data/big_document_memory.py --mb 50 --keep /tmp/bigdoc

The document is ../shared/corpora/books/*.txt joined by blank lines and repeated `reps` times. The job runs in a
child process (its own local Ray); every 0.2 s the RSS of the child and of every process it started is read
with psutil. Printed: the largest single process ever seen (the goal: <= 1.5 GiB), the largest sum over the tree,
the wall time, the tree's CPU-seconds (less sensitive than the wall to a loaded machine), and the token check:
the tokens the tokenize pass wrote (manifest `source_tokens`) against `reps` x the tokens of one repetition
encoded here, sentence by sentence, in one piece (equal when every piece cut fell between sentences, i.e. all of
the text reached the token chunks). `--dedup` is the job's data.dedup (near by default, as the job's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from measure import GIB, REPO, SHARED, minilm_vocab, run_sampled  # noqa: E402


def build_document(path: Path, mb: float) -> tuple[str, int]:
    """Write the books, each ending in a blank line, repeated up to `mb` MB; returns (one repetition, reps). Under
    one repetition (4.1 MB), its first paragraphs up to `mb` MB."""
    unit = "".join(
        p.read_text(encoding="utf-8").rstrip("\n") + "\n\n" for p in sorted((SHARED / "corpora/books").glob("*.txt"))
    )
    if mb * 1e6 < len(unit.encode("utf-8")):
        unit = unit[: unit.rindex("\n\n", 0, max(2, int(mb * 1e6))) + 2]
    reps = max(1, round(mb * 1e6 / len(unit.encode("utf-8"))))
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(reps):
            f.write(unit)
    return unit, reps


def unit_tokens(unit: str, vocab: Path) -> int:
    sys.path.insert(0, str(REPO))
    from pipeline.data.examples import split_sentences
    from pipeline.data.tokenizer import load_tokenizer

    tok = load_tokenizer(vocab)
    return sum(len(e.ids) for e in tok.encode_batch_fast(split_sentences(unit), add_special_tokens=False))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=100.0, help="size of the one document in MB")
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument(
        "--dedup",
        choices=["near", "exact", "off"],
        default="near",
        help="data.dedup (near, the default, signs every document in the dedup pass first)",
    )
    ap.add_argument("--keep", default=None, help="work directory to keep (default: a temporary one, removed)")
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more prepare_data arguments")
    args = ap.parse_args()

    tmp = Path(args.keep or tempfile.mkdtemp(prefix="bigdoc-"))
    tmp.mkdir(parents=True, exist_ok=True)
    doc, out, vocab = tmp / "book.txt", tmp / "out", minilm_vocab()
    shutil.rmtree(out, ignore_errors=True)
    unit, reps = build_document(doc, args.mb)
    expected = reps * unit_tokens(unit, vocab)
    cmd = [
        sys.executable,
        str(REPO / "jobs/prepare_data.py"),
        "--input",
        str(doc),
        "--output",
        str(out),
        "--vocab",
        str(vocab),
        "--num-cpus",
        str(args.num_cpus),
        "--data.dedup",
        args.dedup,
        *args.extra,
    ]
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    print(f"document: {doc} ({doc.stat().st_size / 1e6:.1f} MB, {reps} x {len(unit) / 1e6:.2f}M chars)", flush=True)
    print("command:", " ".join(cmd), flush=True)
    run = run_sampled(cmd, env)
    sampler = run.sampler
    if run.returncode != 0:
        print(run.log[-4000:])
        return 1
    m = json.loads((out / "manifest.json").read_text())
    rows = [
        (
            "document",
            f"{doc.stat().st_size / 1e6:.1f} MB, 1 document, {m['document_pieces']} pieces, dedup {args.dedup}",
        ),
        ("largest process, peak RSS", f"{sampler.peak_one / GIB:.2f} GiB ({sampler.peak_name})"),
        ("process tree, peak RSS sum", f"{sampler.peak_sum / GIB:.2f} GiB"),
        ("wall", f"{run.wall:.1f} s"),
        ("CPU-seconds, process tree", f"{sampler.cpu_seconds:.1f}"),
        (
            "tokens written by the tokenize pass",
            f"{m['source_tokens']} (expected {expected}: {'equal' if m['source_tokens'] == expected else 'DIFFERENT'})",
        ),
        ("examples / tokens in shards", f"{m['examples']} / {m['tokens']}"),
        ("goal: largest process <= 1.5 GiB", "met" if sampler.peak_one <= 1.5 * GIB else "NOT met"),
    ]
    w = max(len(k) for k, _ in rows)
    print("\n".join(f"{k.ljust(w)}  {v}" for k, v in rows))
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
