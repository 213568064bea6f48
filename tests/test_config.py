"""pipeline.config (TrainConfig/PhaseConfig/TrackingConfig/ModelConfig) and the configs/*.yaml presets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from pipeline.config import ConfigError, DataConfig, PhaseConfig, TrainConfig, load_config

REPO = Path(__file__).resolve().parents[1]

PRESETS = ["tiny", "base", "large", "modernbert-tiny"]


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load_and_every_key_is_commented(repo_root, name):
    path = repo_root / "configs" / f"{name}.yaml"
    cfg = load_config(path)
    assert sum(cfg.train.phase_steps()) == cfg.train.max_steps
    raw = yaml.safe_load(path.read_text())
    assert set(raw) == {"data", "model", "train", "tracking", "eval"}
    for line in path.read_text().splitlines():
        # every `key: value` line (not list items inside a phase) carries a comment saying why
        if re.match(r"^\s+[a-z_]+:\s*\S", line) or re.match(r"^\s+- [a-z_]+:", line):
            assert "#" in line, f"{name}.yaml: uncommented key: {line.strip()}"


def test_modernbert_tiny_is_tinys_budget_packed_by_document(repo_root):
    """The modern encoder's main job: MLM-only rows packed by document at 30%, the wsd schedule, and tiny's token
    slots a step (its step count: bench/studies/modernbert_budget.py)."""
    cfg, tiny = (
        load_config(repo_root / "configs" / "modernbert-tiny.yaml"),
        load_config(repo_root / "configs" / "tiny.yaml"),
    )
    assert cfg.model.family.documents and not tiny.model.family.documents
    assert (cfg.data.nsp, cfg.data.pack_documents, cfg.data.mask_rate, cfg.train.schedule) == (False, True, 0.3, "wsd")
    assert cfg.data.max_predictions_per_seq >= cfg.data.mask_rate * cfg.data.max_seq_length
    assert (
        cfg.train.global_batch_size * cfg.data.max_seq_length == tiny.train.global_batch_size * tiny.data.max_seq_length
    )
    assert cfg.data.inputs == tiny.data.inputs and cfg.data.vocab_size == tiny.data.vocab_size


def test_tiny_reads_the_shared_corpora(repo_root):
    cfg = load_config(repo_root / "configs" / "tiny.yaml")
    assert cfg.data.inputs == ["../shared/corpora"]
    assert (
        cfg.train.global_batch_size == cfg.train.micro_batch_size * cfg.train.num_workers * cfg.train.accumulation_steps
    )


@pytest.mark.parametrize("name,seq", [("base", [128, 512]), ("large", [128, 512]), ("modernbert-base", [1024, 8192])])
def test_gpu_presets_have_two_phases_with_one_schedule(repo_root, name, seq):
    cfg = load_config(repo_root / "configs" / f"{name}.yaml")
    assert [p.max_seq_length for p in cfg.train.phases] == seq
    steps = cfg.train.phase_steps()
    assert steps[0] == round(0.9 * cfg.train.max_steps) and sum(steps) == cfg.train.max_steps
    assert cfg.train.use_gpu and cfg.train.precision in ("bf16", "fp16")


def pretraining_presets() -> list[str]:
    """Every configs/*.yaml with pretraining's sections (finetune.yaml has its own: eval, tune)."""
    return sorted(p.stem for p in (REPO / "configs").glob("*.yaml") if "tune" not in yaml.safe_load(p.read_text()))


@pytest.mark.parametrize("steps", [10, 30])
@pytest.mark.parametrize("name", pretraining_presets())
def test_every_preset_validates_at_a_few_steps(name, steps):
    """Warmup and decay are fractions in every preset, so `--train.max_steps N` keeps their shape for any N >= 10
    (it used to fail: wsd's 20% decay and a 120-step warmup left no room in 30 steps)."""
    init = ["--model.init", "models:/bert-pretrain@latest-pretrain"] if name == "continue" else []
    full = load_config(REPO / "configs" / f"{name}.yaml", init)
    cfg = load_config(REPO / "configs" / f"{name}.yaml", [*init, "--train.max_steps", str(steps)])
    assert full.train.warmup_fraction is not None, f"{name}.yaml: give train.warmup_fraction, not warmup_steps"
    assert cfg.train.warmup_steps == round(full.train.warmup_fraction * steps) < steps
    assert sum(cfg.train.phase_steps()) == steps and cfg.train.warmup_steps + cfg.train.decay_steps <= steps


def test_warmup_fraction_sets_warmup_steps_and_a_warmup_steps_flag_replaces_it():
    """The fraction sets warmup_steps (what the schedule, MLflow's params and the run identity read);
    `--train.warmup_steps` on the command line means those steps even when the config file gives a fraction."""
    assert TrainConfig(max_steps=1200, warmup_fraction=0.1).warmup_steps == 120
    assert TrainConfig(max_steps=25, warmup_fraction=0.1, warmup_steps=7).warmup_steps == 2  # 2.5 rounds to even
    tiny = REPO / "configs" / "tiny.yaml"
    assert load_config(tiny).train.warmup_steps == 120
    over = load_config(tiny, ["--train.max_steps", "24", "--train.warmup_steps", "4"]).train
    assert (over.warmup_steps, over.warmup_fraction) == (4, None)
    both = load_config(tiny, ["--train.warmup_steps", "4", "--train.warmup_fraction", "0.2"]).train
    assert (both.warmup_steps, both.warmup_fraction) == (240, 0.2)
    with pytest.raises(ConfigError, match=re.escape("train.warmup_fraction 1.0 is not in [0, 1)")):
        TrainConfig(warmup_fraction=1.0)


MIX = "[{name: books, inputs: [/c/books], weight: 3}, {name: wiki, inputs: /c/wiki, weight: 1}]"


def test_sources_parse_replace_a_presets_inputs_and_their_inputs_are_the_datas(tmp_path):
    """`--data.sources` on a preset with data.inputs replaces them (data.inputs becomes the sources' inputs), and
    `--data.inputs` on a config file with sources replaces those; a phase takes its own mixture and mask rate."""
    from pipeline.config import SourceConfig

    cfg = load_config(REPO / "configs" / "tiny.yaml", ["--data.sources", MIX])
    assert cfg.data.sources == [SourceConfig("books", ["/c/books"], weight=3), SourceConfig("wiki", ["/c/wiki"], 1)]
    assert cfg.data.inputs == ["/c/books", "/c/wiki"] and cfg.data.mix_temperature == 1.0
    p = tmp_path / "mix.yaml"
    p.write_text(f"data:\n  sources: {MIX}\n  mix_temperature: 0.5\n")
    assert load_config(p, ["--data.inputs", "/d"]).data.sources == []
    assert load_config(p, ["--data.sources", "[{name: d, inputs: /d}]"]).data.inputs == ["/d"]
    phased = load_config(
        p,
        [
            "--data.masking",
            "dynamic",
            "--train.phases",
            "[{fraction: 0.8}, {source_weights: {books: 1}, mask_rate: 0.05}]",
        ],
    )
    assert (phased.train.phases[1].source_weights, phased.train.phases[1].mask_rate) == ({"books": 1}, 0.05)


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--data.sources", "[{name: a, inputs: /a, weight: 0}, {name: b, inputs: /b, weight: 0}]"],
            "data.sources weights 0, 0 do not sum to a positive number",
        ),
        (["--data.sources", "[{name: a, inputs: /a, weight: -1}]"], "data.sources[a].weight -1 must be >= 0"),
        (["--data.sources", "[{name: a, inputs: /a, weight: 1, epochs: 2}]"], "data.sources[a]: give weight or epochs"),
        (
            ["--data.sources", "[{name: a, inputs: /a, weight: 1}, {name: b, inputs: /b}]"],
            "data.sources: b without a weight beside weighted sources",
        ),
        (
            ["--data.sources", "[{name: a, inputs: /a}, {name: a, inputs: /b}]"],
            "data.sources: the name a is given twice",
        ),
        (["--data.sources", "[{name: 'a b', inputs: /a}]"], "data.sources name 'a b' must be letters"),
        (["--data.sources", "[{name: a, inputs: []}]"], "data.sources[a].inputs is empty"),
        (
            ["--data.sources", "[{name: a, inputs: /a}]", "--data.mix_temperature", "0"],
            "data.mix_temperature 0.0 must be > 0",
        ),
        (["--data.sources", "[{name: a, inputs: /a}]", "--data.inputs", "/b"], "data.inputs and data.sources are both"),
        (
            ["--data.sources", MIX, "--train.phases", "[{fraction: 0.5}, {source_weights: {news: 1}}]"],
            "train.phases[1].source_weights names news, not a source of data.sources (books, wiki)",
        ),
        (
            ["--train.phases", "[{source_weights: {news: 1}}]"],
            "train.phases[0].source_weights names news, not a source of data.sources (none: data.inputs is one stream)",
        ),
        (
            ["--data.sources", MIX, "--train.phases", "[{source_weights: {books: 0}}]"],
            "train.phases source_weights {'books': 0.0} are not weights >= 0 summing to a positive number",
        ),
        (
            ["--data.sources", MIX, "--train.phases", "[{mix_temperature: -1}]"],
            "train.phases mix_temperature -1.0 must be > 0",
        ),
        (
            ["--data.masking", "static", "--train.phases", "[{mask_rate: 0.1}]"],
            "train.phases[0].mask_rate needs data.masking dynamic",
        ),
    ],
)
def test_a_bad_mixture_is_one_line_naming_the_field(args, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        load_config(None, args)


def test_phase_steps_from_fractions_steps_and_remainder():
    assert TrainConfig(max_steps=100, phases=[{"fraction": 0.7}, {"max_seq_length": 512}]).phase_steps() == [70, 30]
    assert TrainConfig(max_steps=10, phases=[{"steps": 4}, {"steps": 6, "max_seq_length": 256}]).phase_steps() == [4, 6]
    assert TrainConfig(max_steps=7).phase_steps() == [7]
    with pytest.raises(ConfigError, match="sum to train.max_steps 10"):
        TrainConfig(max_steps=10, phases=[{"steps": 4}, {"steps": 5}])
    with pytest.raises(ConfigError, match=r"phases\[0\] needs fraction or steps"):
        TrainConfig(max_steps=10, phases=[{}, {"steps": 5}])


def test_phases_parse_from_the_command_line():
    cfg = load_config(
        None,
        [
            "--train.max_steps",
            "20",
            "--train.phases",
            "[{fraction: 0.5, max_seq_length: 64}, {max_seq_length: 128, micro_batch_size: 8}]",
        ],
    )
    assert cfg.train.phases == [
        PhaseConfig(max_seq_length=64, fraction=0.5),
        PhaseConfig(max_seq_length=128, micro_batch_size=8),
    ]
    assert cfg.train.phase_steps() == [10, 10]
    with pytest.raises(ConfigError, match=r"^train.phases: Option 'seq_len' is not accepted$"):
        load_config(None, ["--train.phases", "[{seq_len: 64}]"])


def test_phases_on_the_command_line_replace_the_config_files(repo_root):
    """A typed list is the list: nothing of the YAML's phases (their `output` here) is merged into it, found when
    the GPU run's `--data.output` and `--train.phases` still wrote configs/base.yaml's /mnt/shared paths."""
    base = repo_root / "configs" / "base.yaml"
    assert load_config(base, []).train.phases[0].output == "/mnt/shared/data/base-128"
    cfg = load_config(
        base,
        ["--data.output", "/tmp/b", "--train.phases=[{max_seq_length: 128, fraction: 0.5}, {max_seq_length: 256}]"],
    )
    assert cfg.train.phases == [PhaseConfig(max_seq_length=128, fraction=0.5), PhaseConfig(max_seq_length=256)]
    with pytest.raises(ConfigError, match="fraction 2.0"):  # checked again after the replacement
        load_config(base, ["--train.phases", "[{fraction: 2.0}]"])


@pytest.mark.parametrize(
    "override,message",
    [
        (["--train.global_batch_size", "2", "--train.num_workers", "3"], "train.num_workers 3 > global_batch_size 2"),
        (["--train.optimizer", "sgd"], "train.optimizer 'sgd'"),
        (["--train.schedule", "cosine"], "train.schedule 'cosine'"),
        (["--train.precision", "fp8"], "train.precision 'fp8'"),
        (["--train.poly_power", "0"], "train.poly_power 0"),
        (["--train.decay_fraction", "1.5"], "train.decay_fraction 1.5 is not in [0, 1]"),
        (
            [
                "--train.schedule",
                "wsd",
                "--train.max_steps",
                "20",
                "--train.warmup_steps",
                "10",
                "--train.decay_fraction",
                "0.6",
            ],
            "train.decay_fraction 0.6 (12 steps) and train.warmup_steps 10",
        ),
        (["--train.checkpoint_every_steps", "0"], "train.checkpoint_every_steps 0"),
        (["--train.cpus_per_worker", "0"], "train.cpus_per_worker 0"),
        (["--train.phases", "[{fraction: 2.0}]"], "fraction 2.0"),
        (
            ["--model.preset", "modernbert-tiny", "--data.nsp", "true"],
            "model.preset modernbert-tiny is MLM-only (no NSP head): set data.nsp false",
        ),
        (
            ["--model.preset", "modernbert-tiny", "--data.nsp", "false", "--train.unpad", "true"],
            "train.unpad and train.compile are BERT's",
        ),
    ],
)
def test_bad_values_name_the_field(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, override)


def test_unpad_parses_and_is_refused_with_compile():
    assert load_config(None, ["--train.unpad", "true"]).train.unpad is True
    assert load_config(None, []).train.unpad is False
    with pytest.raises(ConfigError, match=re.escape("train.compile and train.unpad cannot both be true")):
        load_config(None, ["--train.unpad", "true", "--train.compile", "true"])


def test_phase_batch_sizes_are_checked():
    """Any micro-batch cap goes (each worker's share is cut at it); a phase's global batch needs a row per worker."""
    ok = TrainConfig(
        num_workers=2,
        micro_batch_size=8,
        global_batch_size=32,
        phases=[{"fraction": 0.5}, {"micro_batch_size": 24}],
        max_steps=10,
    )
    assert ok.phases[1].micro_batch_size == 24 and ok.accumulation_steps == 2
    with pytest.raises(ConfigError, match=r"train.num_workers 4 > train.phases\[1\] global_batch_size 3"):
        TrainConfig(
            num_workers=4,
            micro_batch_size=8,
            global_batch_size=32,
            phases=[{"fraction": 0.5}, {"global_batch_size": 3}],
            max_steps=10,
        )


def test_model_overrides_take_bertconfig_fields():
    cfg = load_config(None, ["--model.preset", "mini", "--model.overrides.hidden_dropout_prob", "0.0"])
    assert cfg.model.preset == "mini" and cfg.model.overrides == {"hidden_dropout_prob": 0.0}
    with pytest.raises(ConfigError, match=r"^unrecognized arguments: --model.hidden_dropout_prob 0.0$"):
        load_config(None, ["--model.hidden_dropout_prob", "0.0"])  # a BertConfig field goes under model.overrides


# ------------------------------------------------------------------------------------------ errors, before any work


@pytest.mark.parametrize(
    "args,message",
    [
        (["--train.global_batch_size", "0"], "train.global_batch_size 0 < 1"),
        (["--train.micro_batch_size", "-1"], "train.micro_batch_size -1 < 1"),
        (
            ["--train.num_workers", "64", "--train.global_batch_size", "32"],
            "train.num_workers 64 > global_batch_size 32",
        ),
        (
            ["--train.phases", "[{max_seq_length: 64, micro_batch_size: 0}]"],
            r"train.phases\[0\].micro_batch_size 0 < 1",
        ),
        (["--model.preset", "huge"], "model: unknown preset 'huge'"),
        (
            ["--model.overrides.num_attention_heads", "3"],
            "model: hidden_size 128 is not divisible by num_attention_heads 3",
        ),
        (["--data.max_seq_length", "1024"], "data.max_seq_length 1024 > model max_position_embeddings 512"),
        (
            ["--train.phases", "[{max_seq_length: 1024}]"],
            r"train.phases\[0\].max_seq_length 1024 > model max_position_embeddings 512",
        ),
        (
            ["--model.overrides.max_position_embeddings", "64"],
            "data.max_seq_length 128 > model max_position_embeddings 64",
        ),
        (["--train.lr", "abc"], "train.lr 'abc' is not a number"),
        (["--train.max_steps", "1.5"], "train.max_steps 1.5 is not an integer"),
        (["--train.use_gpu", "maybe"], "train.use_gpu 'maybe' is not true or false"),
        (["--train.precision", "fp8"], "train.precision 'fp8' is not one of fp32, bf16, fp16"),
        (["--data.masking", "sometimes"], "data.masking 'sometimes' is not one of static, dynamic"),
    ],
)
def test_bad_values_name_the_section_and_field(args, message):
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "configs" / "tiny.yaml", args)


def test_values_are_read_as_yaml_1_2(tmp_path):
    """PyYAML's YAML 1.1 reads `1e-4` as a string and `off` as false; the parser reads YAML 1.2: a number, a string.
    One path given alone is a one-element list."""
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  lr: 1e-4\n  max_steps: 30\n  use_gpu: false\ndata:\n  inputs: /data/books\n  dedup: off\n")
    cfg = load_config(p, ["--train.warmup_steps", "10", "--train.weight_decay", "1e-2"])
    assert cfg.train.lr == 1e-4 and isinstance(cfg.train.lr, float)
    assert cfg.train.max_steps == 30 and cfg.train.warmup_steps == 10 and cfg.train.weight_decay == 0.01
    assert cfg.train.use_gpu is False and cfg.data.inputs == ["/data/books"] and cfg.data.dedup == "off"
    assert load_config(None, ["--data.inputs", "[/a, /b]"]).data.inputs == ["/a", "/b"]


def test_quoted_numbers_and_booleans_are_still_taken_and_a_float_is_no_integer(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  max_steps: '30'\n  use_gpu: 'false'\n")
    cfg = load_config(p)
    assert cfg.train.max_steps == 30 and cfg.train.use_gpu is False
    with pytest.raises(ConfigError, match=r"^train.warmup_steps 10.0 is not an integer$"):
        load_config(None, ["--train.warmup_steps", "1e1"])


def test_a_config_file_is_read_first_wherever_it_stands(repo_root):
    """`--section.field` flags override the config file even when `--config` comes after them."""
    cfg = load_config(None, ["--train.max_steps", "7", "--config", str(repo_root / "configs" / "tiny.yaml")])
    assert cfg.train.max_steps == 7 and cfg.data.inputs == ["../shared/corpora"]


@pytest.mark.parametrize(
    "text,message",
    [
        ("train: 5\n", "config section train must be a mapping"),
        ("train:\n  - lr\n", "config section train must be a mapping"),
        ("train:\n  phases: {max_seq_length: 64}\n", "train.phases .* is not a list"),
        ("- a\n- b\n", "must be a mapping of sections"),
    ],
)
def test_non_mapping_sections_are_named(tmp_path, text, message):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(p)


# ------------------------------------------------------------------------------------------ --help and stable hashes


def _help_entries(text: str) -> dict[str, str]:
    """`--help` output as {option: its whole entry, whitespace collapsed} (argparse wraps long lines)."""
    entries: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^  (--[\w.-]+)", line)
        if m:
            current = m.group(1)
            entries[current] = ""
        elif not line.startswith("  "):
            current = None
        if current:
            entries[current] += " " + line.strip()
    return {k: " ".join(v.split()) for k, v in entries.items()}


@pytest.mark.parametrize(
    "job,expect",
    [
        (
            "jobs/pretrain.py",
            [
                ("--train.lr", "Peak learning rate", "default: 0.001"),
                ("--train.max_steps", "Optimizer steps in the whole run", "default: 100"),
                ("--data.inputs", "Files or folders (recursively)", "default: []"),
                ("--model.preset", "One of tiny, mini", "default: tiny"),
                ("--tracking.alias", "Alias moved to the new version", "default: latest-pretrain"),
                ("--config", "YAML preset", ""),
            ],
        ),
        (
            "jobs/prepare_data.py",
            [
                ("--data.vocab_size", "Size of the vocabulary to train", "default: 30522"),
                ("--data.masking", "static: masked at preparation", "default: static"),
                ("--input", "file or folder", ""),
                ("--vocab-size", "train a vocabulary", ""),
                ("--tokenizer", "(data.tokenizer)", ""),
            ],
        ),
        (
            "jobs/finetune.py",
            [
                ("--train.lr", "Peak LR; `auto` picks it", "default: auto"),
                ("--train.seed", "Seeds the head's init", "default: 42"),
                ("--train.num_workers", "Ray Train workers", "default: 1"),
                ("--tune.lr", "Peak LRs to try", "default: null"),
                ("--eval.n_best", "Start and end logits", "default: 20"),
                ("--task", "question-answering", ""),
            ],
        ),
    ],
)
def test_every_job_help_lists_the_fields_with_doc_and_default(job, expect):
    import dataclasses
    import subprocess
    import sys

    import pipeline.config as config

    p = subprocess.run([sys.executable, str(REPO / job), "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    entries = _help_entries(p.stdout)
    for option, doc, default in expect:
        assert doc in entries[option] and default in entries[option], (option, entries.get(option))
    sections = {
        "pretrain": "data model train tracking",
        "prepare_data": "data",
        "finetune": "data model train eval tracking tune",
    }
    cls = {"data": "DataConfig", "model": "ModelConfig", "train": "TrainConfig", "tracking": "TrackingConfig"}
    if "finetune" not in job:  # every field of every section the job reads is listed, each with a default
        for section in sections[Path(job).stem].split():
            for f in dataclasses.fields(getattr(config, cls[section])):
                assert "default:" in entries[f"--{section}.{f.name}"], f"{job}: --{section}.{f.name}"


# Captured with the hand-written parser before the training fields moved to BaseTrainConfig: hashes key prepared
# data and runs, so the presets must keep loading to exactly these.
PRESET_HASHES = {
    "tiny.yaml": "dc4dff4c2eaca92c93d0fdb8f22c0995fa48bc60243c34b9c4f2c9733db55d00",
    "base.yaml": "49a2b99664aa2fa30624819fd3bb2e8d823ecf3d7afa7572a21060a49bcfe936",
    "large.yaml": "938fb3700793bd0981b09326e98d26d0a12615429a0948992b2fd407a021b8e8",
    "finetune.yaml": "8395f5c330a32ee76c1a8bfe401ecf0ec13577d1ad7fe6aa221b4f8bf72fa9ee",
}


# Data fields added after the capture (dedup: issue 20; MediaWiki dumps: issue 24), left out of the comparison.
ADDED_SINCE = (
    "dedup",
    "dedup_threshold",
    "dedup_num_perm",
    "wiki_keep_lists",
    "wiki_keep_headings",
    "pack_documents",
    "sources",
    "mix_temperature",
    "max_record_bytes",
)  # mixtures: issue 58; max_record_bytes: 59
# Training fields added since (train.compile, train.unpad: issue 18; train.head_only_steps: issue 21), left out
# likewise.
TRAIN_ADDED_SINCE = (
    "compile",
    "head_only_steps",
    "unpad",
    "decay_fraction",
    "min_workers",
    "checkpoint_upload",
    "warmup_fraction",
    "decay_shape",
)  # decay_fraction: 33; min_workers, checkpoint_upload: 34; 58
# Tracking fields added since (tracking.server_wait_s: issue 22), left out likewise.
TRACKING_ADDED_SINCE = ("server_wait_s",)
# A phase's fields added since (its mixture and masking rate: issue 58), left out likewise.
PHASE_ADDED_SINCE = ("source_weights", "mix_temperature", "mask_rate")


@pytest.mark.parametrize("name", sorted(PRESET_HASHES))
def test_presets_load_to_the_same_values_as_before(name):
    import dataclasses

    from pipeline.config import config_hash
    from pipeline.finetune.config import load_finetune_config

    load = load_finetune_config if name == "finetune.yaml" else load_config
    d = dataclasses.asdict(load(REPO / "configs" / name))
    d["data"] = {k: v for k, v in d["data"].items() if k not in ADDED_SINCE}
    if name != "finetune.yaml":  # data.tokenizer_sample_bytes was data.vocab_sample_chars until issue 57
        d["data"]["vocab_sample_chars"] = d["data"].pop("tokenizer_sample_bytes")
    if name != "finetune.yaml":  # data.tokenizer (issue 57); fine-tuning's data.tokenizer is another, older field
        del d["data"]["tokenizer"]
    if d["model"].get("init", "absent") is None:  # model.init (issue 21): null leaves a preset as it was
        del d["model"]["init"]
    d["train"] = {k: v for k, v in d["train"].items() if k not in TRAIN_ADDED_SINCE}
    for ph in d["train"].get("phases", []):
        for k in PHASE_ADDED_SINCE:
            del ph[k]
    d["tracking"] = {k: v for k, v in d["tracking"].items() if k not in TRACKING_ADDED_SINCE}
    if name != "finetune.yaml":  # pretraining's eval section (the scorecard stage: issue 56) came after the capture
        del d["eval"]
    d.pop("embedding", None)  # fine-tuning's embedding section (--task embedding: issue 60) came after it too
    if (
        name == "large.yaml"
    ):  # micro-batches raised since, by the H200 figures (bench/RESULTS.md, GPU): 64 -> 256, 8 -> 32
        t = d["train"]
        assert (t["micro_batch_size"], t["phases"][0]["micro_batch_size"], t["phases"][1]["micro_batch_size"]) == (
            256,
            256,
            32,
        )
        t["micro_batch_size"], t["phases"][0]["micro_batch_size"], t["phases"][1]["micro_batch_size"] = 64, 64, 8
    assert config_hash(d) == PRESET_HASHES[name]


def test_prepare_data_short_flags_are_aliases_in_the_one_parser(repo_root, tmp_path):
    """`--input` (repeatable), `--output`, `--vocab-size`... set their `data` fields; flags override the config file
    (`--input` replaces its inputs, `--vocab-size` drops its vocab); `--data.field` and a short flag mean the same."""
    from conftest import load_job
    from pipeline.config import parse

    job = load_job("prepare_data")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data:\n  inputs: [/from/config]\n  vocab: /v.txt\n  seed: 3\n")
    args, s = parse(
        job.parser(),
        [
            "--input",
            "/a",
            "--config",
            str(cfg),
            "--input",
            "/b",
            "--output",
            "o",
            "--vocab-size",
            "600",
            "--masking",
            "dynamic",
            "--num-cpus",
            "2",
        ],
        {"data": None},
    )
    d = s["data"]
    assert d.inputs == ["/a", "/b"] and d.output == "o" and d.vocab is None and d.vocab_size == 600
    assert d.masking == "dynamic" and d.seed == 3 and args.num_cpus == 2
    _, s = parse(job.parser(), ["--config", str(cfg), "--data.max_seq_length", "64"], {"data": None})
    assert s["data"].inputs == ["/from/config"] and s["data"].vocab == "/v.txt" and s["data"].max_seq_length == 64
    with pytest.raises(ConfigError, match="not allowed with argument"):
        parse(job.parser(), ["--vocab", "v.txt", "--vocab-size", "600"], {"data": None})


def test_the_private_hooks_the_parser_relies_on_hold():
    """`pipeline.config.parser` leans on internals of jsonargparse and argparse, and pyproject.toml pins jsonargparse
    to the minor version it is tested against. An upgrade that moves one fails here, naming it: the pin itself,
    `jsonargparse._loaders_dumpers.get_yaml_default_loader` (the YAML loader whose bool resolver is replaced),
    argparse's `_option_string_actions` (each section's `--<section>` flag moved out of the way) and the texts of
    jsonargparse's type errors that `one_line` rewrites (`WRONG_TYPE`, `NO_UNION_SUBTYPE`, `UNION_KINDS`)."""
    import argparse
    import tomllib
    from importlib.metadata import version

    import yaml
    from jsonargparse import ArgumentParser
    from jsonargparse._loaders_dumpers import get_yaml_default_loader
    from packaging.requirements import Requirement

    from pipeline.config import SECTIONS
    from pipeline.config import parser as p
    from pipeline.finetune.config import FT_SECTIONS

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(Requirement(d) for d in deps if Requirement(d).name == "jsonargparse")
    assert version("jsonargparse") in pin.specifier and "<" in str(pin.specifier), (version("jsonargparse"), pin)

    loader = get_yaml_default_loader()
    tags = {tag for resolvers in loader.yaml_implicit_resolvers.values() for tag, _ in resolvers}
    assert "tag:yaml.org,2002:bool" in tags and yaml.load("x: 1e-4", Loader=loader) == {"x": 1e-4}
    assert p._yaml12_load("a: off\nb: 1e-4\nc: true") == {"a": "off", "b": 1e-4, "c": True}

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(SECTIONS["train"], "train")
    assert "--train" in parser._option_string_actions  # jsonargparse's per-section config file flag
    p._free_section_flag(parser, "train")
    assert "--train" not in parser._option_string_actions
    assert parser._option_string_actions["--train-config"].help == argparse.SUPPRESS

    def error(sections: dict, argv: list[str]) -> str:
        with pytest.raises(argparse.ArgumentError) as e:
            p.config_parser(sections).parse_args(argv)
        return " ".join(str(e.value).split())

    text = error(SECTIONS, ["--train.lr", "abc"])
    assert p.WRONG_TYPE.fullmatch(text), text
    text = error(FT_SECTIONS, ["--train.lr", "abc"])  # float | Literal["auto"]
    m = p.NO_UNION_SUBTYPE.fullmatch(text)
    assert m and p.UNION_KINDS.findall(m.group(2)) == ["<class 'float'>", "typing.Literal['auto']"], text
    assert p.one_line(argparse.ArgumentError(None, text)) == "train.lr 'abc' is not a number or auto"


def test_prepare_data_reads_a_presets_data_section_only():
    """`jobs/prepare_data.py --config configs/tiny.yaml` (docs/cluster.md) takes the preset's data section; its
    model, train, tracking and eval sections are the pretraining job's (they were refused as unknown options)."""
    from conftest import load_job
    from pipeline.config import parse

    argv = ["--config", str(REPO / "configs" / "tiny.yaml"), "--input", "/x", "--output", "/y"]
    _, sections = parse(load_job("prepare_data").parser(), argv, {"data": None}, config_sections=("data",))
    data = sections["data"]
    assert data.vocab_size == 8000 and data.mask_rate == 0.3 and data.output == "/y"


@pytest.mark.parametrize(
    "cls, prefix",
    [(DataConfig, "data."), (TrainConfig, "train."), (PhaseConfig, "train.phases ")],
    ids=["data", "train", "phase"],
)
def test_every_bound_is_on_the_field_type_and_refused_in_one_line(cls, prefix):
    """Issue 63: numeric bounds live in the fields' types (`Annotated[int, Bound(1)]`), checked in one place for
    YAML, the command line and Python alike: each bounded field just outside its bound is one line naming it."""
    from pipeline.config.sections import _bounds

    bounds = dict(_bounds(cls))
    assert len(bounds) >= {"data.": 17, "train.": 17, "train.phases ": 5}[prefix]
    for name, b in bounds.items():
        if b.hi is not None:
            bad = b.hi + (0 if b.hi_open else 1)
        else:
            bad = b.lo - (0 if b.lo_open else 1)
        if isinstance(getattr(cls(), name, None), float) or isinstance(b.lo, float) or b.lo_open:
            bad = float(bad)
        with pytest.raises(ConfigError, match="^" + re.escape(f"{prefix}{name} {bad} ")):
            cls(**{name: bad})
