"""A tokenizer's special tokens, whatever it names them: each role's token and id (cls, sep, pad, mask, unk), the
pair template, the ids never masked and how its pieces mark words (`Specials`, read by `specials`), and `adopt`,
which makes a loaded tokenizer one the pipeline can use (a mask token made from an unused one, a template). What
masking, the NSP template, padding, the models' pad id, export and fine-tuning read; nothing else names `[CLS]`,
`<s>` or `##`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tokenizers import AddedToken, Tokenizer, processors

from pipeline.errors import PipelineError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class VocabError(PipelineError, ValueError):
    """A vocabulary file that cannot be used; the message names it."""


def set_pair_template(tok: Tokenizer, cls: str = "[CLS]", sep: str = "[SEP]", middle: int = 1) -> None:
    """`cls A sep B sep` (BERT's; `middle` 2: RoBERTa's `<s> A </s></s> B </s>`), B and its last sep of type 1."""
    cls_id, sep_id = tok.token_to_id(cls), tok.token_to_id(sep)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {' '.join([sep] * middle)} $B:1 {sep}:1",
        special_tokens=[(cls, cls_id), (sep, sep_id)],
    )


# The roles' usual spellings, tried in this order when a tokenizer's template (or padding) does not name them.
ROLE_NAMES = {
    "cls": ("[CLS]", "<s>", "<cls>", "[BOS]", "<bos>", "<|begin_of_text|>"),
    "sep": ("[SEP]", "</s>", "<sep>", "[EOS]", "<eos>", "<|endoftext|>", "<|end_of_text|>"),
    "pad": ("[PAD]", "<pad>", "<|pad|>", "<|padding|>"),
    "mask": ("[MASK]", "<mask>", "<|mask|>", "<MASK>", "[mask]"),
    "unk": ("[UNK]", "<unk>", "<|unk|>"),
}
# A token a tokenizer keeps free: [unused0] (BERT, ModernBERT), <unused0> (Gemma), <extra_id_0> (T5),
# <|reserved_special_token_0|> (Llama 3). The first one (by id) becomes the mask (then the pad) token when the
# tokenizer has none.
UNUSED = re.compile(r"[\[<]\|?(?:unused|reserved|extra_id)[\w ]*?\d+\|?[\]>]")


@dataclass(frozen=True)
class Specials:
    """The special tokens a tokenizer uses for each role, and their ids: what masking, the NSP template, padding,
    the models' pad id, export and fine-tuning read (`specials`). Nothing else names `[CLS]` or `<s>`.

    `middle` is the number of separators between A and B (1: BERT's `[CLS] A [SEP] B [SEP]`, 2: RoBERTa's
    `<s> A </s></s> B </s>`); `made` names the roles given an unused token (`{"mask": "[unused0]"}`); `never_masked`
    holds every special or unused token's id (never masked, never drawn as a random replacement); `words` says how
    a piece tells where a word starts (`word_marks`), what whole-word masking groups by."""

    tokens: dict[str, str]
    """{cls, sep, pad, mask[, unk]}: the token of each role."""
    ids: dict[str, int]
    middle: int = 1
    made: dict[str, str] = field(default_factory=dict)
    never_masked: tuple[int, ...] = ()
    words: tuple[str, ...] = ()
    """`word_marks`: ("continuation", "##"), ("start", "Ġ"), ("pieces", ""); () when not known (data prepared
    before it was recorded: `pipeline.data.masking` then tells it from the pieces)."""

    @property
    def template(self) -> str:
        """The pair template, as transformers writes it: `[CLS] $A [SEP] $B [SEP]`."""
        t = self.tokens
        return f"{t['cls']} $A {' '.join([t['sep']] * self.middle)} $B {t['sep']}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": dict(self.tokens),
            "ids": dict(self.ids),
            "middle": self.middle,
            "made": dict(self.made),
            "never_masked": list(self.never_masked),
            "template": self.template,
            "words": list(self.words),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Specials:
        return cls(
            dict(d["tokens"]),
            {k: int(v) for k, v in d["ids"].items()},
            int(d["middle"]),
            dict(d["made"]),
            tuple(int(i) for i in d["never_masked"]),
            tuple(d.get("words", ())),
        )

    @classmethod
    def bert(cls, vocab: list[str]) -> Specials:
        """BERT's five by name in a token list (a vocab.txt of data prepared before the roles were recorded)."""
        index = {t: i for i, t in enumerate(vocab)}
        missing = [t for t in SPECIAL_TOKENS if t not in index]
        if missing:
            raise VocabError(f"vocabulary lacks special token(s) {', '.join(missing)}")
        tokens = dict(zip(("pad", "unk", "cls", "sep", "mask"), SPECIAL_TOKENS))
        return cls(tokens, {r: index[t] for r, t in tokens.items()})


def _template_roles(post: dict | None) -> tuple[str, str, int] | None:
    """(cls, sep, separators between A and B) of a post-processor's pair template; None when it has none."""
    if not post:
        return None
    kind = post.get("type")
    if kind == "Sequence":
        found = [r for p in post.get("processors", []) if (r := _template_roles(p))]
        return found[0] if found else None
    if kind in ("RobertaProcessing", "BertProcessing"):
        return post["cls"][0], post["sep"][0], 2 if kind == "RobertaProcessing" else 1
    if kind != "TemplateProcessing":
        return None
    pair = post.get("pair") or []
    seq = [i for i, p in enumerate(pair) if "Sequence" in p]
    names = [p["SpecialToken"]["id"] if "SpecialToken" in p else None for p in pair]
    multi = [n for n in names if n and len(post["special_tokens"][n]["ids"]) != 1]
    if len(seq) != 2 or multi:
        raise VocabError(f"its pair template {names} is not `cls A sep B sep` (one token each)")
    before, middle, after = names[: seq[0]], names[seq[0] + 1 : seq[1]], names[seq[1] + 1 :]
    seps = set(middle + after)
    if len(before) != 1 or len(seps) != 1 or not 1 <= len(middle) <= 2 or len(after) != 1:
        shown = " ".join(n or ("$A" if i == seq[0] else "$B") for i, n in enumerate(names))
        raise VocabError(f"its pair template `{shown}` is not `cls A sep B sep` or `cls A sep sep B sep`")
    return before[0], after[0], len(middle)


def _find_pre_tokenizer(pre: dict | None, kinds: tuple[str, ...]) -> dict | None:
    """The first pre-tokenizer of one of `kinds` in `pre` (a Sequence searched in order)."""
    if not pre:
        return None
    if pre.get("type") == "Sequence":
        return next((f for p in pre.get("pretokenizers", []) if (f := _find_pre_tokenizer(p, kinds))), None)
    return pre if pre.get("type") in kinds else None


BPE_SPACE, METASPACE = "\u0120", "\u2581"  # Ġ: a byte-level space; ▁: SentencePiece's word start


def word_marks(spec: dict[str, Any]) -> tuple[str, str]:
    """How the pieces of a tokenizer (its tokenizer.json, parsed) mark words, read from its model and
    pre-tokenizer rather than guessed from the strings:

    - ("continuation", prefix): a piece that starts with the model's `continuing_subword_prefix` continues the
      word before it (WordPiece: `##` unless the file says otherwise; a BPE trained with a prefix);
    - ("start", mark): a piece without the leading mark continues the word before it (byte-level BPE: `Ġ`, the
      byte of a space; Metaspace, as SentencePiece and Unigram: its `replacement`, `▁` by default);
    - ("pieces", ""): nothing marks words (WordLevel, a BPE split on whitespace without a prefix): each piece is
      a word of its own.

        >>> from pipeline.data.tokenizer import train_tokenizer
        >>> word_marks(json.loads(train_tokenizer(["a b"] * 4, "bpe", vocab_size=300).to_str()))
        ('start', 'Ġ')
    """
    model = spec.get("model") or {}
    prefix = model.get("continuing_subword_prefix")
    if model.get("type") == "WordPiece" and prefix is None:
        prefix = "##"  # WordPiece's own default
    if prefix:
        return ("continuation", prefix)
    found = _find_pre_tokenizer(spec.get("pre_tokenizer"), ("ByteLevel", "Metaspace"))
    if found and found["type"] == "ByteLevel":
        return ("start", BPE_SPACE)
    if found:
        return ("start", found.get("replacement") or METASPACE)
    return ("pieces", "")


def word_marks_of_pieces(vocab: list[str]) -> tuple[str, str]:
    """`word_marks` told by a vocabulary's pieces alone, for data prepared before the rule was recorded: `##`
    pieces make WordPiece's continuations, else whichever of `Ġ` and `▁` starts more pieces.

        >>> word_marks_of_pieces(["[PAD]", "the", "##re"]), word_marks_of_pieces(["\u2581the", "re"])
        (('continuation', '##'), ('start', '▁'))
    """
    if any(t.startswith("##") and len(t) > 2 for t in vocab):
        return ("continuation", "##")
    more_bpe = sum(t.startswith(BPE_SPACE) for t in vocab) >= sum(t.startswith(METASPACE) for t in vocab)
    return ("start", BPE_SPACE if more_bpe else METASPACE)


def specials(tok: Tokenizer, name: str = "the tokenizer") -> Specials:
    """Each role's token in `tok`: cls and sep from its post-processor's template (else by the usual names), unk
    the model's own, pad and mask by name (`ROLE_NAMES`). A tokenizer with no mask (or pad) token gives that role
    its first unused token (`UNUSED`); with none left, VocabError says so, naming `name` (the file).

        >>> from pipeline.data.tokenizer import train_tokenizer
        >>> sp = specials(train_tokenizer(["a b"] * 4, "bpe", vocab_size=300))
        >>> sp.tokens["mask"], sp.ids["mask"], sp.template
        ('[MASK]', 4, '[CLS] $A [SEP] $B [SEP]')
    """
    spec = json.loads(tok.to_str())
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab, key=vocab.get)
    try:
        found = _template_roles(spec.get("post_processor"))
    except VocabError as e:
        raise VocabError(f"{name}: {e}") from None
    tokens: dict[str, str] = {}
    middle = 1
    if found:
        tokens["cls"], tokens["sep"], middle = found
    model = spec.get("model") or {}
    unk = model.get("unk_token")
    if unk is None and model.get("unk_id") is not None and model.get("vocab"):
        unk = model["vocab"][model["unk_id"]][0]
    if unk in vocab:
        tokens["unk"] = unk
    for role, names in ROLE_NAMES.items():
        if role not in tokens:
            hit = next((n for n in names if n in vocab), None)
            if hit is not None:
                tokens[role] = hit
    for role in ("cls", "sep"):
        if role not in tokens:
            raise VocabError(
                f"{name} has no {role} token: no template in its post_processor and none of "
                f"{', '.join(ROLE_NAMES[role])}"
            )
    made = {}
    free = [t for t in by_id if UNUSED.fullmatch(t) and t not in tokens.values()]
    for role in ("mask", "pad"):
        if role in tokens:
            continue
        if not free:
            what = "mask" if role == "mask" else "pad"
            raise VocabError(
                f"{name} has no way to {what}: no {role} token ({', '.join(ROLE_NAMES[role][:3])}) and no unused "
                "token ([unused0], <unused0>, <extra_id_0>) to make one"
            )
        tokens[role] = made[role] = free.pop(0)
    added = [t.content for t in tok.get_added_tokens_decoder().values() if t.special]
    never = {vocab[t] for t in tokens.values()} | {vocab[t] for t in added if t in vocab}
    never |= {i for t, i in vocab.items() if UNUSED.fullmatch(t)}
    order = ("cls", "sep", "pad", "mask", "unk")
    return Specials(
        {r: tokens[r] for r in order if r in tokens},
        {r: vocab[tokens[r]] for r in order if r in tokens},
        middle,
        made,
        tuple(sorted(never)),
        word_marks(spec),
    )


def adopt(tok: Tokenizer, name: str = "the tokenizer") -> tuple[Tokenizer, Specials]:
    """`tok` as the pipeline uses and registers it, with its `Specials`: a mask (or pad) token made from an unused
    token becomes an added special token (one piece in any text, as transformers' fill-mask writes it), and a
    tokenizer without a pair template gets `cls A sep B sep` of its roles. Ids and vocabulary do not change."""
    sp = specials(tok, name)
    if sp.made:
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in sp.made.values()])
    if _template_roles(json.loads(tok.to_str()).get("post_processor")) is None:
        set_pair_template(tok, sp.tokens["cls"], sp.tokens["sep"], sp.middle)
    return tok, sp
