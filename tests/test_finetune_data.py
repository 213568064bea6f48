"""Fine-tuning readers and tokenization: label maps, first-WordPiece labels, QA windows, one-line data errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.finetune import data as D
from pipeline.finetune import readers as R

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return D.load_tokenizer(minilm_dir)


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_tokenizer_of_a_checkpoint_dir(tmp_path, minilm_dir):
    """A vocab.txt-only directory is cased or uncased as its tokenizer_config.json says (uncased without one);
    a directory with neither file is a one-line data error."""
    (tmp_path / "vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes())
    assert D.load_tokenizer(tmp_path).encode("Naomi", add_special_tokens=False).tokens == ["naomi"]
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": false}')
    assert D.load_tokenizer(tmp_path).encode("Naomi", add_special_tokens=False).tokens == ["[UNK]"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(R.FinetuneDataError, match="empty has no tokenizer.json or vocab.txt"):
        D.prepare_task("sequence-classification", tmp_path / "t.tsv", tmp_path / "e.tsv", tmp_path / "empty")


# -- sequence classification -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, text",
    [
        ("t.tsv", 'sentence\tlabel\nAnd Ruth said "Intreat me not"\tb\nNaomi wept\ta\n'),
        ("t.csv", 'sentence,label\n"And Ruth said ""Intreat me not"""  ,b\nNaomi wept,a\n'),
        (
            "t.jsonl",
            '{"sentence": "And Ruth said \\"Intreat me not\\"", "label": "b"}\n\n{"sentence": "Naomi wept", "label": "a"}\n',  # noqa: E501
        ),
    ],
)
def test_read_classification_formats(tmp_path, name, text):
    ex = R.read_classification(write(tmp_path, name, text))
    assert [e.text_a.strip() for e in ex] == ['And Ruth said "Intreat me not"', "Naomi wept"]
    assert [e.label for e in ex] == ["b", "a"] and ex[0].text_b is None


def test_datasets_table_as_jsonl(tmp_path):
    """README: a `datasets` table goes in through `to_json` (JSON lines)."""
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"sentence": ["Naomi wept", "Ruth clave"], "label": [1, 0]}).to_json(
        tmp_path / "t.jsonl"
    )
    ex = R.read_classification(tmp_path / "t.jsonl")
    assert [(e.text_a, e.label) for e in ex] == [("Naomi wept", "1"), ("Ruth clave", "0")]


def test_sentence_pairs_and_label_inference(tmp_path):
    ex = R.read_classification(write(tmp_path, "p.tsv", "sentence1\tsentence2\tlabel\nA\tB\t3.8\nC\tD\t5.000\n"))
    assert (ex[0].text_a, ex[0].text_b) == ("A", "B")
    assert R.infer_labels([e.label for e in ex]) == ("regression", [])
    assert R.infer_labels(["b", "a", "b"]) == ("classification", ["a", "b"])
    assert R.infer_labels(["10", "2", "0"]) == ("classification", ["0", "2", "10"])


def test_pydocs_task_label_map(shared_dir, minilm_dir):
    task = shared_dir / "tasks" / "pydocs_topic"
    td = D.prepare_task(
        "sequence-classification",
        task / "train.tsv",
        task / "dev.tsv",
        minilm_dir,
        max_seq_length=64,
        max_train_examples=120,
        max_eval_examples=50,
    )
    assert td.id2label == dict(enumerate(["c-api", "howto", "library", "reference", "tutorial", "whatsnew"]))
    assert len(td.train["input_ids"]) == 120 and len(td.eval["labels"]) == 50
    assert max(len(x) for x in td.train["input_ids"]) == 64
    # the first dev row is "... ``__slots__`` ..." style text whose label name maps back
    first = (task / "dev.tsv").read_text().splitlines()[1].split("\t")
    assert td.id2label[td.eval["labels"][0]] == first[1]
    # the seeded subset keeps several classes
    assert len(set(td.train["labels"])) == 6


def test_pair_encoding_matches_transformers(tok, minilm_dir):
    transformers = pytest.importorskip("transformers")
    ref = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    ex = [R.TextExample("Naomi said unto Ruth, Go!", "And Ruth clave unto her " * 10, "a", 1)]
    enc = D.encode_classification(tok, ex, 24)
    want = ref("Naomi said unto Ruth, Go!", "And Ruth clave unto her " * 10, truncation="longest_first", max_length=24)
    assert enc["input_ids"][0] == want["input_ids"] and enc["token_type_ids"][0] == want["token_type_ids"]


def test_pad_batch():
    rows = {
        "input_ids": [[101, 7, 102], [101, 102]],
        "token_type_ids": [[0, 0, 0], [0, 0]],
        "labels": [[-100, 3, -100], [-100, -100]],
    }
    b = D.pad_batch(rows, [1, 0])
    assert b["input_ids"].tolist() == [[101, 102, 0], [101, 7, 102]]
    assert b["labels"].tolist() == [[-100, -100, -100], [-100, 3, -100]]
    assert b["attention_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert D.pad_batch({"input_ids": [[1], [1, 2]], "labels": [4, 5]}, [0, 1])["labels"].tolist() == [4, 5]


# -- token classification --------------------------------------------------------------------------------------


def test_conll_first_wordpiece_labels(tmp_path, tok):
    p = write(
        tmp_path,
        "a.conll",
        "-DOCSTART- -X- O\n\nNaomi NNP B-PER\nunto IN O\nBethlehemjudah NNP B-LOC\n\nthe O\nLORD B-DEITY\nGod I-DEITY\n",  # noqa: E501
    )
    sents = R.read_conll(p)
    assert [s.words for s in sents] == [["Naomi", "unto", "Bethlehemjudah"], ["the", "LORD", "God"]]
    assert sents[0].row == 3 and sents[1].row == 7
    names = R.tag_labels(sents)
    assert names == ["O", "B-DEITY", "I-DEITY", "B-LOC", "B-PER"]
    l2i = {n: i for i, n in enumerate(names)}
    enc = D.encode_tokens(tok, sents, l2i, 32)
    # [CLS] naomi unto bethlehem ##ju ##dah [SEP]: label on 'bethlehem' only
    assert [tok.id_to_token(i) for i in enc["input_ids"][0]] == [
        "[CLS]",
        "naomi",
        "unto",
        "bethlehem",
        "##ju",
        "##dah",
        "[SEP]",
    ]
    assert enc["labels"][0] == [-100, l2i["B-PER"], l2i["O"], l2i["B-LOC"], -100, -100, -100]
    assert enc["word_ids"][0] == [-1, 0, 1, 2, 2, 2, -1]
    assert enc["labels"][1] == [-100, l2i["O"], l2i["B-DEITY"], l2i["I-DEITY"], -100]


def test_bible_fixture_tags(tok):
    sents = R.read_conll(DATA / "bible_ner_train.conll")
    tags = {t for s in sents for t in s.tags}
    assert tags == {"O", "B-PER", "B-LOC", "B-DEITY", "I-DEITY"}
    words = [w for s in sents for w, t in zip(s.words, s.tags) if t == "B-DEITY"]
    assert set(words) == {"LORD"}


# -- QA ----------------------------------------------------------------------------------------------------------


def _squad(
    qas, context="Naomi had a kinsman of her husband's, a mighty man of wealth, and his name was Boaz.", version=None
):
    doc = {"data": [{"title": "Ruth 2", "paragraphs": [{"context": context, "qas": qas}]}]}
    if version:
        doc["version"] = version
    return json.dumps(doc)


def test_read_squad_v1_v2(tmp_path):
    ctx = "Naomi had a kinsman of her husband's, a mighty man of wealth, and his name was Boaz."
    v1 = write(
        tmp_path,
        "v1.json",
        _squad(
            [
                {
                    "id": "a",
                    "question": "who was the kinsman?",
                    "answers": [{"text": "Boaz", "answer_start": ctx.index("Boaz")}],
                }
            ]
        ),
    )
    ex, v2 = R.read_squad(v1)
    assert not v2 and ex[0].answers[0]["text"] == "Boaz"
    p = write(tmp_path, "v2.json", _squad([{"id": "u", "question": "who wept?", "answers": [], "is_impossible": True}]))
    ex, v2 = R.read_squad(p)
    assert v2 and ex[0].is_impossible and ex[0].answers == []


def test_qa_windows_stride_and_positions(tmp_path, tok):
    ex, _ = R.read_squad(DATA / "bible_squad_train.json")
    feats, windows = D.encode_qa(tok, ex[:40], max_seq_length=64, doc_stride=16, max_query_length=24)
    by_q: dict[str, list[int]] = {}
    for i, w in enumerate(windows):
        by_q.setdefault(w["example_id"], []).append(i)
    assert any(len(v) >= 3 for v in by_q.values())  # long contexts are split
    exs = {e.qid: e for e in ex[:40]}
    for qid, idxs in by_q.items():
        e = exs[qid]
        found = 0
        for i in idxs:
            ids, off = feats["input_ids"][i], windows[i]["offsets"]
            assert len(ids) <= 64 and ids[0] == tok.token_to_id("[CLS]") and ids[-1] == tok.token_to_id("[SEP]")
            s, t = feats["start_positions"][i], feats["end_positions"][i]
            if s:
                found += 1
                assert e.context[off[s][0] : off[t][1]] == e.answers[0]["text"]
        # an answerable question has its answer whole in at least one window; an impossible one in none
        assert (found > 0) == (not e.is_impossible)
        # consecutive windows overlap by exactly doc_stride context tokens
        ctx_offs = [[o for o in windows[i]["offsets"] if o is not None] for i in idxs]
        for a, b in zip(ctx_offs, ctx_offs[1:]):
            assert a[-16:] == b[:16]
        # together the windows cover every context token
        assert ctx_offs[0][0][0] == 0 and ctx_offs[-1][-1][1] == len(e.context.rstrip())


def reference_qa(tok, ex: R.QAExample, max_seq_length: int, doc_stride: int, max_query_length: int):
    """Doc-stride windows the straightforward way (what encode_qa did by hand before the tokenizer did it):
    question and context encoded alone, a window of `room` context tokens moved by `room - doc_stride`."""
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    q = tok.encode(ex.question, add_special_tokens=False).ids[:max_query_length]
    c = tok.encode(ex.context, add_special_tokens=False)
    ids, offsets = c.ids, c.offsets  # each attribute access builds a new list
    room, head = max_seq_length - len(q) - 3, len(q) + 2
    rows, begin = [], 0
    while True:
        end = min(begin + room, len(ids))
        off = [None] * head + offsets[begin:end] + [None]
        sp = ep = 0
        if ex.answers:
            a, b = ex.answers[0]["answer_start"], ex.answers[0]["answer_start"] + len(ex.answers[0]["text"])
            inside = [k for k in range(begin, end) if offsets[k][1] > a and offsets[k][0] < b]
            if inside and offsets[inside[0]][0] <= a and offsets[inside[-1]][1] >= b:
                sp, ep = inside[0] - begin + head, inside[-1] - begin + head
        rows.append(([cls_id, *q, sep_id, *ids[begin:end], sep_id], [0] * head + [1] * (end - begin + 1), sp, ep, off))
        if end >= len(ids):
            return rows
        begin += room - doc_stride


def _long_examples() -> list[R.QAExample]:
    """One context of ten fixture contexts (about 1,000 tokens), questions longer than max_query_length with
    accents, CJK and punctuation, answers at the start, in the middle and at the very end."""
    ex, _ = R.read_squad(DATA / "bible_squad_train.json")
    ctx = " ".join(list(dict.fromkeys(e.context for e in ex))[:10]) + " Naïve café 北京, don't — Boaz."
    q = "Who, in the café of 北京 (naïve!), said unto Naomi: " + " ".join(e.question for e in ex[:12])
    out = []
    for k, start in enumerate([0, 1, len(ctx) // 3, len(ctx) // 2 + 7, len(ctx) - 5]):
        text = ctx[start : start + 17]
        out.append(
            R.QAExample(f"long-{k}", q if k % 2 else ex[k].question, ctx, [{"text": text, "answer_start": start}])
        )
    out.append(R.QAExample("long-none", q, ctx, [], True))
    out.append(R.QAExample("empty", "Who?", "", [], True))
    return out


@pytest.mark.parametrize(
    "max_seq_length, doc_stride, max_query_length", [(64, 16, 24), (384, 128, 64), (32, 4, 8), (100, 0, 64)]
)
@pytest.mark.parametrize("examples", ["fixtures", "long"])
def test_qa_windows_equal_the_straightforward_ones(tok, examples, max_seq_length, doc_stride, max_query_length):
    if examples == "fixtures":
        ex = R.read_squad(DATA / "bible_squad_train.json")[0] + R.read_squad(DATA / "bible_squad_dev.json")[0]
    else:
        ex = _long_examples()
    feats, windows = D.encode_qa(tok, ex, max_seq_length, doc_stride, max_query_length)
    want = [(e.qid, row) for e in ex for row in reference_qa(tok, e, max_seq_length, doc_stride, max_query_length)]
    got = list(
        zip(
            feats["input_ids"],
            feats["token_type_ids"],
            feats["start_positions"],
            feats["end_positions"],
            [w["offsets"] for w in windows],
        )
    )
    assert [w["example_id"] for w in windows] == [qid for qid, _ in want]
    assert got == [row for _, row in want]
    assert examples == "fixtures" or len(windows) > 3 * len(ex)  # the long context really is split


def test_qa_windows_are_run_qa_windows(tok, minilm_dir):
    """The windows transformers' run_qa.py builds (truncation="only_second", stride, overflowing tokens)."""
    transformers = pytest.importorskip("transformers")
    ref = transformers.BertTokenizerFast.from_pretrained(str(minilm_dir))
    ex = _long_examples()[:1]
    feats, windows = D.encode_qa(tok, ex, 96, 24, 64)
    want = ref(
        ex[0].question,
        ex[0].context,
        truncation="only_second",
        max_length=96,
        stride=24,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    assert feats["input_ids"] == want["input_ids"] and feats["token_type_ids"] == want["token_type_ids"]
    for w, offsets, seq in zip(windows, want["offset_mapping"], (want.sequence_ids(i) for i in range(len(windows)))):
        assert w["offsets"] == [tuple(o) if s == 1 else None for o, s in zip(offsets, seq)]


# -- bad data: one line naming file, row and problem ------------------------------------------------------------


@pytest.mark.parametrize(
    "name, text, msg",
    [
        ("e.tsv", "", "e.tsv: file is empty"),
        ("h.tsv", "sentence\tlabel\n", "h.tsv: file has a header but no rows"),
        ("m.tsv", "text\tlabel\nNaomi wept\ta\n", "m.tsv: row 2: missing column(s) sentence"),
        (
            "r.tsv",
            "sentence\tlabel\nNaomi wept\ta\nRuth\tb\textra\n",
            "r.tsv: row 3: malformed row: 3 fields, header has 2",
        ),
        ("j.jsonl", '{"sentence": "a", "label": "x"}\n{"sentence": "b", "label": \n', "j.jsonl: row 2: malformed JSON"),
        ("l.tsv", "sentence\tlabel\nNaomi wept\t\n", "l.tsv: row 2: empty 'label'"),
    ],
)
def test_classification_bad_data(tmp_path, name, text, msg):
    with pytest.raises(R.FinetuneDataError) as e:
        R.read_classification(write(tmp_path, name, text))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_unknown_eval_label(tmp_path, minilm_dir):
    tr = write(tmp_path, "train.tsv", "sentence\tlabel\nNaomi wept\ta\nRuth clave\tb\n")
    ev = write(tmp_path, "dev.tsv", "sentence\tlabel\nNaomi wept\ta\nBoaz\tc\n")
    with pytest.raises(
        R.FinetuneDataError, match=r"dev.tsv: row 3: unknown label 'c' \(not in the training labels: a, b\)"
    ):
        D.prepare_task("sequence-classification", tr, ev, minilm_dir)


@pytest.mark.parametrize(
    "text, msg",
    [
        ("Naomi B-PER\nwept\n", "row 2: malformed row: expected 'token tag'"),
        ("Naomi PER\n", "row 1: malformed tag 'PER'"),
        ("\n\n", "file is empty"),
    ],
)
def test_conll_bad_data(tmp_path, text, msg):
    with pytest.raises(R.FinetuneDataError, match=msg):
        R.read_conll(write(tmp_path, "x.conll", text))


def test_conll_unknown_eval_tag(tmp_path, minilm_dir):
    tr = write(tmp_path, "tr.conll", "Naomi B-PER\nwept O\n")
    ev = write(tmp_path, "ev.conll", "Naomi B-PER\n\nMoab B-LOC\n")
    with pytest.raises(R.FinetuneDataError, match=r"ev.conll: row 3: unknown label 'B-LOC'"):
        D.prepare_task("token-classification", tr, ev, minilm_dir)


def test_squad_bad_answer_and_missing_data(tmp_path):
    p = write(
        tmp_path, "s.json", _squad([{"id": "q7", "question": "who?", "answers": [{"text": "Boaz", "answer_start": 3}]}])
    )
    with pytest.raises(R.FinetuneDataError, match=r"s.json: row q7: answer 'Boaz' is not at answer_start 3"):
        R.read_squad(p)
    p = write(tmp_path, "n.json", json.dumps({"version": "1.1"}))
    with pytest.raises(R.FinetuneDataError, match="missing top-level 'data'"):
        R.read_squad(p)
    p = write(tmp_path, "b.json", '{"data": [')
    with pytest.raises(R.FinetuneDataError, match=r"b.json: row 1: malformed JSON"):
        R.read_squad(p)


def test_missing_file(tmp_path):
    with pytest.raises(R.FinetuneDataError, match="does not exist"):
        R.read_classification(tmp_path / "nope.tsv")


@pytest.mark.parametrize(
    "name, reader", [("t.tsv", R.read_classification), ("t.conll", R.read_conll), ("t.json", R.read_squad)]
)
def test_non_utf8_file_is_one_line_error(tmp_path, name, reader):
    p = tmp_path / name
    p.write_bytes(b"sentence\tlabel\n\xff\xfe caf\xe9\ta\n")
    with pytest.raises(R.FinetuneDataError, match=rf"{name}: not valid UTF-8 \(byte 15\)"):
        reader(p)


# -- sentence embeddings: pairs and BEIR sets ---------------------------------------------------------------------


def beir(tmp_path: Path, corpus: str, queries: str, qrels: str, split: str = "test") -> Path:
    (tmp_path / "qrels").mkdir(parents=True, exist_ok=True)
    write(tmp_path, "corpus.jsonl", corpus)
    write(tmp_path, "queries.jsonl", queries)
    write(tmp_path / "qrels", f"{split}.tsv", qrels)
    return tmp_path


CORPUS = '{"_id": "d1", "title": "Ruth", "text": "Whither thou goest"}\n{"_id": "d2", "text": "I will go"}\n'
QUERIES = '{"_id": "q1", "text": "where will you go"}\n{"_id": "q2", "text": "no judgement"}\n'
QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t0\n"


def test_embedding_task_features(tmp_path, minilm_dir):
    """Pairs become query and positive ids (and negatives' when the file has them); the eval queries are those with
    a relevant document, searched against the whole corpus (`title text`); a qrels file inside the directory is
    another split of the same set."""
    write(tmp_path, "pairs.tsv", "query\tpositive\tnegative\nwho\tRuth\tOrpah\nwhere\tMoab\tJudah\n")
    d = beir(tmp_path / "b", CORPUS, QUERIES, QRELS)
    td = D.prepare_task("embedding", tmp_path / "pairs.tsv", d, minilm_dir, 16)
    tok = D.load_tokenizer(minilm_dir)
    assert td.task == "embedding" and td.train["positive_ids"][0] == tok.encode("Ruth").ids
    assert td.train["negative_ids"][1] == tok.encode("Judah").ids and len(td.train["input_ids"]) == 2
    r = td.retrieval
    assert r.query_ids == ["q1"] and r.doc_ids == ["d1", "d2"] and r.qrels == {"q1": {"d1": 1}}
    assert (
        r.corpus[0] == tok.encode("Ruth Whither thou goest").ids
        and td.eval["input_ids"][0] == tok.encode("where will you go").ids
    )
    write(tmp_path / "b" / "qrels", "dev.tsv", "query-id\tcorpus-id\tscore\nq2\td2\t2\n")
    assert D.prepare_task("embedding", tmp_path / "pairs.tsv", d / "qrels" / "dev.tsv", minilm_dir).retrieval.qrels == {
        "q2": {"d2": 2}
    }


@pytest.mark.parametrize(
    "pairs,corpus,queries,qrels,msg",
    [
        (
            "query\tpos\nwho\tRuth\n",
            CORPUS,
            QUERIES,
            QRELS,
            r"pairs.tsv: row 2: missing column\(s\) positive; has query, pos",
        ),
        (
            "query\tpositive\tnegative\nwho\tRuth\t \n",
            CORPUS,
            QUERIES,
            QRELS,
            r"pairs.tsv: row 2: empty or non-text 'negative'",
        ),
        (
            "query\tpositive\nwho\tRuth\n",
            CORPUS,
            QUERIES,
            "query-id\tcorpus-id\tscore\nq1\td9\t1\n",
            r"qrels/test.tsv: row 2: corpus-id 'd9' is not in .*corpus.jsonl",
        ),
        (
            "query\tpositive\nwho\tRuth\n",
            CORPUS,
            QUERIES,
            "query-id\tcorpus-id\tscore\nq1\td1\t1\nq7\td1\t1\n",
            r"qrels/test.tsv: row 3: query-id 'q7' is not in .*queries.jsonl",
        ),
        ("query\tpositive\nwho\tRuth\n", "\n", QUERIES, QRELS, r"corpus.jsonl: file is empty"),
        (
            "query\tpositive\nwho\tRuth\n",
            CORPUS + '{"_id": "d1", "text": "again"}\n',
            QUERIES,
            QRELS,
            r"corpus.jsonl: row 3: _id 'd1' again \(first at row 1\)",
        ),
        (
            "query\tpositive\nwho\tRuth\n",
            CORPUS,
            QUERIES,
            "q1\td1\t1\n",
            r"qrels/test.tsv: row 1: header 'q1\\td1\\t1'",
        ),
        (
            "query\tpositive\nwho\tRuth\n",
            CORPUS,
            QUERIES,
            "query-id\tcorpus-id\tscore\nq1\td1\t0\n",
            r"qrels/test.tsv: no relevant \(score > 0\) query-document pair",
        ),
    ],
    ids=[
        "pairs-missing-column",
        "empty-negative",
        "unknown-document",
        "unknown-query",
        "empty-corpus",
        "duplicate-id",
        "no-header",
        "nothing-relevant",
    ],
)
def test_embedding_bad_data_is_one_line_naming_file_and_row(tmp_path, minilm_dir, pairs, corpus, queries, qrels, msg):
    write(tmp_path, "pairs.tsv", pairs)
    d = beir(tmp_path / "b", corpus, queries, qrels)
    with pytest.raises(R.FinetuneDataError, match=msg) as e:
        D.prepare_task("embedding", tmp_path / "pairs.tsv", d, minilm_dir)
    assert "\n" not in str(e.value)
