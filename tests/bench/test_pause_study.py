"""`python -m benchmarks.pause_study`: turns with a pause inside, against a real `speechrt serve`, briefly."""

from __future__ import annotations

import re

from benchmarks import pause_study
from speechrt.models.wer import wer


def test_turns_with_a_pause_inside_are_answered_once_each(capsys):
    rows = pause_study.main(["--turns", "1", "--gap", "0.5", "--silence-ms", "800"])
    out = capsys.readouterr().out
    assert len(rows) == 1
    for r, (first, then) in zip(rows, pause_study.TURNS):
        # the pause inside did not end the turn: one transcript of both parts, after the 800-ms pause that did
        assert wer(f"{first} {then}", r["transcript"]) <= 0.3, r
        assert 0.7 < r["final"] <= r["v2v"] < 60, r
    m = re.search(
        r"replies begun in pauses (\d+), taken over (\d+); replies' prompt tokens found in the cache: "
        r"(\d+) of (\d+)",
        out,
    )
    assert m, out
    begun, used, reused, total = map(int, m.groups())
    assert used <= min(begun, len(rows)) and 0 <= reused <= total and total > 0
