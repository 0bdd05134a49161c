"""The onnxruntime backend runs a Piper voice as our VITS exported in pieces (made on first use); the voice's
shipped graph cut around the flow and the generator into three sessions (OrtTTSRunner) must give what the whole
graph gives; both must agree with the torch backend through the same runner interface; providers are chosen per
device with clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from speechrt import backends
from speechrt.errors import UserError
from speechrt.models.registry import resolve
from speechrt.models.tts_text import TextFrontEnd
from speechrt.pipelines.tts import SynthesisOptions, stream_latent

ort_backend = pytest.importorskip("speechrt.backends.onnxruntime.providers")
ort_shipped = pytest.importorskip("speechrt.backends.onnxruntime.shipped")


@pytest.fixture(scope="module")
def runners():
    m = resolve("piper-en_US-joe-medium", "tts")
    shipped = ort_shipped.OrtTTSRunner(m.path, ["CPUExecutionProvider"], m.name)
    return shipped, backends.get("torch").tts(m, device="cpu"), backends.get("onnxruntime").tts(m, device="cpu")


def test_registry_lists_onnxruntime():
    assert "onnxruntime" in backends.BACKENDS and "onnxruntime" in backends.available()
    # it runs every family now (issue 13), speech recognition included
    assert all("onnxruntime" in backends.available(f) for f in ("asr", "lm", "tts"))


def test_split_graph_equals_whole_graph(runners):
    ort_r = runners[0]
    assert ort_r.cuts == ["/Mul_7_output_0"]  # z * y_mask, the input of /dec/conv_pre/Conv (one speaker: no g)
    assert ort_r.flow_cuts == ["/Add_output_0", "/Cast_2_output_0"]  # the prior sample z_p and the frame mask
    o = SynthesisOptions(noise_scale=0.0, noise_w=0.0)
    ids = next(TextFrontEnd(ort_r.voice).sentences("Two sessions, one graph."))
    lat = ort_r.latent(ids, o)
    split = ort_r.vocode(lat, 0, lat.frames).numpy()
    whole = ort_r.run_graph(ids, o)
    # the flow runs in two pieces (each with its receptive field as context): equal up to float rounding
    assert split.shape == whole.shape and np.abs(split - whole).max() <= 1e-4
    assert lat.z.shape[1] == 192 and lat.frames * 256 == len(whole)


@pytest.mark.parametrize("which, tol", [("shipped", 1e-3), ("export", 1e-4)])
def test_runners_agree_through_the_interface(runners, which, tol):
    shipped, torch_r, export = runners
    ort_r = shipped if which == "shipped" else export
    assert (ort_r.hop_length, ort_r.context_frames, ort_r.sample_rate) == (
        torch_r.hop_length,
        torch_r.context_frames,
        torch_r.sample_rate,
    )
    o = SynthesisOptions(noise_scale=0.0, noise_w=0.0, length_scale=0.8)
    ids = next(TextFrontEnd(ort_r.voice).sentences("Both backends say the same thing."))
    a = torch.cat(list(stream_latent(ort_r, ort_r.latent(ids, o), o))).numpy()
    b = torch.cat(list(stream_latent(torch_r, torch_r.latent(ids, o), o))).numpy()
    assert a.shape == b.shape and np.isfinite(a).all() and np.abs(a - b).max() <= tol


def test_the_backend_runs_a_piper_voice_as_its_export(runners):
    export = runners[2]
    assert (export.info.backend, export.info.format, export.info.model) == (
        "onnxruntime",
        "speechrt-onnx",
        "piper-en_US-joe-medium",
    )


def test_providers_for_devices():
    assert ort_backend.providers_for("cpu") == ["CPUExecutionProvider"]
    have = ort_backend.ort.get_available_providers()
    gpu = [
        p
        for p in (
            "CUDAExecutionProvider",
            "ROCMExecutionProvider",
            "MIGraphXExecutionProvider",
            "TensorrtExecutionProvider",
        )
        if p in have and ort_backend.provider_loadable(p)
    ]
    if not gpu:
        assert ort_backend.providers_for("auto") == ["CPUExecutionProvider"]
        with pytest.raises(UserError, match="no GPU execution provider.*onnxruntime-gpu"):
            ort_backend.providers_for("cuda")
    else:
        names = [p[0] if isinstance(p, tuple) else p for p in ort_backend.providers_for("cuda:0")]
        assert names[-1] == "CPUExecutionProvider" and set(gpu) <= set(names)
    with pytest.raises(UserError, match="valid: cpu, cuda"):
        ort_backend.providers_for("tpu")


def test_a_listed_provider_whose_library_is_missing_is_left_out(monkeypatch):
    # onnxruntime-gpu lists TensorRT whether or not TensorRT is installed; none of these machines has it
    if ort_backend.provider_loadable("TensorrtExecutionProvider"):
        pytest.skip("TensorRT's library loads here: the case is a machine without it")
    assert ort_backend.provider_loadable("CUDAExecutionProvider")
    monkeypatch.setattr(
        ort_backend.ort,
        "get_available_providers",
        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
    )
    assert ort_backend.providers_for("cuda:1") == [
        ("CUDAExecutionProvider", {"device_id": 1, "cudnn_conv_algo_search": "HEURISTIC", "use_tf32": 0}),
        "CPUExecutionProvider",
    ]
    monkeypatch.setattr(
        ort_backend.ort, "get_available_providers", lambda: ["TensorrtExecutionProvider", "CPUExecutionProvider"]
    )
    with pytest.raises(UserError, match="no GPU execution provider"):
        ort_backend.providers_for("cuda")


def test_bad_dtype_and_model():
    with pytest.raises(UserError, match="runs voices in float32"):
        backends.get("onnxruntime").tts(resolve("piper-en_US-joe-medium", "tts"), dtype="float16")
    with pytest.raises(UserError, match="float32"):
        backends.get("torch").tts(resolve("piper-en_US-joe-medium", "tts"), dtype="float16")
