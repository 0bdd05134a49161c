"""ASR runner of the `triton` backend: the torch runner built with the Triton kernel set, with every
single-token decoder step replayed from a CUDA graph (HIP graph on ROCm).

A decode step launches some 15 kernels per layer, each too short to hide its launch cost; a graph
launches them all at once. Graphs need fixed shapes and addresses, so the steps run through the
model's fixed-shape path (Whisper.decoder with a `position` tensor: cache write by index, attention
over the whole cache masked by length) on the buffers of a slot: one per batch-size bucket (1, 2, 4, 8,
...), its caches as long as the decoder's context and its cross-attention keys/values as long as a whole
window, the rows and positions past a state's own masked by length (the kernels skip them). A state's
first step on the graph path copies its caches and cross keys/values into the slot of its bucket and
from then on runs on the slot's buffers (its tensors become views of them); another state taking the
slot later gets copies of them back first. So a server's batches, whatever their rows, encoder lengths
and token budgets, reuse a handful of graphs captured once each. (Before, graphs were keyed by the
state's own tensors: on an H200 under 16 streams every batch captured new ones, and one capture failed.)

A prompt pass from position 0 (a window's prompt; on a live round, the prompt with each row's draft) runs
on the slot's buffers too, its tokens padded to a width bucket (8, 16, 32, 64, 128), one graph per slot
and width: causal attention keeps the padding from the real positions, and what the padding writes to
the cache lies past the state's offset, masked or overwritten by later steps. (Run eagerly, these passes
were a third of the engine's Python time at 96 streams on an H100, launching every kernel from Python.)
Other passes of several tokens (a re-fed draft after a rewind) run eagerly on the slot's buffers.

The single-token steps run in the fused layer kernels (models/whisper_fused.py, kernels/triton_fused_whisper.py: each
LayerNorm folded into the projection that reads it, six launches per layer plus the two decode attentions, against
some twenty unfused) unless `fused=False` or the kernel set is not Triton; `fused_why` says which. The unfused step
stays the reference they are tested against; prompt passes and eager steps run unfused.

Run on NVIDIA H100/H200 (docs/gpu.md): replayed logits equal the eager steps'; on the CPU the slot path
is tested uncaptured against the plain runner (tests/kernels/test_triton_asr_slots.py).
"""

from __future__ import annotations

import logging
import threading
import weakref

import torch

from speechrt.kernels.reference import WHISPER_FUSED_OPS
from speechrt.models.whisper_fused import decoder_step_fused
from speechrt.models.whisper_loaders import load_weights

from ..asr_state import reorder_state
from ..cuda_graphs import CapturedStep, GraphCache, rows_bucket
from ..torch.asr import TorchASRRunner, parse_dtype
from ..whisper_loop import BlockRows, BlockRules, DecodeBlock, pick_rows, suppress_mask

log = logging.getLogger(__name__)

MAX_GRAPHS = 8  # batch-size buckets kept; a slot of 8 rows holds ~170 MB (Whisper tiny, float16)
PROMPT_WIDTHS = (8, 16, 32, 64, 128)  # token buckets of the prompt passes replayed from graphs
BLOCK_STEPS = 8  # greedy steps per graph replay (decode_block)


def width_bucket(t: int) -> int | None:
    """The width of the prompt graph that serves t tokens, or None past the widest (such a pass runs eagerly)."""
    return next((w for w in PROMPT_WIDTHS if w >= t), None)


class _Slot:
    """One captured decoder step over its own buffers: `rows` rows, caches of the decoder's whole context,
    cross keys/values of a whole window, each row's encoder length; the state bound to it (`owner`). `fused_ops`: the
    step in those fused kernels (models.whisper_fused), None: the model's own; `pick`: the decode blocks' greedy pick
    (kernels.reference_pick's by default)."""

    def __init__(self, model, rows: int, dtype, device, capture: bool, fused_ops=None, pick=None):
        c = model.config
        shape = (rows, c.n_text_head, c.n_audio_ctx, c.n_text_state // c.n_text_head)
        self.rows = rows
        self.caches = model.new_cache(rows, c.n_text_ctx, dtype, device)
        self.cross = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(c.n_text_layer)
        ]
        self.lengths = torch.full((rows,), c.n_audio_ctx, dtype=torch.long, device=device)
        self.tokens = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.position = torch.zeros((1,), dtype=torch.long, device=device)
        self.owner = None  # weakref to the bound DecoderState
        caches, cross, lengths = self.caches, self.cross, self.lengths
        dec = model.decoder

        def decode(tokens, position):  # one token per row at `position` on the buffers -> logits [rows, V]
            if fused_ops is None:
                return dec(tokens, caches, 0, cross, position=position, cross_lengths=lengths)
            return decoder_step_fused(dec, fused_ops, tokens, caches, cross, position, lengths)

        self.decode = decode
        self.pick = pick or WHISPER_FUSED_OPS["whisper_pick"]  # the greedy pick after a step (see DecodeBlock)
        tokens, position = self.tokens, self.position
        self.step = CapturedStep(lambda: decode(tokens, position), capture)
        self.decoder, self.capture = model.decoder, capture
        self.prompts: dict[int, tuple[torch.Tensor, CapturedStep]] = {}  # width -> (its tokens, its pass)
        self.blocks: dict[tuple, DecodeBlock] = {}  # (steps, rules) -> the block of that many steps

    def buffers(self):
        return [t for kv in (*self.caches, *self.cross) for t in kv] + [self.lengths]

    def holds(self, state) -> bool:
        return state.bound is self and state.caches[0][0].data_ptr() == self.caches[0][0].data_ptr()

    def adopt(self, state):
        """Copy `state` (its valid positions, encoder keys/values and lengths) into the buffers and make its
        tensors views of them; a state bound before, still alive, gets copies of its rows back."""
        self.release()
        n, T, S = state.caches[0][0].shape[0], state.offset, state.cross[0][0].shape[2]
        for (bk, bv), (k, v) in zip(self.caches, state.caches):
            bk[:n, :, :T].copy_(k[:, :, :T])
            bv[:n, :, :T].copy_(v[:, :, :T])
        for (bk, bv), (k, v) in zip(self.cross, state.cross):
            bk[:n, :, :S].copy_(k)
            bv[:n, :, :S].copy_(v)
        if state.cross_lengths is None:
            self.lengths[:n].fill_(S)
        else:
            self.lengths[:n].copy_(state.cross_lengths)
        self.view(state, n)
        self.owner = weakref.ref(state)

    def view(self, state, n: int):
        state.caches = [(k[:n], v[:n]) for k, v in self.caches]
        state.cross = [(k[:n], v[:n]) for k, v in self.cross]
        state.cross_lengths = self.lengths[:n]
        state.bound = self

    def __call__(self, tokens, position: int, n: int):
        self.tokens[:n].copy_(tokens, non_blocking=True)
        self.position.fill_(position)
        return self.step()[:n]

    def prompt_pass(self, width: int) -> tuple[torch.Tensor, CapturedStep]:
        """The pass of `width` tokens from position 0 over the slot's buffers -> hidden states [rows, width,
        d] (the vocabulary projection of only the positions wanted runs after it), made on first use."""
        if width not in self.prompts:
            tokens = torch.zeros((self.rows, width), dtype=torch.long, device=self.tokens.device)
            caches, cross, lengths, dec = self.caches, self.cross, self.lengths, self.decoder
            self.prompts[width] = (
                tokens,
                CapturedStep(lambda: dec.hidden(tokens, caches, 0, cross, False, cross_lengths=lengths), self.capture),
            )
        return self.prompts[width]

    def block(self, k: int, rules: BlockRules) -> DecodeBlock:
        """The block of `k` greedy steps under `rules` on the buffers (on a GPU, one graph), made on first use."""
        key = (k, rules)
        if key not in self.blocks:
            vocab = self.decoder.token_embedding.weight.shape[0]
            dev = self.tokens.device
            self.blocks[key] = DecodeBlock(self.decode, self.pick, self.rows, k, vocab, rules, dev, self.capture)
        return self.blocks[key]

    def prompt(self, tokens, width: int):
        """tokens [n, t] (t <= width) from position 0 on the bound state's rows -> hidden states [n, t, d]."""
        buf, run = self.prompt_pass(width)
        n, t = tokens.shape
        buf[:n, :t].copy_(tokens, non_blocking=True)
        return run()[:n, :t].contiguous()

    def release(self):
        """No state bound any more (a live one gets copies of its rows): the buffers are free to run on."""
        prev = self.owner() if self.owner is not None else None
        if prev is not None and self.holds(prev):
            detach(prev)
        self.owner = None


def detach(state):
    """Give a state bound to a slot its own copies of its rows (the slot is about to hold another)."""
    state.caches = [(k.clone(), v.clone()) for k, v in state.caches]
    state.cross = [(k.clone(), v.clone()) for k, v in state.cross]
    state.cross_lengths = state.cross_lengths.clone()
    state.bound = None


class TritonASRRunner(TorchASRRunner):
    def __init__(
        self,
        weights,
        device,
        dtype,
        model_name: str = "",
        model_format: str = "",
        graphs: bool = True,
        capture: bool | None = None,
        kernels: str = "triton",
        fused: bool = True,
        block_steps: int | None = None,
    ):
        """`graphs`: single-token steps on the slots' fixed buffers, captured as graphs on a GPU. `capture`
        (default: on CUDA/HIP devices) False runs the slot path uncaptured, and `kernels="torch"` on the
        reference kernels: what the CPU tests check. `fused`: those steps in the fused layer kernels where the
        kernel set is Triton (`fused_why` says why not); False keeps the unfused step, their reference.
        `block_steps` (a power of two): greedy decoding runs that many steps per call on the device (`decode_block`;
        default BLOCK_STEPS where steps are captured, else 0: one step per call); 0 or 1 turns it off."""
        super().__init__(weights, device, dtype, kernels, None, model_name, model_format)
        self.fused_why = self._fused_why(fused)
        self.fused_ops = None
        if self.fused_why is None:
            from speechrt.kernels.triton_fused_whisper import OPS

            self.fused_ops = OPS
        else:
            log.info("decoder steps unfused: %s", self.fused_why)
        self.capture = device.type == "cuda" if capture is None else capture
        self.graphs_enabled = graphs and (self.capture or capture is False)
        if block_steps is None:
            block_steps = BLOCK_STEPS if self.capture else 0
        if block_steps > 1 and block_steps & (block_steps - 1):
            raise ValueError(f"block_steps must be a power of two (or 0), got {block_steps}")
        self.block_steps = block_steps if self.graphs_enabled and block_steps > 1 else 0
        self._graphs = GraphCache(MAX_GRAPHS)
        self._masks: dict = {}  # (rules, vocab) -> the suppressed tokens' mask (pick)
        self._pick = (self.fused_ops or WHISPER_FUSED_OPS)["whisper_pick"]  # Triton's where the steps are fused
        self._lock = threading.Lock()  # one thread at a time on the slots

    def _fused_why(self, fused: bool) -> str | None:
        """Why single-token steps run unfused, or None: they run in the fused kernels."""
        if not fused:
            return "off by request (fused=False)"
        if self.model.decoder.ops.sources.get("linear") != "triton":
            return f"the kernel set is {self.model.decoder.ops.impl!r}, not Triton"
        return None

    @property
    def slot_rows(self) -> list[int]:
        """The batch-size buckets that have a slot (on a GPU, a captured step), smallest first."""
        return sorted(self._graphs.items)

    @property
    def prompt_widths(self) -> dict[int, list[int]]:
        """Per slot (its rows), the prompt widths that have a pass (on a GPU, a captured graph)."""
        return {rows: sorted(slot.prompts) for rows, slot in sorted(self._graphs.items.items())}

    @property
    def block_sizes(self) -> dict[int, list[int]]:
        """Per slot (its rows), the decode block sizes it has (on a GPU, captured graphs), under any rules."""
        return {rows: sorted({k for k, _ in slot.blocks}) for rows, slot in sorted(self._graphs.items.items())}

    def _slot(self, n: int) -> _Slot:
        rows = rows_bucket(n)
        return self._graphs.get(
            rows, lambda: _Slot(self.model, rows, self.dtype, self.device, self.capture, self.fused_ops, self._pick)
        )

    @torch.inference_mode()
    def decode_step(self, state, tokens, last_only=True):
        if self.graphs_enabled and tokens.shape[1] > 1 and state.offset == 0:
            width = width_bucket(tokens.shape[1])
            if width is not None and width <= self.config.n_text_ctx:
                return self._prompt(state, tokens, width, last_only)
        if not self.graphs_enabled or tokens.shape[1] != 1:
            return super().decode_step(state, tokens, last_only)
        with self._lock:
            logits = self._bind(state, tokens)(tokens.to(self.device), state.offset, tokens.shape[0])
        state.offset += 1
        return logits

    def block_room(self, state, need: int) -> int:
        """The steps of the block to run on `state` whose rows need at most `need` more: `block_steps`, or the
        power of two that covers `need` if smaller; 0 (one step per call) when blocks are off, that is 1, or fewer
        positions are left in the state's cache."""
        k = min(self.block_steps, rows_bucket(max(need, 1)))
        return k if k > 1 and state.offset + k <= state.caches[0][0].shape[2] else 0

    @torch.inference_mode()
    def decode_block(self, state, k: int, rows: BlockRows, rules: BlockRules) -> tuple[list, list]:
        """`k` (a `block_room`) greedy steps of the state's rows, each entering as `rows` says, under `rules`, on the
        device -> (each row's k tokens, their log-probabilities): backends/whisper_loop.py."""
        n = len(rows.queue)
        if k < 2 or state.offset + k > state.caches[0][0].shape[2]:
            raise RuntimeError(f"no block of {k} steps at position {state.offset} (see block_room)")
        with self._lock:
            slot = self._bind(state, torch.empty((n, k)))
            out = slot.block(k, rules)(rows, state.offset)
        state.offset += k
        return out

    @torch.inference_mode()
    def pick(self, logits, rules: BlockRules, state) -> tuple[torch.Tensor, torch.Tensor]:
        """The greedy picks from logits [n, V] (on the device) of rows in rule state `state` ([4, n] int64: last,
        penult, last_ts, count) under `rules`, as a block picks them -> (ids [n], log-probabilities [n])."""
        key = (rules, logits.shape[-1])
        if key not in self._masks:
            self._masks[key] = suppress_mask(rules, logits.shape[-1], self.device)
        return pick_rows(self._pick, logits.float(), rules, self._masks[key], state.to(self.device))

    def _prompt(self, state, tokens, width: int, last_only: bool):
        with self._lock:
            x = self._bind(state, tokens).prompt(tokens.to(self.device), width)
        state.offset = tokens.shape[1]
        return self.model.decoder.logits(x[:, -1] if last_only else x)

    def _bind(self, state, tokens) -> _Slot:
        """The slot of the state's rows, with the state in it (copied in unless it is there already), for
        `tokens` [n, t] at the state's offset (RuntimeError past its cache). The caller holds the lock."""
        if state.offset + tokens.shape[1] > state.caches[0][0].shape[2]:
            raise RuntimeError(f"decoder cache full ({state.caches[0][0].shape[2]} positions)")
        slot = self._slot(tokens.shape[0])
        if not slot.holds(state):
            slot.adopt(state)
        return slot

    @torch.inference_mode()
    def warm_graphs(self) -> None:
        """Every prompt width's graph on every slot there is, captured now: a server meets the wide ones (long
        drafts) in long turns, under load, where a capture would hold its engine up. So are the decode blocks of
        every size (2, 4, ... block_steps: short budgets, as live openings have, take the small ones) under each
        set of rules a slot has run."""
        with self._lock:
            slots = list(self._graphs.items.values())
            rules = {r for slot in slots for _, r in slot.blocks}
            sizes = [1 << i for i in range(1, self.block_steps.bit_length())]  # 2, 4, ..., block_steps
            for slot in slots:
                slot.release()
                for width in PROMPT_WIDTHS:
                    if width <= self.config.n_text_ctx:
                        slot.prompt_pass(width)[1]()
                for r in rules:
                    for k in sizes:
                        slot.block(k, r).run()

    @torch.inference_mode()
    def reorder(self, state, index):
        """Rows `index` of a state: in place in its slot when it is bound to one and the new row count has
        the same bucket; otherwise new tensors (the next step copies them into their bucket's slot)."""
        slot, m = state.bound, index.numel()
        if not isinstance(slot, _Slot) or not slot.holds(state) or rows_bucket(m) != slot.rows:
            return reorder_state(state, index)
        n, index = state.caches[0][0].shape[0], index.to(self.device)
        with self._lock:
            for t in slot.buffers():
                t[:m].copy_(t[:n].index_select(0, index))
            slot.view(state, m)
        return state


def build(model, device, dtype, kernels: str = "triton", threads=None) -> TritonASRRunner:
    return TritonASRRunner(load_weights(model), device, parse_dtype(dtype, device), model.name, model.format)
