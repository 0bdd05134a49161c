"""`bench tts` interleaves its engines; the order must never run one engine twice in a row."""

from __future__ import annotations

from speechrt.bench.tts import turns


def test_no_engine_follows_itself_and_places_are_even():
    for n in (2, 3, 4, 5):
        engines = [f"e{k}" for k in range(n)]
        seq = [e for i in range(6 * n) for e in turns(engines, i)]
        assert all(a != b for a, b in zip(seq, seq[1:])), n
        for i in range(6 * n):
            assert sorted(turns(engines, i)) == engines  # each round runs every engine once
        # from three engines on, over n rounds every engine takes every place once (two simply alternate)
        for place in range(n if n > 2 else 0):
            assert sorted(turns(engines, i)[place] for i in range(n)) == engines
    assert turns(["only"], 3) == ["only"]
