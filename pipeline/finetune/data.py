"""Fine-tuning data: a task's examples (`pipeline.finetune.readers`) tokenized, and the batches the loop pads.

Tokenization uses the checkpoint's own `tokenizer.json` (or `vocab.txt`) through `tokenizers`
(`pipeline.data.tokenizer.load_tokenizer`, the loader data preparation uses), without padding: the collate
function pads each batch to its longest row (`pad_batch`).

- Token classification: the label goes on the first WordPiece of each word; other pieces and specials get -100.
- QA: contexts longer than the window are split into windows that overlap by `doc_stride` tokens: the tokenizer's
  `only_second` truncation with `stride` and its `overflowing` encodings, as transformers' run_qa.py gets them;
  the question is first cut to `max_query_length` tokens. A training window that does not contain the whole
  answer (or a v2 unanswerable question) points at [CLS].
- Embeddings: each text alone, `[CLS] text [SEP]` (`encode_texts`); a training row is a query with its positive (and
  hard negative), collated by `pipeline.finetune.embedding.pair_batch`; evaluation keeps the BEIR set's corpus and
  qrels (`RetrievalEval`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.data.specials import VocabError, specials
from pipeline.data.tokenizer import load_tokenizer
from pipeline.finetune.readers import (
    FinetuneDataError,
    QAExample,
    TaggedSentence,
    TextExample,
    check_tags,
    infer_labels,
    label_ids,
    read_beir,
    read_classification,
    read_conll,
    read_pairs,
    read_squad,
    tag_labels,
)

IGNORE_INDEX = -100


# ---------------------------------------------------------------------------------------------------------------
# tokenization


def encode_classification(tok, examples: list[TextExample], max_seq_length: int) -> dict[str, list[list[int]]]:
    """`input_ids`/`token_type_ids` per example ([CLS] a [SEP] (b [SEP])), longest-first truncation."""
    tok.enable_truncation(max_seq_length, strategy="longest_first")
    try:
        ids, tt = [], []
        for ex in examples:
            enc = tok.encode(ex.text_a, ex.text_b) if ex.text_b is not None else tok.encode(ex.text_a)
            ids.append(enc.ids)
            tt.append(enc.type_ids)
    finally:
        tok.no_truncation()
    return {"input_ids": ids, "token_type_ids": tt}


def encode_tokens(
    tok, sentences: list[TaggedSentence], label2id: dict[str, int], max_seq_length: int
) -> dict[str, list[list[int]]]:
    """WordPiece ids with the word label on each word's first piece, -100 elsewhere; `word_ids` per token.

    Words cut off by `max_seq_length` are absent from the features (they are scored as `O` at evaluation).
    """
    tok.enable_truncation(max_seq_length)
    try:
        ids, tt, labels, word_ids = [], [], [], []
        for s in sentences:
            enc = tok.encode(s.words, is_pretokenized=True)
            wid = enc.word_ids
            lab, prev = [], None
            for w in wid:
                lab.append(label2id[s.tags[w]] if w is not None and w != prev else IGNORE_INDEX)
                prev = w
            ids.append(enc.ids)
            tt.append(enc.type_ids)
            labels.append(lab)
            word_ids.append([-1 if w is None else w for w in wid])
    finally:
        tok.no_truncation()
    return {"input_ids": ids, "token_type_ids": tt, "labels": labels, "word_ids": word_ids}


def encode_qa(
    tok,
    examples: list[QAExample],
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int = 64,
) -> tuple[dict[str, list], list[dict[str, Any]]]:
    """Windows `[CLS] question [SEP] context-piece [SEP]` over each context, overlapping by `doc_stride` tokens.

    Returns features (`input_ids`, `token_type_ids`, `start_positions`, `end_positions`) and one dict per window
    (`example_id`, `offsets`: (char_start, char_end) per token for context tokens, None elsewhere).
    Example: a context of 10 tokens, room for 4 per window, doc_stride 2 -> windows start at tokens 0, 2, 4, 6.
    The windows are the tokenizer's own: `only_second` truncation with `stride`, the rest in `overflowing`.
    """
    questions = []  # each question's text, cut after its `max_query_length`-th token
    for ex in examples:
        q = tok.encode(ex.question, add_special_tokens=False)
        n_q = min(len(q.ids), max_query_length)
        room = max_seq_length - n_q - tok.num_special_tokens_to_add(True)  # BERT's template 3, RoBERTa's 4
        if room <= doc_stride:
            raise FinetuneDataError(
                f"max_seq_length {max_seq_length} leaves {room} context tokens per window for question {ex.qid}, "
                f"not more than doc_stride {doc_stride}"
            )
        # WordPiece never looks past a word: the text up to a token's end encodes to exactly the tokens up to it
        cut = len(ex.question) if n_q == len(q.ids) else q.offsets[n_q - 1][1] if n_q else 0
        questions.append(ex.question[:cut])
    feats: dict[str, list] = {"input_ids": [], "token_type_ids": [], "start_positions": [], "end_positions": []}
    windows: list[dict[str, Any]] = []
    tok.enable_truncation(max_seq_length, stride=doc_stride, strategy="only_second")
    try:
        for ex, question in zip(examples, questions):
            enc = tok.encode(question, ex.context)
            for w in [enc, *enc.overflowing]:
                off = [o if s == 1 else None for o, s in zip(w.offsets, w.sequence_ids)]  # context tokens only
                sp = ep = 0
                if ex.answers:
                    a_start = ex.answers[0]["answer_start"]
                    a_end = a_start + len(ex.answers[0]["text"])
                    # context tokens overlapping the answer; a target only when they hold all of it
                    toks = [k for k, o in enumerate(off) if o is not None and o[1] > a_start and o[0] < a_end]
                    if toks and off[toks[0]][0] <= a_start and off[toks[-1]][1] >= a_end:
                        sp, ep = toks[0], toks[-1]
                feats["input_ids"].append(w.ids)
                feats["token_type_ids"].append(w.type_ids)
                feats["start_positions"].append(sp)
                feats["end_positions"].append(ep)
                windows.append({"example_id": ex.qid, "offsets": off})
    finally:
        tok.no_truncation()
    return feats, windows


def encode_texts(tok, texts: list[str], max_seq_length: int) -> list[list[int]]:
    """`[CLS] text [SEP]` ids of each text, cut to `max_seq_length` (what sentence-transformers' tokenizer call gives).

    Embedding tasks pass no segment ids: every text is segment 0, a BERT's default."""
    tok.enable_truncation(max_seq_length)
    try:
        return [enc.ids for enc in tok.encode_batch(texts)]
    finally:
        tok.no_truncation()


def pad_batch(rows: dict[str, list], idx: list[int] | np.ndarray, pad_id: int = 0) -> dict[str, np.ndarray]:
    """Pad the selected rows of each per-token feature to the batch's longest; add `attention_mask`.

    Per-token features (`input_ids`, `token_type_ids`, `labels` for token tasks) are padded with `pad_id`, 0, -100;
    scalar features (`labels` for sequences, start/end positions) are stacked.

        >>> b = pad_batch({"input_ids": [[101, 7, 102], [101, 102]], "token_type_ids": [[0, 0, 0], [0, 0]]}, [0, 1])
        >>> b["input_ids"].tolist(), b["attention_mask"].tolist()
        ([[101, 7, 102], [101, 102, 0]], [[1, 1, 1], [1, 1, 0]])
    """
    seqs = [rows["input_ids"][i] for i in idx]
    L = max(len(s) for s in seqs)
    out: dict[str, np.ndarray] = {}
    for key, values in rows.items():
        if key == "word_ids":
            continue
        sel = [values[i] for i in idx]
        if isinstance(sel[0], (list, tuple, np.ndarray)):
            fill = pad_id if key == "input_ids" else (IGNORE_INDEX if key == "labels" else 0)
            arr = np.full((len(sel), L), fill, dtype=np.int64)
            for r, s in enumerate(sel):
                arr[r, : len(s)] = s
            out[key] = arr
        else:
            out[key] = np.asarray(sel)
    mask = np.zeros((len(seqs), L), dtype=np.int64)
    for r, s in enumerate(seqs):
        mask[r, : len(s)] = 1
    out["attention_mask"] = mask
    return out


@dataclass
class RetrievalEval:
    """An embedding task's evaluation set, tokenized: queries (`TaskData.eval["input_ids"]`, in this order), every
    document of the corpus, and the relevant documents of each query."""

    query_ids: list[str]
    doc_ids: list[str]
    corpus: list[list[int]]
    """Token ids of each document, in `doc_ids` order."""
    qrels: dict[str, dict[str, int]]
    """Query id -> {document id: relevance > 0}."""


@dataclass
class TaskData:
    """Tokenized train and eval features plus what evaluation needs to map predictions back to examples."""

    task: str
    train: dict[str, list]
    eval: dict[str, list]
    id2label: dict[int, str] = field(default_factory=dict)
    problem_type: str = "single_label_classification"
    eval_tags: list[list[str]] = field(default_factory=list)  # token task: gold tags per eval sentence
    eval_windows: list[dict[str, Any]] = field(default_factory=list)  # QA: one per eval feature row
    eval_contexts: dict[str, str] = field(default_factory=dict)  # QA: context per question id
    eval_answers: dict[str, list[str]] = field(default_factory=dict)  # QA: gold texts per question id
    version_2: bool = False
    retrieval: RetrievalEval | None = None  # embedding task: what the eval queries are searched against
    pad_id: int = 0  # the tokenizer's pad token: what `pad_batch` pads input_ids with

    @property
    def num_labels(self) -> int:
        return (
            1
            if self.problem_type == "regression"
            else max(len(self.id2label), 2 if self.task == "question-answering" else 1)
        )


def prepare_task(
    task: str,
    train_path: str | Path,
    eval_path: str | Path,
    tokenizer_path: str | Path,
    max_seq_length: int = 128,
    doc_stride: int = 64,
    max_query_length: int = 64,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    seed: int = 0,
) -> TaskData:
    """Read, validate and tokenize both files for `task`. Subsets (`max_*_examples`) are a seeded random sample
    of the training file (so a subset keeps every class) and the first rows of the eval file. The data is padded
    with the tokenizer's own pad token (`pipeline.data.specials.specials`)."""
    try:
        tok = load_tokenizer(tokenizer_path)
    except VocabError as e:
        raise FinetuneDataError(str(e)) from None
    limits = (max_seq_length, doc_stride, max_query_length, max_train_examples, max_eval_examples)
    td = _task_data(task, train_path, eval_path, tok, *limits, seed)
    td.pad_id = specials(tok).ids["pad"]
    return td


def _task_data(
    task: str,
    train_path: str | Path,
    eval_path: str | Path,
    tok: Any,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    max_train_examples: int | None,
    max_eval_examples: int | None,
    seed: int,
) -> TaskData:
    """`prepare_task`'s reading and tokenizing, per task type, with the loaded tokenizer."""
    rng = np.random.default_rng(seed)

    def subset(items: list, n: int | None, shuffle: bool) -> list:
        if n is None or n >= len(items):
            return items
        if shuffle:
            return [items[i] for i in sorted(rng.choice(len(items), n, replace=False))]
        return items[:n]

    if task in ("sequence-classification", "sentence-pair-classification"):
        cols = ["sentence1", "sentence2"] if task == "sentence-pair-classification" else None  # both, or an error
        tr = subset(read_classification(train_path, cols), max_train_examples, True)
        ev = subset(read_classification(eval_path, cols), max_eval_examples, False)
        problem, names = infer_labels([e.label for e in tr])
        label2id = {n: i for i, n in enumerate(names)}
        # a pair task is sequence classification over two segments from here on (its model, loop and metrics)
        td = TaskData(
            "sequence-classification",
            encode_classification(tok, tr, max_seq_length),
            encode_classification(tok, ev, max_seq_length),
        )
        td.train["labels"] = label_ids(tr, problem, label2id, train_path).tolist()
        td.eval["labels"] = label_ids(ev, problem, label2id, eval_path).tolist()
        if problem == "regression":
            td.problem_type = "regression"
        else:
            td.id2label = dict(enumerate(names))
        return td
    if task == "token-classification":
        tr = subset(read_conll(train_path), max_train_examples, True)
        ev = subset(read_conll(eval_path), max_eval_examples, False)
        names = tag_labels(tr)
        label2id = {n: i for i, n in enumerate(names)}
        check_tags(ev, label2id, eval_path)
        td = TaskData(
            task, encode_tokens(tok, tr, label2id, max_seq_length), encode_tokens(tok, ev, label2id, max_seq_length)
        )
        td.id2label = dict(enumerate(names))
        td.eval_tags = [s.tags for s in ev]
        return td
    if task == "question-answering":
        tr, _ = read_squad(train_path)
        ev, v2 = read_squad(eval_path)
        tr = subset(tr, max_train_examples, True)
        ev = subset(ev, max_eval_examples, False)
        train_feats, _ = encode_qa(tok, tr, max_seq_length, doc_stride, max_query_length)
        eval_feats, windows = encode_qa(tok, ev, max_seq_length, doc_stride, max_query_length)
        td = TaskData(task, train_feats, eval_feats, problem_type="question_answering")
        td.eval_windows = windows
        td.eval_contexts = {e.qid: e.context for e in ev}
        td.eval_answers = {e.qid: [a["text"] for a in e.answers] for e in ev}
        td.version_2 = v2
        return td
    if task == "embedding":
        # train: a query's ids in input_ids, its positive's (and hard negative's) beside them; eval: the BEIR set's
        # queries (the first max_eval_examples that have a relevant document) against its whole corpus
        pairs = subset(read_pairs(train_path), max_train_examples, True)
        beir = read_beir(eval_path)
        qids = list(beir.queries)[:max_eval_examples]
        train = {
            "input_ids": encode_texts(tok, [p.query for p in pairs], max_seq_length),
            "positive_ids": encode_texts(tok, [p.positive for p in pairs], max_seq_length),
        }
        if pairs[0].negative is not None:
            train["negative_ids"] = encode_texts(tok, [p.negative or "" for p in pairs], max_seq_length)
        td = TaskData(
            task,
            train,
            {"input_ids": encode_texts(tok, [beir.queries[q] for q in qids], max_seq_length)},
            problem_type="embedding",
        )
        td.retrieval = RetrievalEval(
            qids,
            list(beir.corpus),
            encode_texts(tok, list(beir.corpus.values()), max_seq_length),
            {q: beir.qrels[q] for q in qids},
        )
        return td
    raise FinetuneDataError(
        f"unknown task {task!r} (sequence-classification, sentence-pair-classification, "
        "token-classification, question-answering, embedding)"
    )
