"""VITS in PyTorch against the voice's own ONNX graph run by onnxruntime, on the same weights.

With the noise scales at 0 the graph is deterministic, so the torch model must reproduce its audio; the
second voice is a Piper export (piper's own SynthesizerTrn and export code) of a different architecture —
"high" quality generator (ResBlock1, four upsamplers), multi-speaker — to show that any Piper voice loads.
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from speechrt import kernels
from speechrt.models.piper_loader import config_from_weights, load_vits, read_onnx_weights
from speechrt.models.registry import ModelError, resolve
from speechrt.models.tts_text import TextFrontEnd
from speechrt.models.vits import PRESETS, VITS, with_vits_ops

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Would you like a cup of tea?",
    "Streaming speech synthesis starts speaking long before the sentence is finished, which keeps latency low.",
    "Hello!",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The model is called directly here (not through the runner's one-thread workers): one intra-op thread
    keeps these tests fast when other processes share the CPU (OpenMP barriers stall otherwise)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def voice():
    path = resolve("piper-en_US-joe-medium", "tts").path
    model, cfg = load_vits(path, kernels.select("torch"))
    so = ort.SessionOptions()
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return path, model, cfg, sess


def _ort(sess, ids, scales=(0.0, 1.0, 0.0), sid=None):
    feed = {
        "input": np.array([ids], np.int64),
        "input_lengths": np.array([len(ids)], np.int64),
        "scales": np.array(scales, np.float32),
    }
    if sid is not None:
        feed["sid"] = np.array([sid], np.int64)
    return sess.run(None, feed)[0].reshape(-1)


@torch.inference_mode()
def _torch(model, ids, length_scale=1.0, g=None):
    m, logs = model.prior(torch.tensor([ids]), length_scale, 0.0, g=g)
    return model.decode(model.latent(m, logs, 0.0, g=g), g=g).reshape(-1).numpy()


def test_config_recovered_from_graph(voice):
    path, model, cfg, _ = voice
    assert model.config == PRESETS["medium"]  # everything inferred from shapes and Conv attributes
    assert cfg.sample_rate == 22050 and cfg.espeak_voice == "en-us" and cfg.num_speakers == 1
    assert model.config.hop_length == 256


def test_every_weight_recovered_including_anonymous(voice):
    path, model, _, _ = voice
    import onnx
    from onnx import numpy_helper

    g = onnx.load(str(path)).graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    sd = model.state_dict()
    # anonymous weight-normed WaveNet convs, found through their consumer node's name
    node = next(n for n in g.node if n.name == "/flow/flows.6/enc/in_layers.0/Conv")
    assert node.input[1].startswith("onnx::")
    np.testing.assert_array_equal(sd["flow.flows.6.enc.in_layers.0.weight"].numpy(), inits[node.input[1]])
    # the phoneme embedding is stored under the unused input's name "sid"
    np.testing.assert_array_equal(sd["enc_p.emb.weight"].numpy(), inits["sid"])
    # each of the anonymous initializers lands in exactly one parameter
    anon = [k for k in inits if k.startswith("onnx::") and inits[k].dtype == np.float32 and inits[k].ndim == 3]
    assert len(anon) == 32  # 4 flows x 4 WaveNet layers x (in_layer, res_skip_layer)
    for k in anon:
        hits = [n for n, v in sd.items() if v.shape == inits[k].shape and np.array_equal(v.numpy(), inits[k])]
        assert len(hits) == 1 and ".enc." in hits[0], k
    # exp(-logs) folded by the exporter becomes logs again
    np.testing.assert_allclose(np.exp(-sd["dp.flows.0.logs"].numpy()), inits["/dp/flows.0/Exp_output_0"], rtol=1e-6)


@pytest.mark.parametrize("length_scale", [1.0, 1.3])
def test_torch_matches_onnxruntime(voice, length_scale):
    _, model, cfg, sess = voice
    fe = TextFrontEnd(cfg)
    for text in SENTENCES if length_scale == 1.0 else SENTENCES[:2]:
        ids = next(fe.sentences(text))
        ref = _ort(sess, ids, (0.0, length_scale, 0.0))
        out = _torch(model, ids, length_scale)
        assert out.shape == ref.shape, text
        assert np.abs(out - ref).max() <= 1e-3, text
        assert np.abs(ref).max() > 0.1  # real speech, not silence


def test_not_a_piper_voice(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    # a valid ONNX model (one convolution) that is not a VITS voice, with a real voice config beside it
    w = numpy_helper.from_array(np.ones((4, 2, 3), np.float32), "conv.weight")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "conv.weight"], ["y"], name="/conv/Conv")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    fake = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph), str(fake))
    voice_json = resolve("piper-en_US-joe-medium", "tts").path.with_suffix(".onnx.json")
    (tmp_path / "conv.onnx.json").write_text(voice_json.read_text())
    with pytest.raises(ModelError, match="not a Piper VITS voice"):
        load_vits(fake, kernels.select("torch"))
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"this is not onnx at all")
    (tmp_path / "garbage.onnx.json").write_text(voice_json.read_text())
    with pytest.raises(ModelError, match="not an ONNX model"):
        load_vits(garbage, kernels.select("torch"))
    (tmp_path / "nojson.onnx").write_bytes(fake.read_bytes())
    (tmp_path / "nojson.onnx.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ModelError, match="not a Piper voice config"):
        load_vits(tmp_path / "nojson.onnx", kernels.select("torch"))


@pytest.fixture(scope="module")
def exported_voice(tmp_path_factory):
    """A small multi-speaker 'high'-architecture voice exported by Piper's own training code, the way
    piper.train.export_onnx does it (TorchScript exporter, opset 15, weight norm removed from the generator)."""
    models = pytest.importorskip("piper.train.vits.models", reason="piper-tts carries Piper's VITS training code")
    from piper.train.vits.config import ModelAudioConfig

    torch.manual_seed(0)
    a = ModelAudioConfig.high_quality()
    m = models.SynthesizerTrn(
        n_vocab=256,
        spec_channels=65,
        segment_size=32,
        inter_channels=32,
        hidden_channels=48,
        filter_channels=64,
        n_heads=2,
        n_layers=2,
        kernel_size=3,
        p_dropout=0.0,
        resblock=a.resblock,
        resblock_kernel_sizes=a.resblock_kernel_sizes,
        resblock_dilation_sizes=a.resblock_dilation_sizes,
        upsample_rates=a.upsample_rates,
        upsample_initial_channel=64,
        upsample_kernel_sizes=a.upsample_kernel_sizes,
        n_speakers=3,
        gin_channels=16,
        use_sdp=True,
    ).eval()
    with torch.no_grad():  # zero-initialized layers and unit norms get values, so every path matters
        for n, p in m.named_parameters():
            if any(s in n for s in ("post", "proj", "gamma", "beta", ".m", "logs")) and "enc_q" not in n:
                p.add_(torch.randn_like(p) * 0.05)
        m.dec.remove_weight_norm()

    def infer_forward(text, text_lengths, scales, sid=None):
        return m.infer(
            text, text_lengths, noise_scale=scales[0], length_scale=scales[1], noise_scale_w=scales[2], sid=sid
        )[0].unsqueeze(1)

    m.forward = infer_forward
    d = tmp_path_factory.mktemp("voice")
    path = d / "xx_XX-test-high.onnx"
    ids = torch.randint(0, 256, (1, 50))
    torch.onnx.export(
        m,
        (ids, torch.LongTensor([50]), torch.FloatTensor([0.667, 1.0, 0.8]), torch.LongTensor([0])),
        str(path),
        opset_version=15,
        input_names=["input", "input_lengths", "scales", "sid"],
        output_names=["output"],
        dynamo=False,
        dynamic_axes={
            "input": {0: "batch_size", 1: "phonemes"},
            "input_lengths": {0: "batch_size"},
            "output": {0: "batch_size", 2: "time"},
        },
    )
    cfg = json.loads(resolve("piper-en_US-joe-medium", "tts").path.with_suffix(".onnx.json").read_text())
    cfg.update(num_symbols=256, num_speakers=3, speaker_id_map={"a": 0, "b": 1, "c": 2})
    (d / (path.name + ".json")).write_text(json.dumps(cfg))
    return path


def test_other_piper_architecture_loads_and_matches(exported_voice):
    model, cfg = load_vits(exported_voice, kernels.select("torch"))
    c = model.config
    assert (c.resblock, c.upsample_rates, c.n_speakers, c.gin_channels, c.hidden_channels, c.n_layers) == (
        "1",
        (8, 8, 2, 2),
        3,
        16,
        48,
        2,
    )
    assert c.resblock_dilation_sizes == ((1, 3, 5),) * 3
    sess = ort.InferenceSession(str(exported_voice), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for sid in (0, 2):
        ids = [1, 0] + [int(x) for x in rng.integers(3, 256, 30)] + [2]
        ref = _ort(sess, ids, sid=sid)
        g = model.speaker(torch.tensor([sid]))
        out = _torch(model, ids, g=g)
        assert out.shape == ref.shape
        assert np.abs(out - ref).max() <= 1e-3
    w = read_onnx_weights(exported_voice)
    assert config_from_weights(w) == c


@pytest.mark.parametrize("T", [1, 3, 5, 37])
def test_relative_attention_op_matches_vits(T):
    """The kernel-set op against VITS's own MultiHeadAttention (pad/reshape formulation), lengths below and
    above the relative window, with a padded key."""
    attentions = pytest.importorskip("piper.train.vits.attentions")
    torch.manual_seed(T)
    C, H, W = 16, 2, 4
    ref = attentions.MultiHeadAttention(C, C, H, window_size=W).eval()
    x = torch.randn(1, C, T)
    mask = torch.ones(1, 1, T, T)
    if T > 2:
        mask[..., -1] = 0  # last key masked
    with torch.no_grad():
        expected = ref(x, x, mask)
        q, k, v = (conv(x).view(1, H, C // H, T).transpose(2, 3) for conv in (ref.conv_q, ref.conv_k, ref.conv_v))
        out = with_vits_ops(kernels.select("torch")).relative_attention(q, k, v, ref.emb_rel_k, ref.emb_rel_v, mask)
        out = ref.conv_o(out.transpose(2, 3).reshape(1, C, T))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_voice_config_must_fit_the_network(exported_voice, tmp_path):
    bad = tmp_path / exported_voice.name
    bad.write_bytes(exported_voice.read_bytes())
    cfg = json.loads(exported_voice.with_suffix(".onnx.json").read_text())
    (tmp_path / (bad.name + ".json")).write_text(json.dumps(dict(cfg, num_speakers=1)))
    with pytest.raises(ModelError, match="says 1 speakers, the network has 3"):
        load_vits(bad, kernels.select("torch"))
    cfg["phoneme_id_map"]["x"] = [300]
    (tmp_path / (bad.name + ".json")).write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="uses id 300 but the network has 256 symbols"):
        load_vits(bad, kernels.select("torch"))


def test_other_voice_through_the_api_on_both_backends(exported_voice):
    """Multi-speaker voice end to end: speaker names; the onnxruntime backend (the voice exported in pieces on
    first use) and the shipped graph cut with the speaker embedding as a second generator input both agree
    with torch through the streaming code."""
    from speechrt.backends.onnxruntime.shipped import OrtTTSRunner
    from speechrt.errors import UserError
    from speechrt.pipelines.tts import TTSPipeline, load_tts

    t = load_tts(str(exported_voice), backend="torch")
    o = load_tts(str(exported_voice), backend="onnxruntime")
    assert o.runner.info.format == "speechrt-onnx"
    # its generator joined in the blocked layout (backends/onnxruntime/nchwc.py), the speaker's conditioning (a
    # broadcast over time) left plain: the joined graph passed the check against the stock one
    assert o.runner.model.reorders_removed > 0
    shipped = TTSPipeline(OrtTTSRunner(exported_voice, ["CPUExecutionProvider"]))
    assert len(shipped.runner.cuts) == 2  # z and the speaker embedding
    kw = dict(noise_scale=0.0, noise_w=0.0, speaker="b")
    a = t.synthesize_array("Any voice loads.", **kw)
    for other, tol in ((o, 1e-4), (shipped, 1e-3)):
        b = other.synthesize_array("Any voice loads.", **kw)
        assert a.shape == b.shape and np.isfinite(b).all() and np.abs(a - b).max() <= tol
    c = t.synthesize_array("Any voice loads.", noise_scale=0.0, noise_w=0.0, speaker=0)
    assert not (c.shape == a.shape and np.allclose(c, a))  # another speaker sounds different
    with pytest.raises(UserError, match="speakers 0..2"):
        t.synthesize_array("Hi.", speaker=3)
    with pytest.raises(UserError, match="unknown speaker 'z'.*a, b, c"):
        t.synthesize_array("Hi.", speaker="z")


def test_vits_ops_join_any_kernel_set():
    base = kernels.select("torch")
    assert "conv1d" not in base  # kernel sets hold the ops that have Triton versions
    ops = with_vits_ops(base)
    assert {"conv1d", "conv_transpose1d", "relative_attention", "layer_norm", "gelu", "linear"} <= set(ops.names())
    assert ops.sources["conv1d"] == "torch" and ops.layer_norm is base.layer_norm
    assert with_vits_ops(ops) is ops


def _depends(f, z, i: int, a: int, b: int) -> bool:
    """Whether f's output over latent frames [a, b) changes when frame i of its input z does. Outside the
    receptive field the output is bit-identical: the same products summed in the same order."""
    with torch.inference_mode():
        y = f(z)
        z2 = z.clone()
        z2[:, :, i] += 3.0
        y2 = f(z2)
    per = y.shape[-1] // z.shape[-1]  # output samples per latent frame
    return not torch.equal(y[..., a * per : b * per], y2[..., a * per : b * per])


@pytest.mark.parametrize("preset", ["medium", "high", "x_low", "voice"])
def test_contexts_are_the_exact_receptive_fields(preset, voice):
    """vocoder_reach() and flow_context() are the generator's and the flow's receptive fields exactly (the
    streaming windows' context: a frame more is wasted work at every window border, a frame less changes the
    audio): a window's output changes with the input frame at the edge of each side, not with the next."""
    if preset == "voice":
        model = voice[1]
    else:
        torch.manual_seed(0)
        model = VITS(PRESETS[preset], with_vits_ops(kernels.select("torch")))
    cfg = model.config
    frames, a, b = 80, 37, 43
    z = torch.randn(1, cfg.inter_channels, frames)
    flow = lambda x: model.flow.reverse(x, torch.ones_like(x[:, :1]))  # noqa: E731
    (left, right), fc = cfg.vocoder_reach(), cfg.flow_context()
    assert cfg.vocoder_context() == max(left, right) and min(left, right) > 0
    for f, lo, hi in ((model.dec, left, right), (flow, fc, fc)):
        assert _depends(f, z, a - lo, a, b) and not _depends(f, z, a - lo - 1, a, b)
        assert _depends(f, z, b - 1 + hi, a, b) and not _depends(f, z, b + hi, a, b)


def test_work_per_frame_counts_every_convolution():
    """flow_macs() and generator_macs() (the windows' split weighs the flow against the generator with
    them) equal the multiply-adds of the modules' convolutions, counted by torch on a real forward pass."""
    from torch.utils.flop_counter import FlopCounterMode

    for cfg in (PRESETS["medium"], PRESETS["high"], PRESETS["x_low"]):
        model = VITS(cfg, with_vits_ops(kernels.select("torch")))
        frames = 50
        z = torch.randn(1, cfg.inter_channels, frames)
        for f, want in (
            (model.dec, cfg.generator_macs()),
            (lambda x, model=model: model.flow.reverse(x, torch.ones_like(x[:, :1])), cfg.flow_macs()),
        ):
            with torch.inference_mode(), FlopCounterMode(display=False) as fc:
                f(z)
            assert fc.get_total_flops() / 2 / frames == pytest.approx(want, rel=1e-6)
