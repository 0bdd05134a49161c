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


def test_a_step_whose_capture_fails_runs_eagerly_and_is_counted(monkeypatch, caplog):
    """A capture that fails (an operation the capture does not allow) must not fail the request: the step
    runs eagerly from then on, the failure is logged and counted, and no capture is tried again."""
    import torch

    from speechrt.backends.cuda_graphs import CapturedStep

    tries = []

    def failing_capture(self):
        tries.append(1)
        raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    monkeypatch.setattr(CapturedStep, "_capture", failing_capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    x = torch.randn(3, 5)
    step = CapturedStep(lambda: x * 2)
    failed = CapturedStep.failed
    with caplog.at_level("WARNING", logger="speechrt.graphs"):
        assert torch.equal(step(), x * 2)
        x.add_(1)  # eager: later calls see the buffers as they are now
        assert torch.equal(step(), x * 2)
    assert tries == [1] and CapturedStep.failed == failed + 1 and step.graph is None
    assert "capture failed; this step runs eagerly" in caplog.text
    assert torch.equal(CapturedStep(lambda: x + 1, capture=False)(), x + 1)  # uncaptured by request: no try
