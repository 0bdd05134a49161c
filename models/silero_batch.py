"""Silero VAD for many audio streams in one batched call: the weights of the `silero-vad` wheel's sequence graph
(`silero_vad_16k_sequence.onnx`, the model SileroVAD runs; the wheel's `silero_vad_16k.safetensors` holds other
weights) in torch, on the CPU or the server's GPU, each stream's LSTM state a batch row.

A frame's probability depends on the frames before it only through the LSTM state, so a tick's frames of every
stream go through the convolutional front end in one pass ([N, 576] -> [N, 128]); the LSTM then steps once per
frame position k over the streams that have a k-th frame (the streams sorted by frame count, longest first, so
those rows are a prefix), and the output head runs once over all N. Chunks of any size work: VadStream carries
each stream's remainder and context as before. Same probabilities as the ONNX graphs within float rounding
(tests/models/test_silero_batch.py)."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .silero import CONTEXT, FRAME, SEQUENCE_GRAPH, BatchLayout, VadStream

HIDDEN = 128
N_FFT, HOP = 256, 128  # the model's STFT, as a convolution with its stored basis
# the sequence graph's initializers -> SileroNet's parameters
_NAMES = {f"encoder.{i}.{p}": f"conv{i + 1}.{p}" for i in range(4) for p in ("weight", "bias")}
_NAMES.update({"stft.forward_basis_buffer": "stft_conv.weight", "output.weight": "final_conv.weight"})
_NAMES["output.bias"] = "final_conv.bias"


class SileroNet(nn.Module):
    """The 16 kHz Silero v5 network with its weights' names: a window [N, CONTEXT + FRAME] -> its features
    [N, HIDDEN] (`encode`); the LSTM cell; the output head (`head`: hidden [N, HIDDEN] -> probabilities [N])."""

    def __init__(self):
        super().__init__()
        self.stft_conv = nn.Conv1d(1, N_FFT + 2, N_FFT, stride=HOP, bias=False)
        self.conv1 = nn.Conv1d(N_FFT // 2 + 1, 128, 3, padding=1)
        self.conv2 = nn.Conv1d(128, 64, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(64, 64, 3, stride=2, padding=1)
        self.conv4 = nn.Conv1d(64, HIDDEN, 3, padding=1)
        self.lstm_cell = nn.LSTMCell(HIDDEN, HIDDEN)
        self.final_conv = nn.Conv1d(HIDDEN, 1, 1)

    def encode(self, windows: torch.Tensor) -> torch.Tensor:
        x = F.pad(windows[:, None], (0, CONTEXT), mode="reflect")  # [N, 1, 640]
        x = self.stft_conv(x)  # [N, 258, 4]: real and imaginary parts of 129 bins
        half = N_FFT // 2 + 1
        x = torch.sqrt(x[:, :half] ** 2 + x[:, half:] ** 2)
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4):
            x = torch.relu(conv(x))
        return x[:, :, 0]  # (time is 1 after the two strided convolutions)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.final_conv(torch.relu(h)[:, :, None]))[:, 0, 0]


def _weights(path) -> dict[str, torch.Tensor]:
    """SileroNet's state dict from the sequence graph's initializers. ONNX's LSTM stacks its gates i, o, f, c and
    splits the bias into input and recurrent halves; torch's LSTMCell stacks them i, f, c, o."""
    import onnx
    from onnx import numpy_helper

    init = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    out = {ours: torch.from_numpy(init[theirs].copy()) for theirs, ours in _NAMES.items()}
    lstm = [v[0] for k, v in sorted(init.items()) if k.startswith("onnx::LSTM")]  # W [512, 128], R, B [1024]
    if len(lstm) != 3:
        raise ValueError(f"{path}: expected the LSTM's three initializers (W, R, B), found {len(lstm)}")

    def gates(x):
        i, o, f, c = np.split(x, 4)
        return torch.from_numpy(np.concatenate([i, f, c, o]))

    w, r, b = lstm
    out.update({"lstm_cell.weight_ih": gates(w), "lstm_cell.weight_hh": gates(r)})
    out.update({"lstm_cell.bias_ih": gates(b[: 4 * HIDDEN]), "lstm_cell.bias_hh": gates(b[4 * HIDDEN :])})
    return out


class BatchedSilero:
    """One Silero for a server's streams on `device` ('cpu', 'cuda', ...): `run_batch` runs several streams'
    frames in one batched call. A stream's state is a tensor [2, HIDDEN] (h and c) on the device. Not
    thread-safe: one thread (the VadWorker's) runs it."""

    sequence = True  # (as SileroVAD's: a chunk's frames run together)
    tick_s = 0.0  # the VadWorker's least time between ticks (silero_for sets a GPU's)

    def __init__(self, device: str | torch.device = "cpu", path=None):
        from pathlib import Path

        from .registry import resolve

        path = Path(path or resolve("silero-vad", "vad").path).with_name(SEQUENCE_GRAPH)
        self.device = torch.device(device)
        self.net = SileroNet()
        self.net.load_state_dict(_weights(path))
        self.net.to(self.device).eval()
        self._zero = torch.zeros(2, HIDDEN, device=self.device)
        # on a GPU, a CUDA stream of its own: a tick does not queue behind the engine's model steps
        self._cuda = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def stream(self) -> VadStream:
        return VadStream(self, self._zero)

    def run(self, windows: np.ndarray, state: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
        """One stream's frames (as SileroVAD.run)."""
        probs, states = self.run_batch([windows], [state])
        return probs[0], states[0]

    @torch.inference_mode()
    def run_batch(self, windows: list[np.ndarray], states: list) -> tuple[list[np.ndarray], list]:
        """Streams' consecutive frames windows[i] [T_i, WINDOW] (T_i may be 0) from states[i] -> each stream's
        probabilities [T_i] and its state after its last frame (as SileroVAD.run_batch)."""
        lay = BatchLayout([len(w) for w in windows])
        if not lay.steps:
            return lay.split(np.zeros(0, np.float32)), list(states)
        with torch.cuda.stream(self._cuda) if self._cuda is not None else contextlib.nullcontext():
            return self._run(lay, windows, states)

    def _run(self, lay: BatchLayout, windows: list[np.ndarray], states: list) -> tuple[list[np.ndarray], list]:
        x = torch.from_numpy(lay.rows(windows)).to(self.device, non_blocking=True)
        hc = torch.stack([self._row(states[i]) for i in lay.order[: lay.live]], 1)  # [2, live, HIDDEN]
        h, c = hc[0].clone(), hc[1].clone()
        feats = self.net.encode(x)  # [N, HIDDEN]: every frame of the tick in one pass
        hs = []
        for k in range(lay.steps):
            b, o = int(lay.width[k]), int(lay.offsets[k])
            hk, ck = self.net.lstm_cell(feats[o : o + b], (h[:b], c[:b]))
            h[:b], c[:b] = hk, ck
            hs.append(hk)
        probs = self.net.head(torch.cat(hs)).float().cpu().numpy()  # (the tick's one wait on the device)
        return lay.split(probs), lay.scatter(list(torch.stack([h, c], 1).unbind(0)), states)

    def _row(self, state) -> torch.Tensor:
        if isinstance(state, np.ndarray):  # (a state of SileroVAD's: [2, 1, HIDDEN])
            return torch.from_numpy(state.reshape(2, HIDDEN)).to(self.device)
        return state

    def speech_probs(self, audio16k: np.ndarray) -> np.ndarray:
        """Speech probability of each 32 ms frame of a whole recording (the last frame zero-padded)."""
        audio16k = np.asarray(audio16k, np.float32)
        pad = -len(audio16k) % FRAME
        return self.stream().process(np.pad(audio16k, (0, pad)) if pad else audio16k)
