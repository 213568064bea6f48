"""Fuzzing every reader in CI (issue 38): seeded mutations of small real inputs (bench/data/fuzz_readers.py) through
expand_inputs -> split_units -> read_documents, with a fixed budget of cases and seconds. Asserted for each case:
no unhandled exception, every record read or rejected (none lost or invented without a reason), every document's
text writable as UTF-8, bounded time. The minimal reproducers of what it found are in test_sources.py and
test_wiki.py; `python bench/data/fuzz_readers.py --cases 3000` runs the same cases at a larger budget."""

from __future__ import annotations

from collections import Counter

import pytest

from conftest import load_bench


@pytest.fixture(scope="module")
def fuzz():
    return load_bench("fuzz_readers")


def test_mutated_inputs_are_all_read_or_rejected_with_reasons(fuzz):
    # as many cases as 4 s allow, up to 2,000 (about 1,200 on a quiet core; `python bench/data/fuzz_readers.py` runs
    # more)
    outcomes = fuzz.fuzz(cases=2000, seed=38, seconds=4.0, slow=2.0)
    bad = [o for o in outcomes if o.verdict != "ok"]
    assert not bad, "\n" + fuzz.report(bad, show=10)
    assert len(outcomes) >= 100, len(outcomes)  # the budget ran enough cases to mean something
    forms = Counter(o.case.seed.form for o in outcomes)
    assert set(forms) == {s.form for s in fuzz.seeds()}, forms  # every reader


def test_the_harness_counts_a_lost_record(fuzz, tmp_path):
    """The judge itself: a file the reader reads fewer records of than it holds is `lost`."""
    seed = next(s for s in fuzz.seeds() if s.name == "w.jsonl")
    case = fuzz.Case(0, seed, "none", {"w.jsonl": seed.plain}, seed.plain + b'{"text": "one more"}\n' * 2)
    out = fuzz.run_case(case, tmp_path, slow=60)
    assert (out.verdict, out.records, out.expected) == ("lost", 6, 8)


def test_hostile_markup_timing_table_is_linear_or_rejected():
    """bench/data/reader_timing.py's table (bench/RESULTS.md quotes it), at small sizes: every hostile page is rejected
    by the markup budget or converted, fast, and the long-line checks are fast."""
    timing = load_bench("reader_timing")
    table = timing.markup_table([2, 4], cap=5.0)
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    assert len(rows) == len(timing.MARKUP) + 2
    for row in rows:
        seconds = [float(x.split()[0]) for x in row[1:3]]  # each cell: CPU seconds, then the outcome
        assert max(seconds) < 1.0, row


def test_the_technical_dump_and_the_unclosed_records_run_small():
    """reader_timing.py --technical (3 manual pages, if `man` is there, and the Python docs) and --unclosed-record
    (10 MB a form, a cap of 1 MiB): nothing rejected for its markup, each unclosed record rejected, the rest read."""
    timing = load_bench("reader_timing")
    report = timing.technical(3, None)
    assert "this checkout: markup_budget 0 of " in report, report
    table = timing.unclosed_records(0.01, 1)
    assert table.count("['record_too_large'] + 3 documents") == 3, table
