"""What a GPU captures into CUDA graphs must be capturable: no host synchronization (a tensor's value read on the
host: .item(), .tolist(), a bool or int of a tensor; nonzero and boolean-mask indexing, whose output size is a
value), and no tensor made from host data (a Python list as an index, torch.tensor(list)), which a capture refuses
as a copy from pageable memory. On a GPU such an op ends the capture (the step then runs eagerly, slowly) or reads
a stale value on every replay. On the CPU every body that backends/cuda_graphs.CapturedStep captures runs
uncaptured; here each runs under a dispatch mode that records those ops: the language model's prefill graph, decode
steps and decode loop with every sampling feature, and Whisper's slot steps and decode blocks, on the Triton kernels
(interpreted: their launch wrappers are what a GPU runs)."""

from __future__ import annotations

import traceback
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from speechrt.backends.cuda_graphs import CapturedStep

pytestmark = pytest.mark.usefixtures("one_cpu_thread")
CPU = torch.device("cpu")
SYNCS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive"}
SYNCS |= {"bincount", "is_nonzero", "equal", "masked_scatter", "randperm"}


class HostReads(TorchDispatchMode):
    """Records (op, where in our code) for each op that a capture cannot hold; ops inside a Triton interpreter
    launch are the interpreter's own, not a GPU's."""

    def __init__(self, found: list, launches: list):
        super().__init__()
        self.found, self.launches = found, launches

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.launches:
            return out
        name = func.overloadpacket.__name__
        bad = name in SYNCS
        bad |= name in ("index", "index_put", "index_put_", "_index_put_impl_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ())
        )
        bad |= name == "repeat_interleave" and "output_size" not in kwargs and isinstance(args[0], torch.Tensor)
        bad |= name in ("lift_fresh", "lift_fresh_copy") and isinstance(out, torch.Tensor) and out.dim() > 0
        if bad:
            self.found.append((name, _ours()))
        return out


def _ours() -> str:
    frames = [f for f in traceback.extract_stack() if "/speechrt/" in f.filename or "/backends/" in f.filename]
    return " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in frames[-3:][::-1])


@pytest.fixture
def guarded(monkeypatch):
    """Every CapturedStep body runs under HostReads (and Tensor.tolist, which bypasses dispatch, is caught too) ->
    (what was found, the bodies run by their function's name)."""
    from triton.runtime.interpreter import InterpretedFunction

    found, ran, launches = [], [], []
    run = InterpretedFunction.run

    def launch(self, *a, **k):
        launches.append(1)
        try:
            return run(self, *a, **k)
        finally:
            launches.pop()

    def body(self):
        tolist = torch.Tensor.tolist

        def host_list(t):
            if not launches:
                found.append(("tolist", _ours()))
            return tolist(t)

        ran.append(getattr(self.fn, "__qualname__", "?"))
        torch.Tensor.tolist = host_list
        try:
            with HostReads(found, launches):
                return self.fn()
        finally:
            torch.Tensor.tolist = tolist

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the kernels were imported interpreted (tests/conftest.py)
    monkeypatch.setattr(InterpretedFunction, "run", launch)
    monkeypatch.setattr(CapturedStep, "__call__", body)
    return found, ran


def test_the_detector_catches_each_kind_of_host_read(guarded):
    found, ran = guarded
    x = torch.arange(6.0)
    for fn in (
        lambda: x[1].item(),
        lambda: x.tolist(),
        lambda: x[x > 2],
        lambda: x[[0, 1]],
        lambda: torch.nonzero(x),
        lambda: x.repeat_interleave(torch.tensor([1, 2, 1, 1, 1, 1])),
        lambda: (x * torch.tensor(2.0)).sum(),  # a 0-dim host value is an argument, not a copy: allowed
    ):
        CapturedStep(fn, capture=False)()
    kinds = ["_local_scalar_dense", "tolist", "index", "lift_fresh", "nonzero", "lift_fresh", "repeat_interleave"]
    assert [n for n, _ in found] == kinds
    assert len(ran) == 7


@torch.inference_mode()
def test_language_model_graph_bodies_read_nothing_on_the_host(guarded, tmp_path_factory):
    pytest.importorskip("transformers", reason="builds the tiny model: pip install 'speechrt[peers]'")
    pytest.importorskip("gguf")
    from lm_archs import byte_bpe, written  # tests/lm_archs.py

    from speechrt.backends.torch import lm as torch_lm
    from speechrt.backends.triton.lm import TritonLMRunner
    from speechrt.models import registry
    from speechrt.pipelines.generation import GenerationOptions
    from speechrt.pipelines.lm_batching import ContinuousBatcher, LMRequest

    found, ran = guarded
    _, d = written("llama3", tmp_path_factory, byte_bpe())
    runner = TritonLMRunner(torch_lm.load_file(registry.resolve(str(d), "lm")), CPU, "float32", "triton", capture=False)
    assert runner.graphs_enabled and runner.fused_why is None
    b = ContinuousBatcher(runner, runner.tokenizer, max_batch=4, max_seq=48, block=4)
    every = dict(temperature=0.8, top_p=0.9, top_k=20, logit_bias={5: 2.0}, presence_penalty=0.5)
    options = [
        GenerationOptions(max_tokens=2, stop_token_ids=(9,)),
        GenerationOptions(max_tokens=4, seed=3, frequency_penalty=0.3, repetition_penalty=1.2, **every),
    ]
    for i, o in enumerate(options):  # prompts from their graph, a step of both, then a block of two of the second
        b.submit(LMRequest([3 + i, 40, 41, 42, 43][: 3 + i], o, lambda p: None, key=i))
    while b.has_work():
        b.step()
    assert found == [], found
    names = " ".join(ran)
    assert "DecodeLoop" in names and "_DecodeGraph" in names and "_PrefillGraph" in names, ran


@torch.inference_mode()
def test_whisper_graph_bodies_read_nothing_on_the_host(guarded):
    from speechrt.backends.asr_state import Encoded
    from speechrt.backends.triton.asr import TritonASRRunner
    from speechrt.kernels import select
    from speechrt.models.whisper import Whisper, WhisperConfig
    from speechrt.models.whisper_loaders import WhisperWeights
    from speechrt.pipelines.transcribe_options import TranscribeOptions
    from speechrt.pipelines.whisper_decoding import LogitRules
    from speechrt.pipelines.whisper_search import greedy_from

    found, ran = guarded
    cfg = WhisperConfig(8, 12, 32, 2, 1, 97, 48, 32, 2, 2)
    g = torch.Generator().manual_seed(0)
    ref = Whisper(cfg, select("torch", "cpu"))
    state = {k: torch.randn(v.shape, generator=g) * (0.5 if v.dim() > 1 else 0.1) for k, v in ref.state_dict().items()}
    runner = TritonASRRunner(WhisperWeights(cfg, state, None), CPU, torch.float32, capture=False, block_steps=4)
    tok = SimpleNamespace(
        eot=70, no_timestamps=79, timestamp_begin=80, encode=lambda s: [71], suppress_ids=lambda s: [3]
    )
    prompt = [72, 73, 74]
    xa = torch.randn(3, 9, 32, generator=g)
    st = runner.start(Encoded(xa, torch.tensor([9, 4, 7])), 1, len(prompt) + 6)
    runner.decode_step(st, torch.tensor([prompt] * 3))
    rules = LogitRules(tok, TranscribeOptions(max_initial_timestamp=0.04), 3, "cpu")
    seqs, lp = [[80], [5], [81, 6]], [0.0] * 3
    greedy_from(runner, tok.eot, st, rules, seqs, lp, [0, 1, 2], 0, 6, None, 3, set())
    assert found == [], found
    names = " ".join(ran)
    assert "DecodeBlock" in names and names.count("<lambda>") >= 1, ran
