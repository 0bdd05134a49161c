"""backends.cuda_graphs without a GPU: the bounded cache of captured steps (capture and replay themselves
run in `speechrt bench gpu`, on a GPU)."""
from __future__ import annotations

from speechrt.backends.cuda_graphs import GraphCache


def test_graph_cache_drops_the_least_recently_used():
    made = []

    def make(k):
        return lambda: made.append(k) or f"graph {k}"
    c = GraphCache(2)
    assert c.get("a", make("a")) == "graph a" and c.get("b", make("b")) == "graph b"
    assert c.get("a", make("a2")) == "graph a"  # a hit makes nothing and refreshes "a"
    assert c.get("c", make("c")) == "graph c"  # full: "b", the least recently used, goes
    assert len(c) == 2 and made == ["a", "b", "c"]
    assert c.get("b", make("b2")) == "graph b2"  # made again
    assert c.get("a", make("a3")) == "graph a3"  # "a" went when "b" came back
    assert made == ["a", "b", "c", "b2", "a3"]
