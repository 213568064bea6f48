"""The configuration's sections: one dataclass per concern (`DataConfig`, `ModelConfig`, `TrainConfig` with its
`PhaseConfig`s, `TrackingConfig`, and `Config` holding them), each field with its type, default and a docstring
line, validated at construction with errors that name the field. `BaseTrainConfig` holds the training fields
pretraining (`TrainConfig`) and fine-tuning (`pipeline.finetune.config`) share. They are read from YAML and the
command line by `pipeline.config.parser`.

    >>> TrainConfig(max_steps=10, phases=[{"fraction": 0.9}, {"max_seq_length": 512}]).phase_steps()
    [9, 1]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
import sys
from functools import cache
from typing import Annotated, Any, Literal, get_type_hints

from pipeline.errors import PipelineError


class ConfigError(PipelineError, ValueError):
    """A bad config file, section, field or value; the message names it."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass(frozen=True)
class Bound:
    """A number field's bounds, carried by its type (`Annotated[int, Bound(1)]`) and checked in one place,
    `check_bounds`, in every section's `__post_init__`: from YAML, the command line or Python alike. (jsonargparse
    reads the annotated type as its base type; its own restricted types would check the command line only, and
    word their errors otherwise.) A null value is not checked; NaN is outside every bound.

        >>> Bound(1).problem(0), Bound(0, lo_open=True).problem(float("nan")), Bound(0, 1, hi_open=True).problem(1.0)
        ('< 1', 'must be > 0', 'is not in [0, 1)')
        >>> Bound(0, lo_open=True, finite=True).problem(float("inf")), Bound(16, 8192).problem(512) is None
        ('must be > 0', True)
    """

    lo: float
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    finite: bool = False
    """Also below infinity (a learning rate)."""

    def problem(self, v: float) -> str | None:
        """What is wrong with `v` (the end of the error line), or None."""
        above = v > self.lo if self.lo_open else v >= self.lo
        below = self.hi is None or (v < self.hi if self.hi_open else v <= self.hi)
        if above and below and (not self.finite or v < math.inf):
            return None
        if self.hi is not None:
            return f"is not in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        return f"must be > {self.lo:g}" if self.lo_open else f"< {self.lo:g}"


@cache
def _bounds(cls: type) -> tuple[tuple[str, Bound], ...]:
    """(field, bound) of a dataclass's fields whose type carries a `Bound`, in declaration order."""
    found: dict[str, Bound] = {}
    for klass in reversed(cls.__mro__):
        own = klass.__dict__.get("__annotations__", {})
        if not any("Bound(" in str(t) for t in own.values()):
            continue
        hints = get_type_hints(klass, vars(sys.modules[klass.__module__]), include_extras=True)
        for name in own:
            meta = getattr(hints[name], "__metadata__", ())
            found.update({name: m for m in meta if isinstance(m, Bound)})
    return tuple(found.items())


def check_bounds(obj: Any, prefix: str) -> None:
    """Each bounded field of `obj` within its `Bound`, else one line naming it (`prefix` + name).

    >>> check_bounds(DataConfig(), "data.")
    >>> DataConfig(num_shards=0)
    Traceback (most recent call last):
    ...
    pipeline.config.sections.ConfigError: data.num_shards 0 < 1
    >>> TrainConfig(lr=0.0)
    Traceback (most recent call last):
    ...
    pipeline.config.sections.ConfigError: train.lr 0.0 must be > 0
    """
    for name, bound in _bounds(type(obj)):
        v = getattr(obj, name)
        if v is None or isinstance(v, (str, bool)):  # null, or a word such as lr's "auto"
            continue
        problem = bound.problem(v)
        _check(problem is None, f"{prefix}{name} {v} {problem}")


SOURCE_NAME = re.compile(r"[A-Za-z0-9_.-]+")
"""What a source's name may hold: it names a shard column's values, an MLflow metric and a dataset."""


def _of(cls: type, value: Any, where: str) -> Any:
    """A section's sub-record given as itself or as a mapping (`PhaseConfig`, `SourceConfig`)."""
    if isinstance(value, cls):
        return value
    _check(isinstance(value, dict), f"{where} must be a mapping of field: value, got {value!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - names)
    _check(not unknown, f"unknown {where} field(s): {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    return cls(**value)


@dataclass
class SourceConfig:
    """One named source of a data mixture (`data.sources`): its files, and how much of the training stream it is.

    >>> SourceConfig(name="books", inputs="/data/books", weight=3).inputs
    ['/data/books']
    """

    name: str = ""
    """Its rows' value in the shard column `source`, its metric `train/source_tokens/<name>`, its MLflow input."""
    inputs: list[str] | str = field(default_factory=list)
    """Files or folders of this source, as data.inputs takes them."""
    weight: float | None = None
    """Its share of the trained tokens against the other weighted sources' (3 and 1: 75% and 25%): a small source
    repeats, a large one is subsampled."""
    epochs: float | None = None
    """Instead of a weight: how many times each phase reads this source's training tokens (2: twice; 0.5: half)."""

    def __post_init__(self) -> None:
        if isinstance(self.inputs, str):
            self.inputs = [self.inputs]
        # numbers as floats, so that `weight: 3` and `weight: 3.0` name the same run (pretrain/identity.py)
        self.weight, self.epochs = (None if v is None else float(v) for v in (self.weight, self.epochs))
        _check(
            isinstance(self.name, str) and SOURCE_NAME.fullmatch(self.name) is not None,
            f"data.sources name {self.name!r} must be letters, digits, '_', '-' or '.'",
        )
        _check(bool(self.inputs), f"data.sources[{self.name}].inputs is empty: give its files or folders")
        _check(
            self.weight is None or self.epochs is None, f"data.sources[{self.name}]: give weight or epochs, not both"
        )
        if self.weight is not None:
            _check(0 <= self.weight < math.inf, f"data.sources[{self.name}].weight {self.weight:g} must be >= 0")
        if self.epochs is not None:
            _check(0 < self.epochs < math.inf, f"data.sources[{self.name}].epochs {self.epochs:g} must be > 0")


@dataclass
class DataConfig:
    """Where the raw text is, how it is tokenized, and how examples are built and masked."""

    inputs: list[str] | str = field(default_factory=list)
    """Files or folders (recursively) of .txt/.txt.gz books, .jsonl/.jsonl.gz, .parquet, or a `save_to_disk` dir."""
    sources: list[SourceConfig] = field(default_factory=list)
    """A mixture instead of data.inputs (which then lists the sources' inputs): [{name, inputs, weight | epochs}].
    Each row remembers its source (shard column `source`); training draws each source's share of the tokens by its
    weight (`pipeline.pretrain.mixture`). Empty: data.inputs, one stream, each part in proportion to its size."""
    mix_temperature: Annotated[float, Bound(0, lo_open=True)] = 1.0
    """Sources given neither weight nor epochs are weighted by their tokens to this power (mmBERT's temperature):
    1 is in proportion to size, lower flattens the mixture towards equal shares."""
    output: str = "data/prepared"
    """Output directory: manifest.json, vocab.txt, tokenizer.json, shards/*.parquet."""
    text_column: str = "text"
    """Column (JSONL key, Parquet column, datasets column) that holds a document's text."""
    vocab: str | None = None
    """An existing vocab.txt or tokenizer.json; when null a `tokenizer` vocabulary is trained on the corpus."""
    tokenizer: Literal["wordpiece", "bpe", "unigram"] = "wordpiece"
    """What `vocab: null` trains (pipeline/data/tokenizer.py): BERT's WordPiece (`##` continuations), a byte-level BPE
    (RoBERTa, ModernBERT: no unknown token) or a SentencePiece-style Unigram (`▁` word starts); all with BERT's
    special tokens, bpe and unigram padded with [unusedN] to a multiple of 64."""
    vocab_size: Annotated[int, Bound(128)] = 30522
    """Size of the vocabulary to train when `vocab` is null."""
    lowercase: bool = True
    """Uncased (BERT-base-uncased style) when true, cased when false."""
    max_seq_length: Annotated[int, Bound(16, 8192)] = 128
    """Maximum tokens per example including [CLS]/[SEP]."""
    short_seq_prob: Annotated[float, Bound(0, 1)] = 0.1
    """Probability of a shorter target length (Google's algorithm), so the model sees short inputs too."""
    nsp: bool = True
    """Next-sentence pairs when true; MLM-only packing of whole sentences when false."""
    pack_documents: bool = False
    """MLM-only (nsp false): documents back to back in full rows of max_seq_length (cut at a row's end, going on in
    the next), each piece `[CLS] ... [SEP]`, their lengths in the shard column doc_lengths (ModernBERT keeps them
    apart; short_seq_prob does not apply); false: a row holds one document."""
    masking: Literal["static", "dynamic"] = "static"
    """static: masked at preparation (dupe_factor copies); dynamic: masked at load time per epoch."""
    mask_rate: Annotated[float, Bound(0, 1, lo_open=True, hi_open=True)] = 0.15
    """Fraction of tokens selected for prediction."""
    max_predictions_per_seq: Annotated[int, Bound(1)] = 20
    """Cap on masked positions per example."""
    whole_word_mask: bool = False
    """Mask a word's pieces together, by the tokenizer's own rule (`pipeline.data.specials.word_marks`): `##`
    continuations (WordPiece), pieces without `Ġ` (byte-level BPE) or `▁` (Unigram) join the word before them."""
    dupe_factor: Annotated[int, Bound(1)] = 1
    """Static masking: number of copies of each example with different masks."""
    num_shards: Annotated[int, Bound(1)] = 8
    """Number of Parquet shards (balanced in rows)."""
    seed: int = 12345
    """Seed for pair creation and masking; randomness derives from it and document/example identity."""
    num_actors: Annotated[int, Bound(1)] = 2
    """Processes that tokenize and build examples: Ray Data actors, or local worker processes (at most the cores,
    and one per 2 MiB of input) when the input is prepared without Ray; the output does not depend on it."""
    random_pool_size: Annotated[int, Bound(1)] = 20000
    """Sentence windows (about max_seq_length tokens each) sampled from the whole corpus for random-next B."""
    tokenizer_sample_bytes: Annotated[int, Bound(1)] = 50_000_000
    """Bytes of text (UTF-8; spread over the input files, in file and record order) a new vocabulary is trained on:
    the bounded, deterministic sample (as SentencePiece's input_sentence_size) that keeps its memory flat."""
    vocab_sample_chars: int | None = None
    """The former name of tokenizer_sample_bytes (a bound in characters until issue 57), still read: when given, it
    sets tokenizer_sample_bytes (its figure taken as bytes). Giving both, with different figures, is an error."""
    chunk_chars: Annotated[int, Bound(1)] = 4_000_000
    """Characters of text per intermediate token chunk: the unit of parallel work, memory and resume."""
    max_document_chars: Annotated[int, Bound(1000)] = 1_000_000
    """Longer documents (a .txt book is one) are cut into pieces of at most this many characters at paragraph or
    sentence boundaries before tokenization, so memory does not grow with a document (pipeline/data/examples.py)."""
    max_record_bytes: Annotated[int, Bound(1024)] = 128 * 2**20
    """The most bytes one input record may hold (a dump page's XML, a WikiExtractor `<doc>` block, a JSON line, a
    book's file, a Parquet or datasets row's text): a longer one is rejected as `record_too_large` and reading goes
    on at the next record, so a record never closed (`<page>` without `</page>`) costs this much memory, not the rest
    of its file. A book is one record: a larger one is rejected whole; raise this for it (pipeline/data/sources)."""
    local_max_bytes: Annotated[int, Bound(0)] = 2**30
    """Inputs of at most this many bytes (on disk, 1 GiB by default) are prepared on the job's own machine without
    Ray: in its process, or on up to num_actors local worker processes. Ray's processes, actors and transfers
    cost tens of CPU-seconds and only pay off across nodes; larger inputs go to Ray (multi-node), and 0 sends
    every input there. The output does not depend on it."""
    overwrite: bool = False
    """Replace an output directory prepared with a different config (otherwise that is an error)."""
    dedup: Literal["off", "exact", "near"] = "near"
    """Drop duplicate documents before tokenizing, keeping the first in input order: exact (same text after
    case-folding and whitespace collapsing), near (also MinHash-estimated Jaccard of word 5-grams >=
    dedup_threshold), or off. Dropped documents are listed in OUT/duplicates.jsonl (pipeline/data/dedup.py)."""
    dedup_threshold: Annotated[float, Bound(0, 1, lo_open=True)] = 0.8
    """Near duplicates: the estimated Jaccard similarity at or above which a later document is dropped."""
    dedup_num_perm: Annotated[int, Bound(16, 1024)] = 128
    """Near duplicates: MinHash values per document (estimate error about 0.035 at Jaccard 0.8)."""
    wiki_keep_lists: bool = False
    """MediaWiki dumps: keep list items as text (the BERT paper drops lists, tables and headings)."""
    wiki_keep_headings: bool = False
    """MediaWiki dumps: keep section headings as text."""

    def __post_init__(self) -> None:
        if isinstance(self.inputs, str):  # one path given alone: `--data.inputs /data/books`
            self.inputs = [self.inputs]
        check_bounds(self, "data.")
        self._old_sample_name()
        self._check_sources()
        _check(not (self.pack_documents and self.nsp), "data.pack_documents needs data.nsp false (MLM-only rows)")
        _check(
            self.tokenizer in ("wordpiece", "bpe", "unigram"),
            f"data.tokenizer {self.tokenizer!r} is not one of wordpiece, bpe, unigram",
        )
        _check(
            self.tokenizer != "bpe" or self.vocab or self.vocab_size >= 261,
            f"data.vocab_size {self.vocab_size} "
            "is too small for data.tokenizer bpe: 256 bytes + 5 special tokens need at least 261",
        )

    def _old_sample_name(self) -> None:
        """data.vocab_sample_chars, the field's old name: its figure moves to tokenizer_sample_bytes (one field)."""
        old = self.vocab_sample_chars
        if old is None:
            return
        _check(isinstance(old, int) and old >= 1, f"data.vocab_sample_chars {old!r} must be an integer >= 1")
        default = DataConfig.__dataclass_fields__["tokenizer_sample_bytes"].default
        _check(
            self.tokenizer_sample_bytes in (default, old),
            f"data.vocab_sample_chars {old} and data.tokenizer_sample_bytes {self.tokenizer_sample_bytes} are both "
            "given: give data.tokenizer_sample_bytes only (vocab_sample_chars is its old name)",
        )
        self.tokenizer_sample_bytes, self.vocab_sample_chars = old, None

    def _check_sources(self) -> None:
        """The mixture's own checks; with sources, data.inputs becomes their inputs (derived, as warmup_steps)."""
        _check(isinstance(self.sources, list), f"data.sources must be a list of sources, got {self.sources!r}")
        self.sources = [_of(SourceConfig, s, f"data.sources[{i}]") for i, s in enumerate(self.sources)]
        if not self.sources:
            return
        names = [s.name for s in self.sources]
        twice = sorted({n for n in names if names.count(n) > 1})
        _check(not twice, f"data.sources: the name {', '.join(twice)} is given twice")
        theirs = [p for s in self.sources for p in s.inputs]
        _check(
            not self.inputs or self.inputs == theirs,
            "data.inputs and data.sources are both given: give one (with data.sources, data.inputs is their inputs)",
        )
        self.inputs = theirs
        weights = [s.weight for s in self.sources if s.weight is not None]
        sized = [s.name for s in self.sources if s.weight is None and s.epochs is None]
        _check(
            not weights or not sized,
            f"data.sources: {', '.join(sized)} without a weight beside weighted sources: "
            "give every source a weight or epochs, or no source a weight (data.mix_temperature then weighs by size)",
        )
        _check(
            not weights or sum(weights) > 0,
            f"data.sources weights {', '.join(f'{w:g}' for w in weights)} do not sum to a positive number",
        )

    def source_names(self) -> list[str]:
        """The sources' names, in order (empty without a mixture)."""
        return [s.name for s in self.sources]


@dataclass
class ModelConfig:
    """Which encoder preset to build, with per-field overrides (e.g. `--model.overrides.hidden_dropout_prob 0.0`)."""

    preset: str | None = "tiny"
    """One of tiny, mini, small, medium, base, large (BERT: model.config.PRESETS) or modernbert-tiny, -mini, -base,
    -large (ModernBERT: MODERNBERT_PRESETS); null with model.init: the checkpoint's."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Config fields (BertConfig or ModernBertConfig) that differ from the preset; vocab_size is taken from the
    prepared vocabulary."""
    init: str | None = field(
        default=None, repr=False
    )  # repr=False: run identities hash the repr (pretrain/identity.py)
    """Continue pretraining from models:/name@alias, models:/name/version or a transformers directory: architecture
    and vocabulary come from it (a contradicting preset or override is an error); null starts from random weights."""

    def __post_init__(self) -> None:
        _check(self.preset is not None or self.init is not None, "model.preset null needs model.init (a checkpoint)")
        self.encoder_config()  # an unknown preset or a bad override fails here, before any work

    @property
    def family(self):
        """The `model.family.ModelFamily` this section builds: its preset's, or with preset null (model.init's) the
        one whose config takes the overrides (the checkpoint's whole config)."""
        from model.family import family_of

        return family_of(self.overrides if self.preset is None else self.preset)

    def encoder_config(self, **extra: Any):
        """The BertConfig or ModernBertConfig this section describes (plus `extra`, e.g. the prepared vocab_size).
        With preset null (model.init resolved by `pipeline.pretrain.init`) the overrides hold the checkpoint's
        whole config."""
        from model.family import encoder_config

        try:
            return encoder_config(self.preset, **{**self.overrides, **extra})
        except (ValueError, TypeError) as e:
            raise ConfigError(f"model: {e}") from None


@dataclass
class PhaseConfig:
    """One pretraining phase (BERT's recipe: most steps at 128 tokens, the rest at 512), on its own prepared data."""

    max_seq_length: Annotated[int, Bound(16, 8192)] = 128
    """Tokens per example in this phase's shards (the data stages run once per phase with it)."""
    fraction: Annotated[float | None, Bound(0, 1, lo_open=True)] = None
    """Share of train.max_steps spent in this phase; the last phase takes what is left when null."""
    steps: Annotated[int | None, Bound(1)] = None
    """Optimizer steps in this phase (instead of fraction)."""
    max_predictions_per_seq: int | None = None
    """Masked positions cap for this phase's data (the paper: 20 at 128, 80 at 512); null keeps data's."""
    output: str | None = None
    """Prepared-data directory of this phase; null means `<data.output>-<max_seq_length>`."""
    micro_batch_size: int | None = None
    """Per-worker micro-batch cap in this phase (longer sequences need smaller ones); null keeps train's."""
    global_batch_size: int | None = None
    """Examples per optimizer step in this phase; null keeps train's."""
    source_weights: dict[str, float] | None = None
    """This phase's mixture: {source name: weight} of data.sources (a source not named is not read in it), e.g. a
    final decay phase on a higher-quality mix; null keeps data.sources' weights, epochs and temperature."""
    mix_temperature: Annotated[float | None, Bound(0, lo_open=True)] = None
    """This phase's temperature for the sources without a weight (mmBERT lowers it phase by phase); null: data's."""
    mask_rate: Annotated[float | None, Bound(0, 1, lo_open=True, hi_open=True)] = None
    """Dynamic masking: the fraction of tokens masked in this phase (mmBERT anneals 30% to 5%); null: data's."""

    @classmethod
    def of(cls, value: PhaseConfig | dict[str, Any], where: str) -> PhaseConfig:
        """A phase given as itself or as a mapping (`TrainConfig(phases=[{"fraction": 0.9}, ...])`)."""
        return _of(cls, value, where)

    def __post_init__(self) -> None:
        check_bounds(self, "train.phases ")
        _check(self.fraction is None or self.steps is None, "train.phases: give fraction or steps, not both")
        w = self.source_weights
        _check(
            w is None or (isinstance(w, dict) and all(v >= 0 for v in w.values()) and sum(w.values()) > 0),
            f"train.phases source_weights {w} are not weights >= 0 summing to a positive number",
        )
        if w is not None:  # as floats, as a source's weight
            self.source_weights = {k: float(v) for k, v in w.items()}


@dataclass
class BaseTrainConfig:
    """Ray Train fields shared by pretraining (`TrainConfig`) and fine-tuning (`pipeline.finetune.config`), as litgpt's
    `TrainArgs` serves both; each subclass adds its own fields and may redefine a default (seed, lr, max_steps)."""

    num_workers: Annotated[int, Bound(1)] = 1
    """Ray Train workers (one process each; DDP across them)."""
    use_gpu: bool = False
    """One GPU per worker when true (NCCL); CPU with gloo otherwise. Fails at once on a cluster without a GPU."""
    cpus_per_worker: Annotated[float, Bound(0, lo_open=True)] = 0.5
    """CPUs reserved per worker; fractional on small machines so Ray's own tasks and actors are not starved."""
    max_steps: Annotated[int | None, Bound(1)] = None
    """Optimizer steps in the whole run."""
    optimizer: Literal["adamw", "lamb", "stableadamw"] = "adamw"
    """adamw; lamb for large batches (You et al. 2019); stableadamw, AdamW with AdaFactor's per-tensor update
    clipping (Wortsman et al. 2023), ModernBERT's optimizer, from torch-optimi."""
    lr: Annotated[float, Bound(0, lo_open=True, finite=True)] = 1e-3
    """Peak learning rate (reached at the end of warmup)."""
    weight_decay: float = 0.01
    """Decoupled weight decay (not on biases/LayerNorm)."""
    schedule: Literal["linear", "polynomial"] = "linear"
    """Decay after warmup, to 0 at the last step."""
    max_grad_norm: Annotated[float, Bound(0)] = 1.0
    """Clip the global gradient norm to this (0 disables clipping)."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """bf16 autocast (GPU or CPU), fp16 autocast with a gradient scaler (GPU), or fp32."""
    log_every_steps: Annotated[int, Bound(1)] = 1
    """Log training metrics to MLflow every N optimizer steps."""
    max_failures: Annotated[int, Bound(-1)] = 0
    """Worker failures Ray Train recovers from (restart from the last checkpoint); -1 = unlimited."""
    seed: int = 0
    """Seeds model init, dropout and data order; with it, CPU runs are bit-reproducible."""
    storage_path: str = "runs"
    """Local path (relative to the current directory) or pyarrow/fsspec URI where Ray Train keeps checkpoints."""

    def __post_init__(self) -> None:
        check_bounds(self, "train.")


@dataclass
class TrainConfig(BaseTrainConfig):
    """Ray Train pretraining: scale, optimisation, checkpoints and fault tolerance."""

    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    """How Ray places the workers: PACK fills a node first, SPREAD puts them on different nodes."""
    min_workers: int | None = None
    """Elastic training: when workers are lost for good (preempted nodes), the run goes on from its newest
    checkpoint with as few as this many, and grows back towards num_workers when capacity returns (needs
    max_failures != 0); the losses are those of a run at any other size. Null: exactly num_workers."""
    data_cpus: float | None = None
    """Cap on the CPUs Ray Data reading may use (ExecutionResources); null lets Ray Data decide."""
    max_steps: int = 100
    """Optimizer steps in the whole run (all phases share one step count and LR schedule)."""
    global_batch_size: Annotated[int, Bound(1)] = 32
    """Examples per optimizer step over all workers, whatever their number: which examples form each step is a
    function of the seed, the phase, the epoch and this, so a run resumes at any num_workers with the same data."""
    micro_batch_size: Annotated[int, Bound(1)] = 32
    """Cap on the examples of one forward/backward on one worker: each worker's share of the global batch is cut
    into as few micro-batches of at most this many as it needs (gradient accumulation). Memory, not the maths:
    it is not part of the run's identity."""
    phases: list[PhaseConfig] = field(default_factory=list)
    """Empty: one phase on data.output at data.max_seq_length. Else phases run in order on their own data."""
    warmup_steps: Annotated[int, Bound(0)] = 10
    """Linear warmup from 0 to lr over this many optimizer steps (set from warmup_fraction when that is given)."""
    warmup_fraction: Annotated[float | None, Bound(0, 1, hi_open=True)] = None
    """Share of max_steps in the warmup, in [0, 1): when set, warmup_steps is round(warmup_fraction x max_steps), so
    the warmup scales with `--train.max_steps`; null: warmup_steps as given."""
    head_only_steps: int = 0
    """With model.init: the first N steps train only the MLM (and NSP) head, the encoder's LR is 0; then the encoder
    warms up over warmup_steps. Lets a fresh head learn before its random gradients reach pretrained weights."""
    schedule: Literal["linear", "polynomial", "wsd"] = "linear"
    """Decay after warmup, to 0 at max_steps; wsd (warmup-stable-decay, ModernBERT's): the peak LR held after
    warmup, then a decay (decay_shape) to 0 over the last decay_fraction of max_steps."""
    poly_power: Annotated[float, Bound(0, lo_open=True)] = 1.0
    """Power of the polynomial decay (NVIDIA's LAMB recipe uses 0.5)."""
    decay_fraction: Annotated[float, Bound(0, 1)] = 0.1
    """schedule wsd: share of max_steps in the final decay (the stable phase is what warmup and decay leave)."""
    decay_shape: Literal["linear", "1-sqrt"] = "linear"
    """schedule wsd: the decay's shape, t going 0 -> 1 over it: linear, lr x (1 - t); 1-sqrt, lr x (1 - sqrt(t)),
    ModernBERT's and Ettin's (most of the drop comes early in the decay)."""
    materialize_data: bool = False
    """Every shard is read once into the Ray object store (by the driver up to 256 MiB, by Ray Data's tasks above:
    `pipeline.pretrain.job.READ_HERE_BYTES`) and every worker reads each epoch from there (small corpora: epochs
    then cost nothing to re-read); false: Ray Data streams the shards from storage to the workers every epoch."""
    shuffle_buffer_rows: Annotated[int, Bound(1)] = 16384
    """Each epoch the training rows, in file order, are permuted in consecutive chunks of this many rows, seeded by
    (seed, phase, epoch, chunk): the same order on every worker, at any number of workers. Larger is closer to a
    global shuffle and holds more rows in each worker's memory."""
    num_eval_shards: Annotated[int, Bound(0)] = 1
    """The last N shards of the prepared data are held out for evaluation (never trained on)."""
    eval_every_steps: int = 50
    """Evaluate on the held-out shards every N steps (and at the end); 0 disables periodic evaluation."""
    eval_batches: int = 10
    """Micro-batches per worker in each evaluation (0 = the whole held-out set)."""
    checkpoint_every_steps: Annotated[int, Bound(1)] = 50
    """Report a checkpoint (weights, optimizer, scheduler, scaler, RNGs, data positions) every N steps, and at
    the last."""
    num_to_keep: Annotated[int, Bound(1)] = 2
    """Checkpoints Ray Train keeps in storage_path."""
    checkpoint_upload: Literal["auto", "sync", "async"] = "auto"
    """How a checkpoint reaches storage_path: async uploads it in the background while training goes on (Ray
    Train's CheckpointUploadMode.ASYNC; it counts, and a restart resumes from it, once uploaded); sync waits for
    the copy; auto is async for an object store (s3://, gs://, ...) and sync for a local or shared disk."""
    run_name: str | None = None
    """Re-running with the same run name resumes it; null derives one from the config hash."""
    compile: bool = False
    """torch.compile the encoder's layers (one compiled graph shared by all; static shapes: batches padded to the
    phase's max_seq_length); for GPUs."""
    unpad: bool = False
    """For GPUs: batches with padding run their dense layers on the real tokens only and attention on jagged
    sequences (SDPA on nested tensors); losses equal the padded path within 1e-3."""

    def __post_init__(self) -> None:
        _check(isinstance(self.phases, list), f"train.phases must be a list of phases, got {self.phases!r}")
        self.phases = [PhaseConfig.of(p, f"train.phases[{i}]") for i, p in enumerate(self.phases)]
        super().__post_init__()
        _check(
            0 <= self.head_only_steps < self.max_steps,
            f"train.head_only_steps {self.head_only_steps} must be >= 0 and < max_steps {self.max_steps}",
        )
        _check(
            self.min_workers is None or 1 <= self.min_workers <= self.num_workers,
            f"train.min_workers {self.min_workers} must be >= 1 and <= num_workers {self.num_workers}",
        )
        _check(
            self.num_workers <= self.global_batch_size,
            f"train.num_workers {self.num_workers} > global_batch_size {self.global_batch_size}: every worker "
            "needs at least one example of each step",
        )
        for i, ph in enumerate(self.phases):
            for name in ("micro_batch_size", "global_batch_size"):
                v = getattr(ph, name)
                _check(v is None or v >= 1, f"train.phases[{i}].{name} {v} < 1")
            gb = ph.global_batch_size or self.global_batch_size
            _check(
                self.num_workers <= gb,
                f"train.num_workers {self.num_workers} > train.phases[{i}] global_batch_size {gb}: "
                "every worker needs at least one example of each step",
            )
        if self.warmup_fraction is not None:  # derived here, so everything downstream reads warmup_steps
            self.warmup_steps = int(round(self.warmup_fraction * self.max_steps))
        _check(
            self.schedule != "wsd" or self.warmup_steps + self.decay_steps <= self.max_steps,
            f"train.decay_fraction {self.decay_fraction} ({self.decay_steps} steps) and train.warmup_steps "
            f"{self.warmup_steps} leave no room in train.max_steps {self.max_steps} for schedule wsd",
        )
        _check(
            not (self.compile and self.unpad),
            "train.compile and train.unpad cannot both be true: the compiled "
            "encoder wants one shape, unpadded batches have one per batch",
        )
        self.phase_steps()  # validates the phase split

    @property
    def decay_steps(self) -> int:
        """schedule wsd: optimizer steps of the final decay.

        >>> TrainConfig(max_steps=50, schedule="wsd", decay_fraction=0.2).decay_steps
        10
        """
        return int(round(self.decay_fraction * self.max_steps))

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per worker and step at num_workers (`pipeline.pretrain.loader.split_global_batch`).

        >>> TrainConfig(global_batch_size=48, micro_batch_size=16, num_workers=2).accumulation_steps
        2
        """
        share = -(-self.global_batch_size // self.num_workers)  # the largest worker's share
        return -(-share // self.micro_batch_size)

    def phase_steps(self) -> list[int]:
        """Optimizer steps of each phase, summing to max_steps (one phase when `phases` is empty).

        >>> TrainConfig(max_steps=10, phases=[{"fraction": 0.9}, {"max_seq_length": 512}]).phase_steps()
        [9, 1]
        """
        if not self.phases:
            return [self.max_steps]
        steps: list[int] = []
        for i, ph in enumerate(self.phases):
            if ph.steps is not None:
                steps.append(ph.steps)
            elif ph.fraction is not None:
                steps.append(int(round(ph.fraction * self.max_steps)))
            else:
                _check(
                    i == len(self.phases) - 1,
                    f"train.phases[{i}] needs fraction or steps (only the last may omit them)",
                )
                steps.append(self.max_steps - sum(steps))
        _check(
            all(s >= 1 for s in steps) and sum(steps) == self.max_steps,
            f"train.phases steps {steps} must each be >= 1 and sum to train.max_steps {self.max_steps}",
        )
        return steps


@dataclass
class TrackingConfig:
    """MLflow: experiment, registered model name and the alias moved to each new version."""

    experiment: str = "bert-pretrain"
    """MLflow experiment the pretraining runs go to."""
    model_name: str = "bert-pretrain"
    """Registered model that each finished run adds a version to."""
    alias: str = "latest-pretrain"
    """Alias moved to the new version ("latest" is reserved by MLflow)."""
    system_metrics_every_s: float = 10.0
    """psutil sampling period for system metrics on rank 0 (0 disables)."""
    server_wait_s: float = 300.0
    """How long a stage that needs the tracking server (evaluate, register) waits for it to answer before it fails;
    training itself never waits (rank 0 keeps its metrics until the server is back)."""


@dataclass
class EvalConfig:
    """The evaluation suite that scores the registered version (`scorecard` stage, after `register`)."""

    suite: str | None = None
    """A suite YAML (configs/eval/*.yaml, docs/evaluation.md); null: no scorecard stage."""
    baselines: list[str] = field(default_factory=list)
    """Other sources scored beside the new version in the same table (e.g. `scratch:tiny`); each is evaluated once
    per suite file only when it is a registered version (`jobs/evaluate.py` rules)."""
    max_concurrent_trials: int | None = None
    """Trials at once; null: as many as the cluster's CPUs hold (one CPU a trial)."""

    def __post_init__(self) -> None:
        _check(
            self.max_concurrent_trials is None or self.max_concurrent_trials >= 1,
            f"eval.max_concurrent_trials {self.max_concurrent_trials} < 1",
        )


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        # Cross-section checks: sequence lengths must fit the model's position table.
        max_pos = self.model.encoder_config().max_position_embeddings
        _check(
            self.data.max_seq_length <= max_pos,
            f"data.max_seq_length {self.data.max_seq_length} > model max_position_embeddings {max_pos}",
        )
        family = self.model.family
        which = (
            f"model.preset {self.model.preset}"
            if self.model.preset
            else f"model.init {self.model.init} ({family.architecture})"
        )
        _check(family.nsp or not self.data.nsp, f"{which} is MLM-only (no NSP head): set data.nsp false")
        if not family.unpad:  # its own way of skipping padding (ModernBERT's: documents, not unpad/compile)
            from model.family import FAMILIES

            unpadding = " and ".join(f.architecture for f in FAMILIES.values() if f.unpad)
            _check(
                not (self.train.unpad or self.train.compile),
                f"train.unpad and train.compile are {unpadding}'s; {which} keeps packed documents apart itself",
            )
        for i, ph in enumerate(self.train.phases):
            _check(
                ph.max_seq_length <= max_pos,
                f"train.phases[{i}].max_seq_length {ph.max_seq_length} > model max_position_embeddings {max_pos}",
            )
            unknown = sorted(set(ph.source_weights or ()) - set(self.data.source_names()))
            _check(
                not unknown,
                f"train.phases[{i}].source_weights names {', '.join(unknown)}, not a source of "
                f"data.sources ({', '.join(self.data.source_names()) or 'none: data.inputs is one stream'})",
            )
            _check(
                (ph.source_weights is None and ph.mix_temperature is None) or bool(self.data.sources),
                f"train.phases[{i}] sets a mixture, and data.sources is empty",
            )
            _check(
                ph.mask_rate is None or self.data.masking == "dynamic",
                f"train.phases[{i}].mask_rate needs data.masking dynamic (static masks are written at preparation)",
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """`{"train.lr": 0.001, ...}` — what MLflow logs as params."""
        return flatten(self.to_dict())


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_hash(obj: Any) -> str:
    """Stable sha256 of a JSON-able object (dataclasses are converted)."""
    if dataclasses.is_dataclass(obj):
        obj = dataclasses.asdict(obj)
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


SECTIONS: dict[str, type] = {
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "tracking": TrackingConfig,
    "eval": EvalConfig,
}
