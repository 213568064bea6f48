"""The data stages of the job graph: plan -> vocab -> shards -> validate, for one DataConfig.

`plan` lists the inputs, hashes the config and refuses an output prepared with a different one, before any
stage runs. `vocab` loads the given vocabulary or trains a WordPiece one on a sample of the corpus; `shards`
runs the three passes (pipeline.data.prepare); `validate` checks the written dataset and returns it. A stage is
skipped only when its real output proves it done (DESIGN.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any

from pipeline.config import DataConfig, config_hash
from pipeline.data.dataset import PreparedDataset
from pipeline.data.passes import wiki_options
from pipeline.data.prepare import OutputExistsError, log_skipped, output_config_hash, prepare_shards, runs_in_process
from pipeline.data.progress import log
from pipeline.data.sources import Document, InputError, InputFile, no_readable_input, read_documents
from pipeline.data.tokenizer import sha256_bytes
from pipeline.runner.dag import Stage
from pipeline.storage.io import (
    exists,
    filesystem,
    is_uri,
    join,
    local_copy,
    output_lock,
    read_bytes,
    read_text,
    write_bytes_atomic,
)


def needs_ray(cfg: DataConfig) -> bool:
    """Whether preparing `cfg` starts Ray work (the job connects to Ray only then)."""
    from pipeline.data.sources import expand_inputs

    return not runs_in_process(cfg, expand_inputs(list(cfg.inputs))[0])


@dataclasses.dataclass
class Plan:
    """What the data stages need, computed once on the driver: inputs, hashes, the output check."""

    cfg: DataConfig
    files: list[InputFile]
    skipped: list[str]
    vocab_source_sha: str | None
    config_hash: str
    vocab_key: str
    file_sources: dict[int, int] | None = None
    """In a mixture: each input file's index -> its source's index in data.sources (`file_sources`)."""


def file_sources(cfg: DataConfig, files: list[InputFile]) -> dict[int, int] | None:
    """{input file index: the index of its source in data.sources}, each source's inputs listed on their own; None
    without a mixture. A source without a readable file, and a file two sources hold, are one line (InputError).
    """
    from pipeline.data.sources import expand_inputs

    if not cfg.sources:
        return None
    index = {f.path: f.index for f in files}
    out: dict[int, int] = {}
    for k, source in enumerate(cfg.sources):
        mine, skipped = expand_inputs(list(source.inputs))
        if not mine:
            raise InputError(f"data.sources[{source.name}]: {no_readable_input(list(source.inputs), skipped)}")
        for f in mine:
            if index[f.path] in out:
                other = cfg.sources[out[index[f.path]]].name
                raise InputError(
                    f"data.sources[{source.name}] and data.sources[{other}] both hold {f.path}: a file is of one source"
                )
            out[index[f.path]] = k
    return out


def plan(cfg: DataConfig) -> Plan:
    """List the inputs, hash the config, and refuse an output prepared with a different config."""
    from pipeline.data.sources import expand_inputs, fingerprint

    files, skipped = expand_inputs(list(cfg.inputs))
    if not files:
        raise no_readable_input(list(cfg.inputs), skipped)
    sources = file_sources(cfg, files)
    log_skipped(skipped)
    vocab_sha = None
    if cfg.vocab:
        if not exists(cfg.vocab):
            raise InputError(f"vocabulary {cfg.vocab} does not exist")
        vocab_sha = hashlib.sha256(read_bytes(cfg.vocab)).hexdigest()
    chash = output_config_hash(cfg, fingerprint(files), vocab_sha, sources)
    if cfg.vocab:
        vocab_key = config_hash({"vocab": vocab_sha, "lowercase": cfg.lowercase})
    else:
        vocab_key = config_hash(
            {
                "train": cfg.vocab_size,
                "lowercase": cfg.lowercase,
                "sample_bytes": cfg.tokenizer_sample_bytes,
                "column": cfg.text_column,
                "inputs": fingerprint(files),
                **({"kind": cfg.tokenizer} if cfg.tokenizer != "wordpiece" else {}),
            }
        )
    manifest_path = join(cfg.output, "manifest.json")
    if exists(manifest_path) and not cfg.overwrite:
        try:
            old = json.loads(read_text(manifest_path)).get("config_hash", "?")
        except ValueError:
            old = "unreadable"
        if old != chash:
            raise OutputExistsError(
                f"output {cfg.output} holds a dataset prepared with a different config or inputs "
                f"(config_hash {str(old)[:12]} != {chash[:12]}); choose another --output or pass --data.overwrite true"
            )
    return Plan(cfg, files, skipped, vocab_sha, chash, vocab_key, sources)


def _vocab_result(cfg: DataConfig, sha: str) -> dict[str, Any]:
    return {
        "vocab": join(cfg.output, "vocab.txt"),
        "tokenizer": join(cfg.output, "tokenizer.json"),
        "vocab_sha256": sha,
    }


def vocab_done(p: Plan) -> dict[str, Any] | None:
    """The vocabulary result when vocab.txt, tokenizer.json and vocab.meta.json agree with each other and with
    this plan's vocabulary key; otherwise None and the stage runs again (it rewrites all three)."""
    meta = join(p.cfg.output, "vocab.meta.json")
    if not (exists(meta) and exists(join(p.cfg.output, "tokenizer.json")) and exists(join(p.cfg.output, "vocab.txt"))):
        return None
    try:
        m = json.loads(read_text(meta))
    except ValueError:
        return None
    sha = sha256_bytes(read_bytes(join(p.cfg.output, "vocab.txt")))
    tok_sha = sha256_bytes(read_bytes(join(p.cfg.output, "tokenizer.json")))
    if m.get("key") != p.vocab_key or m.get("vocab_sha256") != sha or m.get("tokenizer_sha256") != tok_sha:
        return None
    return _vocab_result(p.cfg, sha)


class _Sample:
    """The vocabulary-training sample, re-iterable (the trainer reads it twice) without holding it in memory."""

    def __init__(self, p: Plan) -> None:
        self.p = p

    def __iter__(self) -> Any:
        return _sample_texts(self.p)


def _file_share(p: Plan) -> int:
    """Each input file's share of the training sample, in UTF-8 bytes: tokenizer_sample_bytes spread evenly."""
    return p.cfg.tokenizer_sample_bytes // max(1, len(p.files)) + 1


def _sample_texts(p: Plan) -> Any:
    """Documents for vocabulary training: up to tokenizer_sample_bytes of UTF-8, spread evenly over the input
    files, in file order (sorted paths) and record order, so the sample is a function of the inputs. A document
    cut at the bound loses a character split there."""
    budget = _file_share(p)
    for f in p.files:
        used = 0
        for item in read_documents(f, p.cfg.text_column, wiki_options(p.cfg), p.cfg.max_record_bytes):
            if isinstance(item, Document):
                data = item.text.encode("utf-8")
                yield data[: budget - used].decode("utf-8", "ignore")
                used += len(data)
                if used >= budget:
                    break


REPORT_CHARS = 2_000_000  # text the tokenizer report reads: enough for stable figures, a few seconds to encode


def _report_texts(p: Plan) -> tuple[list[str], bool]:
    """(texts, held_out) for the tokenizer report: what follows the training sample in each input file, up to
    REPORT_CHARS in file order; when the sample holds the whole corpus, the sample's first REPORT_CHARS
    (held_out false: the figures are then measured on training text)."""
    budget = _file_share(p)
    out, total = [], 0
    for f in p.files:
        used = 0
        for item in read_documents(f, p.cfg.text_column, wiki_options(p.cfg)):
            if not isinstance(item, Document):
                continue
            data = item.text.encode("utf-8")
            text = data[max(0, budget - used) :].decode("utf-8", "ignore") if used + len(data) > budget else ""
            used += len(data)
            if text:
                out.append(text[: REPORT_CHARS - total])
                total += len(out[-1])
            if total >= REPORT_CHARS:
                return out, True
    if out:
        return out, True
    sample, total = [], 0
    for text in _Sample(p):
        sample.append(text[: REPORT_CHARS - total])
        total += len(sample[-1])
        if total >= REPORT_CHARS:
            break
    return sample, False


def run_vocab(p: Plan) -> dict[str, Any]:
    """Load the given vocabulary or train one; write vocab.txt + tokenizer.json (+ a key marker) to the output,
    holding the output's writer lock (a second writer fails at once, see `pipeline.storage.io.output_lock`)."""
    with output_lock(p.cfg.output):
        return _run_vocab(p)


def _run_vocab(p: Plan) -> dict[str, Any]:
    from pipeline.data.specials import specials
    from pipeline.data.tokenizer import (
        load_tokenizer,
        report_line,
        tokenizer_json,
        tokenizer_kind,
        tokenizer_report,
        train_tokenizer,
        vocab_bytes,
    )

    cfg = p.cfg
    fs, out = filesystem(cfg.output)
    if cfg.overwrite:
        for stale in ("manifest.json", "shards", "_work"):
            if fs.exists(join(out, stale)):
                fs.rm(join(out, stale), recursive=True)
    if cfg.vocab:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="vocab-") as tmp:  # tokenizers reads local files only
            tok = load_tokenizer(local_copy(cfg.vocab, tmp), lowercase=cfg.lowercase)
        sp = specials(tok, cfg.vocab)
        made = "".join(f"; {r} token made from {t}" for r, t in sp.made.items())
        log(f"vocab: using {cfg.vocab} ({tok.get_vocab_size()} tokens; template {sp.template}{made})")
    else:
        log(
            f"vocab: training a {cfg.tokenizer} vocabulary of {cfg.vocab_size} "
            f"on up to {cfg.tokenizer_sample_bytes:,} bytes"
        )
        tok = train_tokenizer(_Sample(p), cfg.tokenizer, cfg.vocab_size, cfg.lowercase)
    vb = vocab_bytes(tok)
    sha = hashlib.sha256(vb).hexdigest()
    write_bytes_atomic(join(cfg.output, "vocab.txt"), vb)
    tj = tokenizer_json(tok).encode()
    write_bytes_atomic(join(cfg.output, "tokenizer.json"), tj)
    texts, held_out = _report_texts(p)
    report = {**tokenizer_report(tok, texts), "held_out": held_out}
    log(f"vocab: {tokenizer_kind(tok)} of {tok.get_vocab_size()} tokens: {report_line(report)}")
    meta = {"key": p.vocab_key, "vocab_sha256": sha, "tokenizer_sha256": sha256_bytes(tj), "report": report}
    write_bytes_atomic(join(cfg.output, "vocab.meta.json"), json.dumps(meta).encode())
    return _vocab_result(cfg, sha)


def _summary(m: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "documents_read",
        "documents_written",
        "documents_rejected",
        "rejected_reasons",
        "examples",
        "tokens",
        "masked_tokens",
        "nsp_random_fraction",
        "config_hash",
        "vocab_sha256",
        "seconds",
    )
    return {**{k: m[k] for k in keys}, "duplicates": m.get("duplicates")}


def shards_done(p: Plan) -> dict[str, Any] | None:
    path = join(p.cfg.output, "manifest.json")
    if not exists(path) or not exists(join(p.cfg.output, "vocab.txt")):
        return None
    try:
        m = json.loads(read_text(path))
    except ValueError:
        return None
    sha = hashlib.sha256(read_bytes(join(p.cfg.output, "vocab.txt"))).hexdigest()
    if m.get("config_hash") != p.config_hash or m.get("vocab_sha256") != sha:
        return None
    return _summary(m)


def run_shards(p: Plan, vocab: dict[str, Any]) -> dict[str, Any]:
    """The three passes (pipeline.data.prepare), holding the output's writer lock."""
    with output_lock(p.cfg.output):
        m = prepare_shards(
            p.cfg, p.files, p.skipped, p.config_hash, vocab["vocab_sha256"], vocab["tokenizer"], p.file_sources
        )
    return _summary(m)


def run_validate(p: Plan) -> PreparedDataset:
    """Validate the output (schema, rows, sha256): the dataset downstream stages consume."""
    return PreparedDataset.load(p.cfg.output)


def check_paths(cfg: DataConfig) -> None:
    """Every input (and a given vocabulary) exists: checked on the driver before Ray starts."""
    given = (
        [(f"data.sources[{s.name}].inputs", p) for s in cfg.sources for p in s.inputs]
        if cfg.sources
        else [("data.inputs", p) for p in cfg.inputs]
    )
    _check_given = given + ([("data.vocab: vocabulary", cfg.vocab)] if cfg.vocab else [])
    if not cfg.inputs:
        raise InputError("data.inputs is empty: give at least one file or folder (--data.inputs PATH)")
    for field_name, path in _check_given:
        if not exists(path):
            raise InputError(
                f"{field_name}: {path} does not exist (relative paths resolve against the current "
                f"directory, {os.getcwd()})"
            )
    if cfg.vocab and not is_uri(cfg.vocab):  # a tokenizer that does not parse, or cannot mask: one line, now
        from pipeline.data.tokenizer import load_tokenizer

        load_tokenizer(cfg.vocab, lowercase=cfg.lowercase)


def _duplicates(r: dict[str, Any]) -> str:
    d = r.get("duplicates")
    return f" (duplicates exact/near {d['exact']}/{d['near']})" if d else ""


def data_stages(cfg: DataConfig, prefix: str = "") -> list[Stage]:
    """vocab -> shards -> validate for one DataConfig (paths already absolute, see config.resolve_paths).

    Planning lists the inputs and checks the output directory here, before any stage runs. The shards stage is
    done when `output/manifest.json` carries the same config hash (config fields, input fingerprint, given
    vocabulary) and the vocabulary it was built with; "validate" always runs (checksums) and returns the
    `PreparedDataset`. `prefix` names a later phase's stages apart (`phase1/vocab`, ...).
    """
    p = plan(cfg)
    vocab, shards = f"{prefix}vocab", f"{prefix}shards"
    return [
        Stage(
            vocab,
            lambda deps: run_vocab(p),
            done=lambda deps: vocab_done(p),
            describe=lambda r: f"vocab_sha256 {r['vocab_sha256'][:12]}",
        ),
        Stage(
            shards,
            lambda deps: run_shards(p, deps[vocab]),
            deps=(vocab,),
            done=lambda deps: shards_done(p),
            describe=lambda r: (
                f"documents read/written/rejected {r['documents_read']}/{r['documents_written']}/"
                f"{r['documents_rejected']}" + _duplicates(r) + f", {r['examples']:,} examples, "
                f"{r['tokens']:,} tokens"
            ),
        ),
        Stage(
            f"{prefix}validate",
            lambda deps: run_validate(p),
            deps=(shards,),
            describe=lambda d: f"{len(d.shards)} shards checked, {d.output}",
        ),
    ]
