"""Capacity on paper (issue 18): data-preparation hours and pretraining GPU-hours from the measured rates.

Hours to prepare English Wikipedia + BooksCorpus on nodes of 32 cores, and GPU-hours to pretrain BERT-base and
BERT-large on the BERT paper's schedule and on NVIDIA's LAMB schedule, from the rates measured in bench/RESULTS.md,
beside NVIDIA's and MLPerf's published figures. Arithmetic only: nothing is measured here. Every rate is an option
whose default is the measured (or published) figure, and its help names the RESULTS.md section it comes from, so
the tables can be printed again when a rate improves:

    python bench/cost/capacity.py                    # the tables in RESULTS.md, "Capacity on paper (issue 18)"
    python bench/cost/capacity.py --large-128 180000 --large-512 190000   # after a faster BERT-large step is measured

Conversions: words -> tokens by a tokens/word ratio measured per source on the shared corpora (MiniLM's vocabulary,
which is bert-base-uncased's); tokens -> examples by the examples our preparation made from the shared corpora at 128
tokens. The GPU rates are token slots per second (batch x sequence length, padding included), the same unit as the
schedules' steps x batch x length.
"""

from __future__ import annotations

import argparse

R = "bench/RESULTS.md"
SCHEDULES = {  # name -> [(phase, steps, global batch, sequence length)]
    # BERT paper, appendix A.2: 1M steps at batch 256, 90% of the steps at 128, the rest at 512 (the split NVIDIA's
    # DeepLearningExamples README also states: "90% of the training steps are done with sequence length 128")
    "BERT paper (Adam)": [("phase 1", 900_000, 256, 128), ("phase 2", 100_000, 256, 512)],
    # NVIDIA DeepLearningExamples PyTorch/LanguageModeling/BERT README, "Pre-training": LAMB, 7038 steps at global
    # batch 65536 x 128, then 1563 steps at 32768 x 512
    "NVIDIA LAMB": [("phase 1", 7038, 65536, 128), ("phase 2", 1563, 32768, 512)],
}


def corpus_tokens(words_and_ratios: list[tuple[float, float]]) -> float:
    """Tokens of a corpus given (words, tokens per word) for each source.

    >>> round(corpus_tokens([(2.5e9, 1.386), (0.8e9, 1.273)]) / 1e9, 4)   # Wikipedia + BooksCorpus
    4.4834
    """
    return sum(words * ratio for words, ratio in words_and_ratios)


def prep_hours(tokens: float, tokens_per_cpu_s: float, cores: int, efficiency: float = 1.0) -> float:
    """Wall hours to prepare `tokens` source tokens on `cores` cores, each at `tokens_per_cpu_s` x `efficiency`.

    >>> round(prep_hours(1e9, 500_000, 32), 3)                   # 1e9 / (500k x 32) s = 62.5 s
    0.017
    """
    return tokens / (tokens_per_cpu_s * efficiency * cores) / 3600


def gpu_hours(steps: int, batch: int, seq: int, tokens_per_s: float) -> float:
    """GPU-hours for `steps` steps of `batch` sequences of `seq` token slots at `tokens_per_s` per GPU (the same
    total on any number of GPUs when the per-GPU rate holds).

    >>> round(gpu_hours(900_000, 256, 128, 190_465), 2)          # 29.49e9 slots / 190,465 per s = 154,838 s
    43.01
    """
    return steps * batch * seq / tokens_per_s / 3600


def fmt_h(h: float) -> str:
    """Hours for a table cell: whole hours from 100 up, minutes beside the short ones.

    >>> fmt_h(1234.5), fmt_h(12.34), fmt_h(0.25), fmt_h(0.0123)
    ('1,234', '12.3', '0.25 (15 min)', '0.012 (0.7 min)')
    """
    if h >= 100:
        return f"{h:,.0f}"
    if h >= 1:
        return f"{h:.1f}"
    if h >= 0.1:
        return f"{h:.2f} ({h * 60:.0f} min)"
    return f"{h:.3f} ({h * 60:.1f} min)"


def raw_sources_table(a: argparse.Namespace) -> str:
    """Hours from the raw sources to shards with dedup near: English Wikipedia from its dump (the larger of its
    CPU-hours by words and by XML bytes) and BooksCorpus (its tokens at the Ray path's book rate, times dedup's
    factor), on `a.nodes` nodes of `a.cores_per_node` cores. The dump's rate was measured on two hosts, so no
    factor across nodes is applied."""
    by_words, by_xml = a.dump_words / a.dump_word_rate / 3600, a.dump_xml_mb / a.dump_xml_rate / 3600
    wiki = max(by_words, by_xml)
    books = a.books_words * a.books_tokens_per_word * a.near_factor / a.books_rate / 3600
    lines = [
        f"\nHours from the raw sources, dedup near (the default), nodes of {a.cores_per_node} cores. CPU-hours: "
        f"Wikipedia's dump -> shards {wiki:.1f} (by words {by_words:.1f}, by XML bytes {by_xml:.1f}), "
        f"BooksCorpus -> shards {books:.2f}\n",
        "| nodes | cores | English Wikipedia, dump -> shards | BooksCorpus -> shards | both |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in (int(x) for x in a.nodes.split(",")):
        cores = n * a.cores_per_node
        lines.append(
            f"| {n} | {cores} | {fmt_h(wiki / cores)} | {fmt_h(books / cores)} | {fmt_h((wiki + books) / cores)} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    c = ap.add_argument_group("corpus")
    c.add_argument(
        "--wiki-words",
        type=float,
        default=2.5e9,
        help="English Wikipedia, words of text passages (BERT paper section 3.1; DeepLearningExamples "
        "README 'Getting the data': 2500M)",
    )
    c.add_argument("--books-words", type=float, default=0.8e9, help="BooksCorpus words (same sources: 800M)")
    c.add_argument(
        "--wiki-tokens-per-word",
        type=float,
        default=1.386,
        help=f"765 WordPiece tokens / 552 words of the shared sample dump's 4 articles ({R}, "
        "'Wikipedia: dump -> text against WikiExtractor' and 'Capacity on paper: English Wikipedia "
        "from its dump')",
    )
    c.add_argument(
        "--books-tokens-per-word",
        type=float,
        default=1.273,
        help=f"1,005,183 tokens / 789,634 words of the shared books ({R}, 'Capacity on paper (issue 18)')",
    )
    c.add_argument(
        "--tokens-per-example",
        type=float,
        default=103.46,
        help=f"source tokens per example at 128, NSP, static masks: 2,312,433 tokens of the shared corpora "
        f"/ 22,351 examples ({R}, 'Side by side with Google's create_pretraining_data.py', "
        "`python bench/studies/google_compare.py`)",
    )
    d = ap.add_argument_group("data preparation (tokens of input text per CPU-second)")
    d.add_argument(
        "--local-rate",
        type=float,
        default=559_460,
        help=f"local path: 20,811,897 tokens / 37.2 CPU-s ({R}, 'Against raw encode_batch at 20.8M "
        "tokens', `python bench/data/data_throughput.py --skip-hf --ray-too`, 13:48 UTC)",
    )
    d.add_argument(
        "--ray-rate",
        type=float,
        default=370_319,
        help="Ray path (--data.local_max_bytes 0): 20,811,897 tokens / 56.2 CPU-s (same run)",
    )
    d.add_argument(
        "--ray-node-efficiency",
        type=float,
        default=0.969,
        help=f"Ray path's rate per CPU-s on two nodes / one node: 1,104 / 1,139 pages per CPU-s ({R}, "
        "'Scale on two nodes (issue 24)', `python bench/studies/wiki_scale.py`); applied to every "
        "multi-node row",
    )
    w = ap.add_argument_group("data preparation from the raw sources, dedup near (the default; issue 36)")
    w.add_argument(
        "--dump-words",
        type=float,
        default=4.5e9,
        help="English Wikipedia's articles, every word, as read from its dump (Wikipedia:Size of "
        f"Wikipedia, April 2024; {R}, 'Capacity on paper: English Wikipedia from its dump')",
    )
    w.add_argument(
        "--dump-xml-mb",
        type=float,
        default=95_000,
        help="its uncompressed XML, MB (4.3 x 22 GB of bz2: an assumption, same section)",
    )
    w.add_argument(
        "--dump-word-rate",
        type=float,
        default=127_262,
        help=f"words of the dump per CPU-s, dump -> shards on two hosts: 2,536 pages per CPU-s x 552/11 "
        f"words a page, 1 GB of multistream bz2 ({R}, 'A gigabyte on two hosts', "
        "`python bench/studies/wiki_two_hosts.py`)",
    )
    w.add_argument("--dump-xml-rate", type=float, default=4.342, help="MB of the dump's XML per CPU-s (same run)")
    w.add_argument(
        "--books-rate",
        type=float,
        default=397_305,
        help=f"tokens of book text per CPU-s on the Ray path, dedup off: 20,818,782 tokens / 52.4 CPU-s, "
        f"the slower of two runs ({R}, 'The Ray path's CPU per token against the local path', "
        "`python bench/data/data_throughput.py --skip-hf --ray-too --memory-factors 1`)",
    )
    w.add_argument(
        "--near-factor",
        type=float,
        default=1.07,
        help=f"CPU of dedup near / off on the Ray path, 132,000 pages ({R}, 'One read per document', "
        "`python bench/studies/one_read.py --copies 12000 --paths ray`)",
    )
    d.add_argument("--cores-per-node", type=int, default=32)
    d.add_argument("--nodes", default="1,4,16")
    g = ap.add_argument_group("GPU (token slots per second per GPU)")
    for name, rate, how in [
        ("base-128", 568_976, "H200, 2026-11-27: BERT-base 256 x 128 packed, the product's step with train.compile"),
        (
            "base-512",
            411_034,
            "H200, 2026-11-27: BERT-base 64 x 512 padded (802.8 seq/s x 512 slots), eager: no "
            "compiled row at 512 was measured",
        ),
        (
            "large-128",
            219_040,
            "H200, the second lease of 2026-11-27: BERT-large 256 x 128 packed (large.yaml's "
            "micro-batch), the product's step with train.compile",
        ),
        (
            "large-512",
            176_172,
            "H200, the second lease of 2026-11-27: BERT-large 32 x 512 padded (344.1 seq/s x 512 "
            "slots; large.yaml's micro-batch), the product's step with train.compile",
        ),
    ]:
        g.add_argument(
            f"--{name}",
            type=float,
            default=rate,
            help=f"ours on one GPU, bf16: {how} ({R}, 'GPU (BERT-base / BERT-large, bf16, MFU)', "
            "`bash bench/gpu/gpu_step.sh`)",
        )
    p = ap.add_argument_group("published figures")
    p.add_argument(
        "--mlperf-large",
        type=float,
        default=246_000,
        help="MLPerf Training v3.0 BERT-large, 8 x H100: about 970 seq/s a GPU = 246k real tokens/s "
        "(issue 18's table); applied to both phases",
    )
    p.add_argument(
        "--dle-seq-128",
        type=float,
        default=580,
        help="NVIDIA DeepLearningExamples PyTorch BERT README, 'Pre-training NVIDIA DGX A100 (8x A100 "
        "80GB)': BERT-large, 1 GPU, mixed precision, sequence length 128, sequences/s",
    )
    p.add_argument("--dle-seq-512", type=float, default=210, help="the same table at sequence length 512")
    p.add_argument(
        "--dle-gpu-hours",
        type=float,
        default=256 * 1.2,
        help="the same README, 'Pre-training loss results': 32 x DGX A100 80GB (256 GPUs), 1.2 h time to "
        "train, mixed precision, LAMB schedule",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    tokens = corpus_tokens([(a.wiki_words, a.wiki_tokens_per_word), (a.books_words, a.books_tokens_per_word)])
    words = a.wiki_words + a.books_words
    print(
        f"Corpus: {a.wiki_words / 1e9:.2f}B words x {a.wiki_tokens_per_word} (Wikipedia) + "
        f"{a.books_words / 1e9:.2f}B x {a.books_tokens_per_word} (BooksCorpus) = {words / 1e9:.2f}B words = "
        f"{tokens / 1e9:.2f}B tokens = {tokens / a.tokens_per_example / 1e6:.1f}M examples at 128 tokens "
        f"({a.tokens_per_example} tokens an example)\n"
    )

    cpu_local, cpu_ray = tokens / a.local_rate / 3600, tokens / a.ray_rate / 3600
    print(
        f"Hours to prepare it once (one max_seq_length; dedup off), nodes of {a.cores_per_node} cores. "
        f"CPU-hours: local path {cpu_local:.2f}, Ray path {cpu_ray:.2f} (one node), "
        f"{cpu_ray / a.ray_node_efficiency:.2f} (several nodes)\n"
    )
    print(
        f"| nodes | cores | local path ({a.local_rate:,.0f} tokens/CPU-s) | Ray path ({a.ray_rate:,.0f} "
        f"tokens/CPU-s, x{a.ray_node_efficiency} across nodes) | Ray path, both phases (128 and 512) |"
    )
    print("|---:|---:|---:|---:|---:|")
    for n in (int(x) for x in a.nodes.split(",")):
        cores = n * a.cores_per_node
        local = fmt_h(prep_hours(tokens, a.local_rate, cores)) if n == 1 else "- (one machine)"
        ray = prep_hours(tokens, a.ray_rate, cores, a.ray_node_efficiency if n > 1 else 1.0)
        print(f"| {n} | {cores} | {local} | {fmt_h(ray)} | {fmt_h(2 * ray)} |")

    print(raw_sources_table(a))

    rates = {  # column -> (tokens/s at 128, tokens/s at 512)
        "BERT-base, ours (H200)": (a.base_128, a.base_512),
        "BERT-large, ours (H200)": (a.large_128, a.large_512),
        "BERT-large at MLPerf v3.0's rate (H100)": (a.mlperf_large, a.mlperf_large),
        "BERT-large at NVIDIA DLE's rate (A100-80GB)": (a.dle_seq_128 * 128, a.dle_seq_512 * 512),
    }
    print("\nGPU-hours to pretrain (token slots / tokens per second per GPU; passes = token slots / corpus tokens)\n")
    print("| schedule | phase | steps x batch x length | token slots | passes | " + " | ".join(rates) + " |")
    print("|---|---|---|---:|---:|" + "---:|" * len(rates))
    for name, phases in SCHEDULES.items():
        totals = [0.0] * len(rates)
        slots_sum = 0
        for phase, steps, batch, seq in phases:
            slots = steps * batch * seq
            slots_sum += slots
            hours = [gpu_hours(steps, batch, seq, r[0] if seq == 128 else r[1]) for r in rates.values()]
            totals = [t + h for t, h in zip(totals, hours)]
            print(
                f"| {name} | {phase} | {steps:,} x {batch:,} x {seq} | {slots / 1e9:.1f}B | {slots / tokens:.1f} | "
                + " | ".join(fmt_h(h) for h in hours)
                + " |"
            )
        print(
            f"| {name} | **total** | | {slots_sum / 1e9:.1f}B | {slots_sum / tokens:.1f} | "
            + " | ".join(f"**{fmt_h(t)}**" for t in totals)
            + " |"
        )
    print(
        f"| NVIDIA DLE, published time to train | LAMB, both phases | 256 A100-80GB x 1.2 h | | | | | | "
        f"{fmt_h(a.dle_gpu_hours)} |"
    )


if __name__ == "__main__":
    main()
