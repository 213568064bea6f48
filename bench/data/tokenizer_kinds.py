"""WordPiece, byte-level BPE and Unigram side by side on the shared corpora (issue 57): training time, peak memory,
and the tokenizer report (pipeline.data.tokenizer.tokenizer_report) on held-out documents.

    python bench/data/tokenizer_kinds.py                       # all three, 8,000 tokens (modernbert-tiny's size)
    python bench/data/tokenizer_kinds.py --kinds bpe --vocab-size 30522 --lowercase

The documents of ../shared/corpora (books: one document a book; wiki: one a page), in file order; every tenth is
held out and the tokenizer is trained on the rest with `train_tokenizer`, each kind in its own child process so
that its peak RSS (ru_maxrss) is its own. Printed: one Markdown row per kind.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"

_CHILD = """
import json, resource, sys, time
from pipeline.data.sources import Document, expand_inputs, read_documents
from pipeline.data.tokenizer import tokenizer_report, train_tokenizer
kind, size, lower, inputs = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
files, _ = expand_inputs([inputs])
docs = [d.text for f in files for d in read_documents(f, "text") if isinstance(d, Document)]
train, held = [d for i, d in enumerate(docs) if i % 10], [d for i, d in enumerate(docs) if not i % 10]
t = time.perf_counter()
tok = train_tokenizer(train, kind, size, lower)
seconds = time.perf_counter() - t
r = tokenizer_report(tok, held)
print(json.dumps({"kind": kind, "seconds": round(seconds, 1), "peak_mib":
resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                  "train_chars": sum(map(len, train)), "vocab": tok.get_vocab_size(), **r}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", nargs="+", default=["wordpiece", "bpe", "unigram"])
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--lowercase", action="store_true")
    ap.add_argument("--corpora", default=str(SHARED / "corpora"))
    a = ap.parse_args()
    print("| kind | vocab | train chars | seconds | peak MiB | fertility | bytes/token | unknown | vocab used |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in a.kinds:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, kind, str(a.vocab_size), "1" if a.lowercase else "0", a.corpora],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"| {kind} | {r['vocab']} | {r['train_chars']:,} | {r['seconds']} | {r['peak_mib']} | {r['fertility']} | "
            f"{r['bytes_per_token']} | {100 * r['unknown_rate']:.3f}% | {100 * r['vocab_used']:.1f}% |",
            flush=True,
        )


if __name__ == "__main__":
    main()
