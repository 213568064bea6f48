"""Metrics against hand-computed values and independent implementations: plain-Python counts for the ones
scikit-learn computes, scipy's pearsonr/spearmanr for the correlations computed here."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from pipeline.finetune import metrics as M


def test_accuracy_macro_f1_hand():
    t, p = [0, 0, 1, 2], [0, 1, 1, 2]
    assert M.accuracy(t, p) == 0.75
    # F1(0) = 2*1/(2+0+1) = 2/3, F1(1) = 2*1/(2+1+0) = 2/3, F1(2) = 1
    assert M.macro_f1(t, p) == pytest.approx((2 / 3 + 2 / 3 + 1) / 3)
    # a label only ever predicted counts with F1 0 (sklearn's macro over gold ∪ predicted labels)
    assert M.macro_f1([0, 0], [0, 1]) == pytest.approx((2 / 3 + 0) / 2)


def test_mcc_hand():
    # binary: TP=1 FN=1 TN=2 FP=0 -> (1*2 - 0*1)/sqrt((1)(2)(2)(3)) = 2/sqrt(12)
    assert M.matthews_corrcoef([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(2 / math.sqrt(12))
    assert M.matthews_corrcoef([0, 1, 2], [0, 1, 2]) == pytest.approx(1.0)
    assert M.matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    assert M.matthews_corrcoef([0, 1, 2], [1, 1, 1]) == 0.0  # constant prediction
    # 3 classes: C = [[2,1,0],[0,1,1],[1,0,2]] (rows gold); c=5, s=8, t=[3,2,3], p=[3,2,3]
    # (5*8 - 22) / (64 - 22) = 18/42
    t = [0, 0, 0, 1, 1, 2, 2, 2]
    p = [0, 0, 1, 1, 2, 0, 2, 2]
    assert M.matthews_corrcoef(t, p) == pytest.approx(18 / 42)


def _counts(t, p, lab):
    tp = sum(a == lab and b == lab for a, b in zip(t, p))
    return tp, sum(a != lab and b == lab for a, b in zip(t, p)), sum(a == lab and b != lab for a, b in zip(t, p))


def reference_macro_f1(t, p) -> float:
    """Per-label counts in plain Python over gold ∪ predicted labels."""
    f1 = [2 * tp / (2 * tp + fp + fn) if tp else 0.0 for tp, fp, fn in (_counts(t, p, lab) for lab in set(t) | set(p))]
    return sum(f1) / len(f1)


def reference_mcc(t, p) -> float:
    """Gorodkin's R_K from a confusion matrix built in plain Python."""
    labels = sorted(set(t) | set(p))
    C = [[sum(a == i and b == j for a, b in zip(t, p)) for j in labels] for i in labels]
    s, c = len(t), sum(C[i][i] for i in range(len(labels)))
    tk = [sum(row) for row in C]
    pk = [sum(col) for col in zip(*C)]
    den = math.sqrt((s * s - sum(x * x for x in pk)) * (s * s - sum(x * x for x in tk)))
    return (c * s - sum(x * y for x, y in zip(tk, pk))) / den if den else 0.0


def test_against_independent_counts_random():
    rng = np.random.default_rng(0)
    for n in [1, 2, 5, 50, 200] * 4:
        t, p = rng.integers(0, 4, n).tolist(), rng.integers(0, 4, n).tolist()
        assert M.accuracy(t, p) == pytest.approx(sum(a == b for a, b in zip(t, p)) / n)
        assert M.matthews_corrcoef(t, p) == pytest.approx(reference_mcc(t, p))
        assert M.macro_f1(t, p) == pytest.approx(reference_macro_f1(t, p))


def test_classification_edge_cases_are_zero_and_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sklearn's UndefinedMetricWarning / single-label warning stay inside
        assert M.classification_metrics([], []) == {"accuracy": 0.0, "macro_f1": 0.0, "mcc": 0.0}
        assert M.classification_metrics([1, 1], [1, 1]) == {"accuracy": 1.0, "macro_f1": 1.0, "mcc": 0.0}
        assert M.matthews_corrcoef([0], [1]) == 0.0 and M.macro_f1([0], [1]) == 0.0
        assert M.regression_metrics([1.0, 2.0], [3.0, 3.0])["pearson"] == 0.0
        assert M.spearman([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0


def test_pearson_spearman_hand():
    # x̄=2, ȳ=13/3: Σdxdy = 5, Σdx²=2, Σdy²=38/3 -> 5/sqrt(76/3)
    assert M.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(76 / 3))
    assert M.spearman([1, 2, 3], [1, 9, 4]) == pytest.approx(0.5)
    # ties take the average rank: y ranks [1, 2.5, 2.5, 4]; Σdxdy = 4.5, Σdx² = 5, Σdy² = 4.5
    assert M.spearman([1, 2, 3, 4], [1, 5, 5, 9]) == pytest.approx(4.5 / math.sqrt(5 * 4.5))
    assert M.spearman([10, 20, 20, 5], [2, 3.5, 3.5, 1]) == pytest.approx(1.0)
    assert M.pearson([1, 1, 1], [1, 2, 3]) == 0.0
    import scipy.stats as stats

    rng = np.random.default_rng(1)
    x, y = rng.normal(size=40), rng.integers(0, 5, 40).astype(float)
    assert M.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)
    assert M.pearson(x, y) == pytest.approx(stats.pearsonr(x, y).statistic)


@pytest.mark.parametrize(
    "tags, expected",
    [
        (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
        (["B-PER", "B-PER", "I-PER"], [("PER", 0, 0), ("PER", 1, 2)]),
        (["O", "I-LOC", "I-LOC", "O"], [("LOC", 1, 2)]),  # stray I- starts a chunk (conlleval)
        (["B-PER", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 1)]),  # type change ends the chunk
        (["B-DEITY", "I-DEITY", "I-DEITY"], [("DEITY", 0, 2)]),
        ([], []),
    ],
)
def test_entity_chunks_follow_conlleval(tags, expected):
    """The chunks conlleval reads in `tags` are `expected`: the same chunks written canonically (B- then I-) score
    F1 1 against them, and with one chunk missing recall (n-1)/n."""

    def canonical(chunks):
        out = ["O"] * len(tags)
        for typ, start, end in chunks:
            out[start : end + 1] = [f"B-{typ}"] + [f"I-{typ}"] * (end - start)
        return out

    assert M.entity_metrics([tags], [canonical(expected)])["f1"] == (1.0 if expected else 0.0)
    if expected:
        assert M.entity_metrics([tags], [canonical(expected[1:])])["recall"] == pytest.approx(
            (len(expected) - 1) / len(expected)
        )


def test_entity_metrics_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-DEITY", "O", "B-PER"]]
    pred = [["B-PER", "I-PER", "O", "O"], ["B-DEITY", "O", "B-LOC"]]
    # gold chunks: PER0-1, LOC3, DEITY0, PER2 (4); predicted: PER0-1, DEITY0, LOC2 (3); correct 2
    m = M.entity_metrics(gold, pred)
    assert m["precision"] == pytest.approx(2 / 3)
    assert m["recall"] == pytest.approx(2 / 4)
    assert m["f1"] == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))
    assert m["token_accuracy"] == pytest.approx(5 / 7)
    # a boundary error is a miss on both sides
    m = M.entity_metrics([["B-PER", "I-PER", "O"]], [["B-PER", "O", "O"]])
    assert (m["precision"], m["recall"], m["f1"]) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    "s, norm",
    [("The  Lord's house!", "lords house"), ("an Apple, a day", "apple day"), ("Theatre", "theatre"), ("", "")],
)
def test_normalize_answer(s, norm):
    assert M.normalize_answer(s) == norm


def test_squad_em_f1_hand():
    assert M.squad_exact("the LORD", "Lord.") == 1.0
    # {house, of, naomi} vs {naomis, house}: 1 common -> P=1/3 R=1/2 F1=0.4
    assert M.squad_f1("the house of Naomi", "Naomi's house") == pytest.approx(0.4)
    assert M.squad_f1("", "") == 1.0 and M.squad_f1("Ruth", "") == 0.0
    gold = {"q1": ["Naomi", "Naomi the widow"], "q2": ["Boaz"], "q3": []}
    preds = {"q1": "the widow Naomi", "q2": "Ruth", "q3": ""}
    m = M.squad_metrics(preds, gold)
    # q1: EM 0; F1 max(2*(1/2*1)/(1.5)=2/3, {widow,naomi} vs {naomi,widow} = 1) = 1; q2: 0/0; q3 (no answer): 1/1
    assert m["exact_match"] == pytest.approx(100 * 1 / 3)
    assert m["f1"] == pytest.approx(100 * 2 / 3)
    assert m["has_ans_f1"] == pytest.approx(50.0) and m["no_ans_exact"] == 100.0


def test_decode_spans_n_best_and_max_length():
    ctx = "Ruth clave unto Naomi"
    offsets = [None, None, (0, 4), (5, 10), (11, 15), (16, 21), None]
    start = np.array([1.0, 9.0, 3.0, 0.0, 0.0, 2.5, 0.0])
    end = np.array([1.0, 0.0, 0.5, 0.0, 0.0, 4.0, 9.0])
    spans, null = M.decode_spans(start, end, offsets, ctx, n_best=4, max_answer_length=30)
    # top-4 starts 1,2,5,0 and ends 6,5,0,2; tokens 0, 1 and 6 are outside the context -> spans (2,5) (5,5) (2,2)
    assert null == 2.0
    assert [(s["text"], s["score"]) for s in spans] == [("Ruth clave unto Naomi", 7.0), ("Naomi", 6.5), ("Ruth", 3.5)]
    spans, _ = M.decode_spans(start, end, offsets, ctx, n_best=4, max_answer_length=2)
    assert [s["text"] for s in spans] == ["Naomi", "Ruth"]  # the 4-token span is too long


def test_postprocess_qa_windows_and_null_threshold():
    ctx = "Ruth clave unto Naomi"
    # two windows of question q: window 0 covers "Ruth clave", window 1 "unto Naomi"
    w0 = {"example_id": "q", "offsets": [None, (0, 4), (5, 10), None]}
    w1 = {"example_id": "q", "offsets": [None, (11, 15), (16, 21), None]}
    s = np.array([[2.0, 1.0, 0.0, 0.0], [1.0, 0.0, 3.0, 0.0]])
    e = np.array([[2.0, 1.5, 0.0, 0.0], [1.0, 0.0, 2.0, 0.0]])
    # window 0: best "Ruth" 2.5, null 4.0; window 1: best "Naomi" 5.0, null 2.0 -> min null 2.0, best span 5.0
    assert M.postprocess_qa([w0, w1], s, e, {"q": ctx}) == {"q": "Naomi"}
    assert M.postprocess_qa([w0, w1], s, e, {"q": ctx}, version_2=True) == {"q": "Naomi"}  # 2.0-5.0 < 0
    assert M.postprocess_qa([w0, w1], s, e, {"q": ctx}, version_2=True, null_score_diff_threshold=-4.0) == {"q": ""}
    # v2 with a strong [CLS] in every window -> no answer; v1.1 still answers
    s2, e2 = s.copy(), e.copy()
    s2[:, 0] = 10.0
    assert M.postprocess_qa([w0, w1], s2, e2, {"q": ctx}, version_2=True) == {"q": ""}
    assert M.postprocess_qa([w0, w1], s2, e2, {"q": ctx}, version_2=False) == {"q": "Naomi"}


def test_best_null_threshold_hand():
    gold = {"a": ["Ruth"], "b": [], "c": ["Boaz"]}
    spans = {"a": "Ruth", "b": "Naomi", "c": "Orpah"}
    diffs = {"a": -2.0, "b": 1.0, "c": 3.0}
    m = M.best_null_threshold(spans, diffs, gold)
    # all "" -> 1 (b); +a (F1 1) -> 2 at -2; +b (answered wrongly) -> 1; +c (F1 0) -> 1
    assert m["best_f1"] == pytest.approx(200 / 3) and m["best_f1_thresh"] == -2.0
    assert m["best_exact"] == pytest.approx(200 / 3) and m["best_exact_thresh"] == -2.0
    # applying the threshold through postprocess_qa's rule (answer "" when diff > thresh) gives that score
    preds = {q: ("" if diffs[q] > m["best_f1_thresh"] else spans[q]) for q in gold}
    assert M.squad_metrics(preds, gold)["f1"] == pytest.approx(m["best_f1"])
    # nothing worth answering: the threshold sits below every diff (all "")
    m = M.best_null_threshold({"a": "x", "b": "y"}, {"a": 0.5, "b": 2.0}, {"a": [], "b": []})
    assert m["best_f1"] == 100.0 and m["best_f1_thresh"] < 0.5


def test_postprocess_qa_details():
    ctx = "Ruth clave unto Naomi"
    w = {"example_id": "q", "offsets": [None, (0, 4), (16, 21), None]}
    s, e = np.array([[3.0, 1.0, 2.0, 0.0]]), np.array([[3.0, 0.0, 2.5, 0.0]])
    details: dict = {}
    preds = M.postprocess_qa([w], s, e, {"q": ctx}, version_2=True, details=details)
    # best span "Naomi" 4.5 (start 2 + end 2); "Ruth clave unto Naomi" 1+2.5=3.5; null 6.0 -> diff 1.5 > 0
    assert preds == {"q": ""} and details["span"] == {"q": "Naomi"} and details["score_diff"] == {"q": 1.5}


# -- retrieval ---------------------------------------------------------------------------------------------------


def _direct(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]]) -> dict[str, float]:
    """nDCG@10 (linear gains, log2 discounts), MRR@10 and recall@100 written out from their definitions."""
    out = {"ndcg@10": [], "mrr@10": [], "recall@100": []}
    for q, rel in qrels.items():
        ranked = [d for d, _ in sorted(run.get(q, {}).items(), key=lambda kv: -kv[1])]
        dcg = sum(rel.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:10]))
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(sorted(rel.values(), reverse=True)[:10]))
        out["ndcg@10"].append(dcg / idcg)
        out["mrr@10"].append(next((1 / (i + 1) for i, d in enumerate(ranked[:10]) if rel.get(d, 0) > 0), 0.0))
        out["recall@100"].append(sum(d in rel for d in ranked[:100]) / len(rel))
    return {k: sum(v) / len(v) for k, v in out.items()}


def test_retrieval_metrics_are_their_definitions_on_random_rankings():
    """trec_eval's figures (pytrec_eval) against the definitions, on 200 random queries with graded relevance,
    rankings of 150 documents (so recall@100 cuts), ties broken by distinct scores; a query the run never ranked
    scores 0 on all three."""
    rng = np.random.default_rng(0)
    docs = [f"d{i}" for i in range(300)]
    qrels, run = {}, {}
    for q in range(200):
        rel = rng.choice(300, int(rng.integers(1, 6)), replace=False)
        qrels[f"q{q}"] = {docs[i]: int(rng.integers(1, 4)) for i in rel}
        ranked = rng.permutation(300)[:150]
        run[f"q{q}"] = {docs[i]: float(s) for i, s in zip(ranked, np.linspace(1, 0, 150))}
    got, want = M.retrieval_metrics(qrels, run), _direct(qrels, run)
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k], abs=1e-9) for k in want), (got, want)
    assert 0 < got["ndcg@10"] < 1 and 0 < got["recall@100"] < 1
    del run["q0"]
    assert M.retrieval_metrics({"q0": qrels["q0"]}, run) == {"ndcg@10": 0.0, "mrr@10": 0.0, "recall@100": 0.0}
