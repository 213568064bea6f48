"""The one parser of every job's command line and config file: jsonargparse reads the YAML preset (`--config FILE`)
and every `--section.field value`, checks each value against its dataclass field's type, and builds the section
dataclasses (`pipeline.config.sections`); each job's `--help` comes from the same parser (every field with its
docstring line, type and default), and a job adds its own flags to it (`config_parser`, then `parse`).

jsonargparse is chosen over tyro because it is built for this shape: YAML config files, dotted `--section.field`
keys whose values are read as YAML, and help generated from the dataclasses' attribute docstrings (docstring-parser);
litgpt uses it the same way. What the project adds, each in the library's own terms:

- Values are read as YAML 1.2 (a loader registered with jsonargparse): `1e-4` is a number (PyYAML's YAML 1.1 reads
  it as a string) and only true/false are booleans, so `dedup: off` is the string `off` (YAML 1.1: false).
- A field that takes one path or a list is typed so (`data.inputs: list[str] | str`, one path given alone becomes
  a one-element list), and `tune.lr: list[float] | str` takes `1e-4,3e-4` (split in the dataclass).
- A config file's values come first and `--section.field` flags override them, wherever `--config` stands.
- A config file may be a URI (s3://...), read through fsspec like every other input; it is checked to be a mapping
  of sections, each a mapping, with one-line errors (an unknown section or field is jsonargparse's error).
- Every error is one line naming the field (`ConfigError`): `train.lr 'abc' is not a number`.

Quoted numbers and booleans (`max_steps: '30'`, `use_gpu: 'false'`) are still taken: jsonargparse reads a string
value once more by the field's type. Not kept from the hand-written coercer this replaced: a whole number written
as a float for an integer field (`--train.warmup_steps 1e1`: `train.warmup_steps 10.0 is not an integer`), and
BertConfig fields directly under `model` (`--model.hidden_dropout_prob 0.0` is now
`--model.overrides.hidden_dropout_prob 0.0`, as fine-tuning always had it).

    >>> from pipeline.config.sections import SECTIONS
    >>> s = load_sections(None, ["--train.max_steps", "30", "--data.inputs", "/data/books"], SECTIONS)
    >>> s["train"].max_steps, s["data"].inputs
    (30, ['/data/books'])
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
from typing import Any

import yaml

from pipeline.config.sections import ConfigError, _check

_LOADER_MODE = "yaml1.2"


def _yaml12_load(text: str) -> Any:
    """YAML as version 1.2 reads it: only true/false are booleans; `1e-4` is a float (jsonargparse's fix)."""
    return yaml.load(text, Loader=_yaml12_loader())


@functools.cache
def _yaml12_loader() -> type:
    from jsonargparse._loaders_dumpers import get_yaml_default_loader  # its float resolver (1e-4, 1.5e3, .5)

    base = get_yaml_default_loader()

    class Yaml12Loader(base):  # type: ignore[misc, valid-type]
        yaml_implicit_resolvers = {
            k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:bool"]
            for k, v in base.yaml_implicit_resolvers.items()
        }

    Yaml12Loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
    )
    return Yaml12Loader


def _free_section_flag(parser: Any, name: str) -> None:
    """jsonargparse gives each section a `--<section> FILE` option (a config file for that section alone). Its flag
    moves out of the way and out of --help (`--<section>-config`): --config is this project's one config file, and
    `--model`, `--train`, `--eval` are fine-tuning's own flags (DESIGN.md; `jobs/finetune.py` renames them)."""
    action = parser._option_string_actions.pop(f"--{name}", None)
    if action is not None:
        action.option_strings = [f"--{name}-config"]
        action.help = argparse.SUPPRESS
        parser._option_string_actions[f"--{name}-config"] = action


class Given(list):
    """The list a repeatable alias flag builds (`--input a --input b`): the first flag replaces what a config file
    gave, the later ones extend it."""


class AppendAlias(argparse.Action):
    """A repeatable short flag for a list field (`--input` for `data.inputs`)."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ARG002 - argparse's signature
        current = namespace.get(self.dest)
        namespace[self.dest] = Given([*current, values] if isinstance(current, Given) else [values])


def config_parser(sections: dict[str, type], description: str | None = None) -> Any:
    """A job's parser: `--config FILE` and, per section, every `--section.field` with its doc line, type and default
    (read from the dataclass). The job adds its own flags (`alias` for short names of fields) and calls `parse`."""
    from jsonargparse import ActionConfigFile, ArgumentParser, DefaultHelpFormatter, set_loader, set_parsing_settings

    class Formatter(DefaultHelpFormatter, argparse.RawDescriptionHelpFormatter):
        """Keeps the job docstring's own line breaks."""

    set_loader(_LOADER_MODE, _yaml12_load, exceptions=(yaml.YAMLError,))
    set_parsing_settings(docstring_parse_attribute_docstrings=True)
    parser = ArgumentParser(
        description=description,
        exit_on_error=False,
        conflict_handler="resolve",
        usage="%(prog)s [options] [--config FILE] [--section.field VALUE ...]",
        formatter_class=Formatter,
        env_prefix=False,
        default_env=False,
        parser_mode=_LOADER_MODE,
    )
    parser.add_argument(
        "--config",
        action=ActionConfigFile,
        help="YAML preset (sections: "
        + ", ".join(sections)
        + "); `--section.field value` overrides it, the value read as YAML",
    )
    for name, cls in sections.items():
        parser.add_class_arguments(cls, name)
        _free_section_flag(parser, name)
    return parser


def alias(parser: Any, flag: str, field: str, **kwargs: Any) -> None:
    """`flag` (e.g. `--output`) sets `field` (`data.output`) as `--data.output` does; unset, it changes nothing."""
    parser.add_argument(flag, dest=field, default=argparse.SUPPRESS, **kwargs)


def read_config_file(path: str, keep: tuple[str, ...] | None = None) -> str:
    """The text of config file `path` (a local path or a URI), checked to be a mapping of sections, each a mapping;
    with `keep`, only those sections (a job that reads one section of a preset: prepare_data's `data`)."""
    from pipeline.storage.io import filesystem  # fsspec: a config file may be a URI (s3://...) like every other input

    fs, p = filesystem(str(path))
    _check(fs.isfile(p), f"config file {path} does not exist")
    text = fs.read_text(p, encoding="utf-8")
    try:
        raw = _yaml12_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    _check(raw is None or isinstance(raw, dict), f"config file {path} must be a mapping of sections")
    for section, values in (raw or {}).items():
        _check(
            values is None or isinstance(values, dict),
            f"config section {section} must be a mapping of field: value, got {type(values).__name__} {values!r}",
        )
    if keep is not None and raw:
        return yaml.safe_dump({k: v for k, v in raw.items() if k in keep}, sort_keys=False)
    return text if raw else "{}"


def _describe(expected: str) -> str:
    """jsonargparse's name of a type, as an error message says it: `<class 'float'>` -> `a number`."""
    m = re.fullmatch(r"typing\.Literal\[(.*)\]", expected)
    if m:
        return "one of " + ", ".join(x.strip().strip("'\"") for x in m.group(1).split(","))
    name = re.sub(r"<class '(\w+)'>", r"\1", expected)
    return {"bool": "true or false", "int": "an integer", "float": "a number"}.get(name, f"a {name}")


def _shown(value: str) -> str:
    """A value as an error message shows it: numbers bare, anything else quoted (`1.5`, `'abc'`)."""
    try:
        loaded = _yaml12_load(value)
    except yaml.YAMLError:
        loaded = value
    return value if isinstance(loaded, (int, float)) and not isinstance(loaded, bool) else repr(value)


# jsonargparse's error texts (4.53, whitespace collapsed) that `one_line` rewrites; tests/test_config.py checks them
# against the installed jsonargparse, so an upgrade that rewords them fails there, not in a user's error line.
WRONG_TYPE = re.compile(r'Parser key "([^"]+)": Expected a (.+?)\. Got value: (.*)')
NO_UNION_SUBTYPE = re.compile(
    r'Parser key "([^"]+)": Does not validate against any of the Union subtypes Subtypes: '
    r"\[(.*?)\] Errors: .* Given value: (.*)"
)
UNION_KINDS = re.compile(r"<class '\w+'>|typing\.Literal\[[^\]]*\]")


def one_line(e: BaseException) -> str:
    """jsonargparse's error as one line naming the field:
    `Parser key "train.lr":\n  Expected a <class 'float'>. Got value: abc` -> `train.lr 'abc' is not a number`."""
    text = " ".join(str(e).split())
    text = re.sub(r"Problem with given class_path '[\w.]+': ", "", text)
    m = WRONG_TYPE.fullmatch(text)
    if m:
        return f"{m.group(1)} {_shown(m.group(3))} is not {_describe(m.group(2))}"
    m = NO_UNION_SUBTYPE.fullmatch(text)
    if m:  # `float | Literal["auto"]` -> "a number or auto"
        kinds = UNION_KINDS.findall(m.group(2))
        return f"{m.group(1)} {_shown(m.group(3))} is not {' or '.join(_describe(k).removeprefix('one of ') for k in kinds)}"  # noqa: E501
    return re.sub(r'^Parser key "([^"]+)":', r"\1:", text)


def _split_config(argv: list[str]) -> tuple[str | None, list[str]]:
    """(the `--config FILE` value or None, the other arguments)."""
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1], argv[:i] + argv[i + 2 :]
        if a.startswith("--config="):
            return a.split("=", 1)[1], argv[:i] + argv[i + 1 :]
    return None, list(argv)


def config_path(argv: list[str]) -> str | None:
    """The config file a command line names (`--config FILE`), for the storage check before it is read.

    >>> config_path(["--train.lr", "1e-4", "--config", "s3://b/base.yaml"])
    's3://b/base.yaml'
    """
    return _split_config(argv)[0]


def _values_as_values(argv: list[str]) -> list[str]:
    """`--train.lr -3e-4` as `--train.lr=-3e-4`: argparse takes a value that starts with `-` and is not a plain
    negative number (an exponent) for an option.

    >>> _values_as_values(["--train.lr", "-3e-4", "--train.max_steps", "3"])
    ['--train.lr=-3e-4', '--train.max_steps', '3']
    """
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if (
            a.startswith("--")
            and "." in a
            and "=" not in a
            and i + 1 < len(argv)
            and argv[i + 1].startswith("-")
            and not argv[i + 1].startswith("--")
        ):
            out.append(f"{a}={argv[i + 1]}")
            i += 2
        else:
            out.append(a)
            i += 1
    return out


def parse(
    parser: Any,
    argv: list[str],
    sections: dict[str, type],
    renames: dict[str, str] | None = None,
    config_sections: tuple[str, ...] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """(the parsed namespace, for the job's own flags; {section: its dataclass}) from `argv`. The config file is read
    first, whatever its place, so that every `--section.field` flag overrides it. `renames` maps a flag the user
    types to the name the parser knows it by; `config_sections` keeps only those sections of the config file (a
    preset's others are another job's). A bad argument is a ConfigError."""
    renames = renames or {}
    argv = [renames.get(flag, flag) + eq + value for flag, eq, value in (a.partition("=") for a in argv)]
    path, rest = _split_config(_values_as_values(argv))
    config = ["--config", read_config_file(path, config_sections)] if path not in (None, "", "null") else []
    typed = {flag[2:] for flag, _, _ in (a.partition("=") for a in rest) if flag.startswith("--")}
    try:
        ns = parser.parse_args(config + rest)
        for key, cleared in CLEARING.items():  # before the dataclasses check the pair together
            section, name = cleared.split(".")
            if key in typed and cleared not in typed and section in sections:
                ns[cleared] = _default(sections[section], name)
        built = parser.instantiate(ns)
    except argparse.ArgumentError as e:
        line = one_line(e)
        for typed, known in renames.items():
            line = line.replace(known, typed)
        raise ConfigError(line) from None
    except TypeError as e:  # a dataclass given what it cannot take, e.g. a nested mapping where a scalar belongs
        raise ConfigError(f"bad config: {e}") from None
    for key, value in _replacing_lists(rest).items():
        section, name = key.split(".")
        if section in sections:
            changes = {name: value}
            cleared = CLEARING.get(key, "")
            if cleared and cleared not in typed:  # what the merged list derived it from is gone
                changes[cleared.split(".")[1]] = _default(sections[section], cleared.split(".")[1])
            built[section] = dataclasses.replace(built[section], **changes)  # validated again
    return built, {name: built[name] for name in sections}


def _default(cls: type, name: str) -> Any:
    """The default of dataclass `cls`'s field `name`."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


REPLACING_LISTS = ("train.phases", "data.sources")
"""Lists of dataclasses that a command-line flag replaces whole. jsonargparse merges such a list item by item
with the config file's (a `--train.phases` of two phases kept each YAML phase's `output`): a user who types the
list means that list."""


CLEARING = {"train.warmup_steps": "train.warmup_fraction", "data.sources": "data.inputs", "data.inputs": "data.sources"}
"""A field that, given on the command line, sets another to its default unless the command line gives that one
too: a preset's warmup_fraction would otherwise win over `--train.warmup_steps 4`, which means 4 steps, and a
preset's data.inputs clash with `--data.sources` (and its sources with `--data.inputs`)."""


def _replacing_lists(argv: list[str], keys: tuple[str, ...] = REPLACING_LISTS) -> dict[str, Any]:
    """{`section.field`: the last value given} for the `keys` flags in `argv`, read as YAML 1.2.

    >>> _replacing_lists(["--train.phases", "[{max_seq_length: 128}]", "--train.lr", "1e-4"])
    {'train.phases': [{'max_seq_length': 128}]}
    """
    out: dict[str, Any] = {}
    for i, a in enumerate(argv):
        flag, eq, value = a.partition("=")
        if flag.startswith("--") and flag[2:] in keys and (eq or i + 1 < len(argv)):
            out[flag[2:]] = _yaml12_load(value if eq else argv[i + 1])
    return out


def load_sections(
    path: str | os.PathLike | None, overrides: list[str] | None, sections: dict[str, type]
) -> dict[str, Any]:
    """{section: dataclass instance} from a YAML file (or the defaults when `path` is None) plus
    `--section.field value` overrides; the pretraining and fine-tuning configs are read through this."""
    argv = (["--config", str(path)] if path is not None else []) + list(overrides or [])
    return parse(config_parser(sections), argv, sections)[1]
