"""Evaluation metrics for fine-tuning: classification, regression, BIO entity spans and SQuAD. The loop's
`evaluate` scores a model on a task's eval set with them.

Each metric has a worked example and is checked against hand-computed values and independent implementations
in tests/test_metrics.py. Accuracy, macro-F1 and MCC are scikit-learn's, Spearman's ranks scipy's `rankdata`
(both come with mlflow already; importing them costs a worker about 0.4 s and 60 MB); Pearson stays the textbook
formula because `scipy.stats.pearsonr` differs from it in the last bits (up to 7e-16, on most inputs), which
would change the printed metrics, and gives NaN with a warning where this gives 0 (constant input).

- Classification: accuracy, macro-F1 (sklearn's definition: mean F1 over every label seen in gold or
  predictions), Matthews correlation (multi-class R_K of Gorodkin 2004, as sklearn's `matthews_corrcoef`).
- Regression: Pearson and Spearman (average ranks for ties).
- Token classification: entity-level precision/recall/F1 for BIO/IOB2 tags, seqeval's (its default mode is
  conlleval's chunking: an `I-X` that does not continue an `X` entity starts a new one), token accuracy. It
  replaced a port of conlleval.pl that gave the same figures on 3,000 random tag sequences (max difference 0.0).
- QA: SQuAD's answer normalisation, exact match and token F1, ported from the official SQuAD v1.1/v2.0
  evaluation scripts (max over gold answers; an unanswerable question's gold is `[""]`, as the v2.0 script),
  n-best span decoding over strided windows with a maximum answer length, and SQuAD v2's no-answer rule
  (predict "" when null score − best span score > threshold).
- Retrieval: nDCG@10, MRR@10 and recall@100 of a ranking, trec_eval's (pytrec_eval, BEIR's evaluator).
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Sequence
from typing import Any

import numpy as np

# scikit-learn and scipy load where a figure needs them (together 2-4 CPU-s): only the rank that evaluates
# computes metrics, and the job's driver and the other ranks import this module without calling it.

# ---------------------------------------------------------------------------------------------------------------
# classification / regression


def accuracy(y_true: Sequence[int], y_pred: Sequence[int]) -> float:
    """Fraction of equal entries; 0 without examples. `accuracy([0, 1, 1], [0, 1, 0]) -> 0.666...`"""
    import sklearn.metrics

    return float(sklearn.metrics.accuracy_score(y_true, y_pred)) if len(y_true) else 0.0


def macro_f1(y_true: Sequence[int], y_pred: Sequence[int]) -> float:
    """Unweighted mean of per-label F1 over labels present in gold or predictions (sklearn's `average="macro"`,
    a label never predicted correctly scores 0); 0 without examples.

    `macro_f1([0, 0, 1, 2], [0, 1, 1, 2])`: F1(0)=2/3, F1(1)=2/3, F1(2)=1 -> 0.777...
    """
    import sklearn.metrics

    if not len(y_true):
        return 0.0
    return float(sklearn.metrics.f1_score(y_true, y_pred, average="macro", zero_division=0))


def matthews_corrcoef(y_true: Sequence[int], y_pred: Sequence[int]) -> float:
    """Multi-class Matthews correlation (R_K of Gorodkin 2004, sklearn's); 0 when a marginal is constant.

    With confusion matrix C: c = trace, s = n, p_k = column sums, t_k = row sums,
    MCC = (c·s − Σ p_k t_k) / sqrt((s² − Σ p_k²)(s² − Σ t_k²)).
    `matthews_corrcoef([1, 1, 0, 0], [1, 0, 0, 0])` = (3·4 − (1·2 + 3·2)) / sqrt((16 − 10)(16 − 8)) = 0.577...
    """
    import sklearn.metrics

    if len(np.union1d(y_true, y_pred)) < 2:  # no examples, or one label only: 0, without sklearn's warning
        return 0.0
    return float(sklearn.metrics.matthews_corrcoef(y_true, y_pred))


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's r; 0 when either side is constant. `pearson([1, 2, 3], [2, 4, 7]) -> 0.9933`"""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    a, b = a - a.mean(), b - b.mean()
    den = np.sqrt((a * a).sum() * (b * b).sum())
    return float((a * b).sum() / den) if den > 0 else 0.0


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho = Pearson on average ranks (ties share theirs). `spearman([1, 2, 3], [1, 9, 4]) -> 0.5`"""
    import scipy.stats

    return pearson(scipy.stats.rankdata(x), scipy.stats.rankdata(y))


def classification_metrics(y_true: Sequence[int], y_pred: Sequence[int]) -> dict[str, float]:
    return {
        "accuracy": accuracy(y_true, y_pred),
        "macro_f1": macro_f1(y_true, y_pred),
        "mcc": matthews_corrcoef(y_true, y_pred),
    }


def regression_metrics(y_true: Sequence[float], y_pred: Sequence[float]) -> dict[str, float]:
    t, p = np.asarray(y_true, dtype=np.float64), np.asarray(y_pred, dtype=np.float64)
    return {"pearson": pearson(t, p), "spearman": spearman(t, p), "mse": float(((t - p) ** 2).mean())}


# ---------------------------------------------------------------------------------------------------------------
# BIO entities


def entity_metrics(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro precision/recall/F1 over entity chunks of every sentence (seqeval's default mode: conlleval.pl's
    chunking and overall figures), plus token accuracy.

    gold [["B-PER","I-PER","O"]], pred [["B-PER","O","O"]]: chunks {PER 0-1} vs {PER 0-0} -> P=R=F1=0,
    token accuracy 2/3.
    """
    from seqeval.metrics import f1_score, precision_score, recall_score

    for g, p in zip(gold, pred, strict=True):
        if len(g) != len(p):
            raise ValueError(f"sentence has {len(g)} gold tags but {len(p)} predicted")
    gold, pred = [list(g) for g in gold], [list(p) for p in pred]
    tok_ok = sum(a == b for g, p in zip(gold, pred) for a, b in zip(g, p))
    tok_all = sum(len(g) for g in gold)
    return {
        "precision": float(precision_score(gold, pred, zero_division=0)),
        "recall": float(recall_score(gold, pred, zero_division=0)),
        "f1": float(f1_score(gold, pred, zero_division=0)),
        "token_accuracy": tok_ok / tok_all if tok_all else 0.0,
    }


# ---------------------------------------------------------------------------------------------------------------
# SQuAD


def normalize_answer(s: str) -> str:
    """SQuAD's normalisation: lower case, drop punctuation and the articles a/an/the, squeeze whitespace.

    Ported from the official SQuAD v1.1 evaluation script (`evaluate-v1.1.py`, `normalize_answer`; v2.0's
    `evaluate-v2.0.py` has the same), as are `squad_exact`, `squad_f1` and `squad_metrics`: the offline rule
    keeps the `evaluate` library's hub-loaded `squad`/`squad_v2` metrics out.

    `normalize_answer("The  Lord's house!") -> "lords house"`
    """
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def squad_exact(pred: str, gold: str) -> float:
    """Exact match after normalisation (the official script's `exact_match_score`, a port)."""
    return float(normalize_answer(pred) == normalize_answer(gold))


def squad_f1(pred: str, gold: str) -> float:
    """Token-overlap F1 after normalisation; an empty side scores 1 only against another empty side.
    A port of the official scripts' `f1_score` (v1.1) / `compute_f1` (v2.0, which adds the empty-side rule).

    `squad_f1("the house of Naomi", "Naomi's house")`: {house, of, naomi} vs {naomis, house} -> common 1,
    P=1/3, R=1/2 -> 0.4
    """
    p, g = normalize_answer(pred).split(), normalize_answer(gold).split()
    if not p or not g:
        return float(p == g)
    common = collections.Counter(p) & collections.Counter(g)
    same = sum(common.values())
    if same == 0:
        return 0.0
    prec, rec = same / len(p), same / len(g)
    return 2 * prec * rec / (prec + rec)


def squad_metrics(predictions: dict[str, str], gold: dict[str, list[str]]) -> dict[str, float]:
    """Exact match and F1 in percent, max over gold answers, averaged over questions: a port of the official
    scripts' `evaluate` (v1.1) / `get_raw_scores` + `make_eval_dict` (v2.0, with the has/no-answer split).

    `gold[qid] == []` (unanswerable) counts as `[""]`. Adds `has_ans_*`/`no_ans_*` breakdowns when both kinds exist.
    """
    em: dict[str, float] = {}
    f1: dict[str, float] = {}
    for qid, answers in gold.items():
        answers = [a for a in answers if normalize_answer(a)] or [""]
        pred = predictions.get(qid, "")
        em[qid] = max(squad_exact(pred, a) for a in answers)
        f1[qid] = max(squad_f1(pred, a) for a in answers)
    n = len(gold)
    out = {"exact_match": 100.0 * sum(em.values()) / n if n else 0.0, "f1": 100.0 * sum(f1.values()) / n if n else 0.0}
    has = [q for q, a in gold.items() if any(normalize_answer(x) for x in a)]
    no = [q for q in gold if q not in set(has)]
    if has and no:
        for name, ids in (("has_ans", has), ("no_ans", no)):
            out[f"{name}_exact"] = 100.0 * sum(em[q] for q in ids) / len(ids)
            out[f"{name}_f1"] = 100.0 * sum(f1[q] for q in ids) / len(ids)
    return out


def decode_spans(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    offsets: Sequence[tuple[int, int] | None],
    context: str,
    n_best: int = 20,
    max_answer_length: int = 30,
) -> tuple[list[dict[str, Any]], float]:
    """Best spans of one window and its null score (`start[0] + end[0]`, the [CLS] position).

    `offsets[i]` is the (char_start, char_end) of token i in `context`, or None for tokens outside the context
    (question, [CLS], [SEP], padding). A span needs both ends in the context, end >= start, and at most
    `max_answer_length` tokens. Candidates are the top `n_best` starts × top `n_best` ends.

        >>> spans, null = decode_spans(np.array([0., 5, 1]), np.array([0., 1, 4]), [None, (0, 4), (5, 9)], "Ruth wept")
        >>> spans[0]["text"], spans[0]["score"], null
        ('Ruth wept', 9.0, 0.0)
    """
    starts = np.argsort(start_logits)[::-1][:n_best]
    ends = np.argsort(end_logits)[::-1][:n_best]
    out = []
    for s in starts:
        for e in ends:
            if s >= len(offsets) or e >= len(offsets) or offsets[s] is None or offsets[e] is None:
                continue
            if e < s or e - s + 1 > max_answer_length:
                continue
            a, b = offsets[s][0], offsets[e][1]
            out.append({"text": context[a:b], "score": float(start_logits[s] + end_logits[e]), "start": a, "end": b})
    out.sort(key=lambda d: d["score"], reverse=True)
    return out[:n_best], float(start_logits[0] + end_logits[0])


def postprocess_qa(
    windows: Sequence[dict[str, Any]],
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    contexts: dict[str, str],
    n_best: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_score_diff_threshold: float = 0.0,
    details: dict[str, dict[str, Any]] | None = None,
) -> dict[str, str]:
    """Answer text per question id from the logits of all its windows.

    `windows[i]` has `example_id` and `offsets` (see `decode_spans`); `start_logits[i]`/`end_logits[i]` are its
    logits (L,). The best span over all windows wins. For SQuAD v2 the null score is the minimum over the
    question's windows (as Google's run_squad.py) and the answer is "" when
    `null_score - best_span_score > null_score_diff_threshold`; v1.1 always answers with the best span.
    When `details` is a dict it receives `{"span": {qid: best span text}, "score_diff": {qid: null − best}}`
    (for `best_null_threshold`).
    """
    best: dict[str, dict[str, Any]] = {}
    null: dict[str, float] = {}
    for w, sl, el in zip(windows, start_logits, end_logits, strict=True):
        qid = w["example_id"]
        spans, null_score = decode_spans(sl, el, w["offsets"], contexts[qid], n_best, max_answer_length)
        null[qid] = min(null.get(qid, null_score), null_score)
        if spans and (qid not in best or spans[0]["score"] > best[qid]["score"]):
            best[qid] = spans[0]
    preds: dict[str, str] = {}
    for qid in contexts:
        span = best.get(qid)
        if span is None:
            preds[qid] = ""
        elif version_2 and null.get(qid, float("-inf")) - span["score"] > null_score_diff_threshold:
            preds[qid] = ""
        else:
            preds[qid] = span["text"]
    if details is not None:
        details["span"] = {q: (best[q]["text"] if q in best else "") for q in contexts}
        details["score_diff"] = {
            q: (null.get(q, 0.0) - best[q]["score"]) if q in best else float("inf") for q in contexts
        }
    return preds


def best_null_threshold(
    span_preds: dict[str, str], score_diff: dict[str, float], gold: dict[str, list[str]]
) -> dict[str, float]:
    """The official SQuAD v2 script's `best_exact`/`best_f1` and their null-score-diff thresholds: a port of
    `evaluate-v2.0.py`'s `find_best_thresh`, except that when no switch helps the threshold is below every
    diff (nothing answered) rather than 0.0.

    Questions sorted by `score_diff` (null − best span) are switched from "" to their best span one by one; the
    threshold is the diff of the last switched question at the best running score (answer when diff <= it).
    gold {a: [Ruth], b: [], c: [Boaz]}, spans {a: Ruth, b: Naomi, c: Orpah}, diffs {a: -2, b: 1, c: 3}:
    all "" scores 1 (b); switching a -> 2 (best, threshold -2); b -> 1; c -> 1 => best_f1 66.7 at -2.
    """
    out: dict[str, float] = {}
    n = len(gold)
    finite = [d for d in score_diff.values() if math.isfinite(d)]
    for name, fn in (("exact", squad_exact), ("f1", squad_f1)):
        has = {q: bool([a for a in gold[q] if normalize_answer(a)]) for q in gold}
        cur = best = float(sum(not h for h in has.values()))
        thresh = (min(finite) - 1.0) if finite else 0.0
        for q in sorted((q for q in gold if math.isfinite(score_diff.get(q, math.inf))), key=lambda q: score_diff[q]):
            if has[q]:
                cur += max(fn(span_preds[q], a) for a in gold[q])
            elif normalize_answer(span_preds[q]):
                cur -= 1
            if cur > best:
                best, thresh = cur, score_diff[q]
        out[f"best_{name}"] = 100.0 * best / n if n else 0.0
        out[f"best_{name}_thresh"] = float(thresh)
    return out


# ---------------------------------------------------------------------------------------------------------------
# retrieval

RETRIEVAL_MEASURES = {"ndcg@10": "ndcg_cut_10", "mrr@10": "recip_rank", "recall@100": "recall_100"}
"""Our names (the embedding job's contract) -> trec_eval's measures; MRR@10 is trec_eval's reciprocal rank of
the ranking cut at 10."""


def retrieval_metrics(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]]) -> dict[str, float]:
    """`ndcg@10`, `mrr@10` and `recall@100`, each the mean over the queries of `qrels`, computed by trec_eval
    (pytrec_eval, as BEIR does): nDCG with linear gains (the relevance grade) and log2 discounts; a query absent
    from `run` scores 0. `run` is {query: {document: score}}, ranked by score (at least each query's top 100).

        >>> r = retrieval_metrics({"q": {"a": 1, "c": 2}}, {"q": {"a": 0.9, "b": 0.8, "c": 0.7}})
        >>> round(r["ndcg@10"], 4), r["mrr@10"]
        (0.7602, 1.0)

    (DCG 1/log2(2) + 2/log2(4) = 2 against the ideal 2 + 1/log2(3) = 2.631: 0.760; the first relevant at rank 1:
    MRR 1.)
    """
    import pytrec_eval

    top10 = {q: dict(sorted(d.items(), key=lambda kv: -kv[1])[:10]) for q, d in run.items()}
    deep = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    out = {}
    for name, measure in RETRIEVAL_MEASURES.items():
        per_query = rr if measure == "recip_rank" else deep
        out[name] = sum(per_query.get(q, {}).get(measure, 0.0) for q in qrels) / max(1, len(qrels))
    return out


# ---------------------------------------------------------------------------------------------------------------
# the metric that picks the best epoch and trial

PRIMARY = {
    "sequence-classification": "accuracy",
    "sentence-pair-classification": "accuracy",
    "token-classification": "f1",
    "question-answering": "f1",
    "embedding": "ndcg@10",
}


def primary_metric(task: str, problem_type: str) -> str:
    return "pearson" if problem_type == "regression" else PRIMARY[task]
