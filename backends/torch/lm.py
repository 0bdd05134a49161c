"""Language-model runner of the `torch` backend: models/llama.py run eagerly, built with a kernel set."""

from __future__ import annotations

import logging
import time

import torch

from speechrt.errors import UserError
from speechrt.models.llama import contiguous

from ..base import LMRunner, RunnerInfo, check_cache_size, check_prefill
from ..threads import ThreadPolicy, cpu_has_native_bf16

log = logging.getLogger(__name__)

# what `dtype` may be: a weight format of models.llama (WEIGHT_FORMATS) or an alias of one
DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "int8": "int8",
    "int4": "int4",
    "q4": "int4",
    "fp8": "fp8",
    "auto": None,
}


def default_format(device: torch.device, has_q4: bool) -> str:
    """CPU: the decode step is memory bound and ATen has fused weight-only GEMMs, so keep a file's 4-bit
    blocks as they are (int4) and otherwise use int8 weight-only. GPU: bf16 where supported, else fp16."""
    if device.type == "cpu":
        return "int4" if has_q4 else "int8"
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


def resolve_format(dtype: str | None, device: torch.device, has_q4: bool = False) -> str:
    if dtype is None or dtype == "auto":
        return default_format(device, has_q4)
    if dtype not in DTYPES:
        raise UserError(
            f"unsupported dtype {dtype!r} for language models; valid: "
            f"{', '.join(k for k in DTYPES)} (int8 / int4 / fp8 = weight-only; int4 on AVX2 CPUs in "
            "kernels/cpu_decode, elsewhere with bf16 activations; fp8: E4M3, for GPUs)"
        )
    return DTYPES[dtype]


def load_file(model):
    """ResolvedModel -> models.lm_file.LMFile (config, float32 weights, tokenizer, chat template)."""
    from speechrt.models.lm_loaders import load_lm

    return load_lm(model)


class TorchLMRunner(LMRunner):
    """Prefill / decode step over a slot-addressed, preallocated KV cache (models.llama.KVCache). Both run
    on `threads.step` CPU threads: a step of a small model is many small ops (see ThreadPolicy)."""

    def __init__(
        self,
        lm_file,
        device: torch.device,
        weight_format: str,
        kernels: str = "torch",
        threads: ThreadPolicy | None = None,
        model_name: str = "",
        model_format: str = "",
    ):
        import speechrt.kernels as K
        from speechrt.models.llama import Llama

        self.device = device
        self.config = lm_file.config
        self.tokenizer = lm_file.tokenizer
        self.chat_template = lm_file.chat_template
        self.weight_format = weight_format
        self.threads = threads or ThreadPolicy.build(device, None)
        self.info = RunnerInfo(kernels, model_name, model_format, weight_format, str(device), self.threads.describe())
        self.ops = K.select(kernels, device)
        # prompts on the CPU through dense copies of the quantized weights in the CPU's native matmul dtype
        # (see models.llama.Linear): bf16 with AMX / AVX512-BF16, twice as fast as the weight-only kernels;
        # float32 elsewhere, as fast as they are there and exact, where the int4 kernel's (emulated) bf16
        # activations round a whole prompt enough to change near-tie first tokens
        dense = None
        if device.type == "cpu" and weight_format in ("int4", "int8"):
            dense = torch.bfloat16 if cpu_has_native_bf16() else torch.float32
        self.model = Llama(
            lm_file.config, lm_file.weights, self.ops, device, weight_format, lm_file.q4, dense_prefill=dense
        ).eval()

    def loop(self):
        return self.threads.small()

    def new_cache(self, max_batch: int, max_seq: int):
        check_cache_size(max_batch, max_seq)
        return self.model.new_cache(max_batch, max_seq)

    @torch.inference_mode()
    def prefill(self, cache, slot: int, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        check_prefill(cache, slot, int(tokens.shape[0]), start)
        with self.threads.small():
            return self.model.prefill(cache, slot, tokens.to(self.device), start)

    @torch.inference_mode()
    def prefill_many(self, cache, jobs):
        """Prompts for contiguous slots, all from position 0, run as one right-padded batch (Llama.prefill_range)
        when padding would not double the work; anything else, or a batch that fails, one by one (so that
        only a bad prompt's caller gets its error)."""
        slots, lens = [j[0] for j in jobs], [int(j[1].shape[0]) for j in jobs]
        if (
            len(jobs) < 2
            or any(j[2] != 0 for j in jobs)
            or not contiguous(slots)
            or len(jobs) * max(lens) > 2 * sum(lens)
        ):
            return super().prefill_many(cache, jobs)
        try:
            with self.threads.small():
                return list(self.model.prefill_range(cache, slots[0], [j[1] for j in jobs]))
        except Exception:  # noqa: BLE001 - retried one by one below, where each error reaches its own prompt
            return super().prefill_many(cache, jobs)

    @torch.inference_mode()
    def decode_step(self, cache, slots, tokens: torch.Tensor) -> torch.Tensor:
        if isinstance(slots, torch.Tensor):
            slots = slots.tolist()
        with self.threads.small():
            return self.model.decode_step(cache, list(slots), tokens.to(self.device))


def build(
    model,
    device: torch.device,
    dtype: str | None,
    kernels: str = "torch",
    threads: ThreadPolicy | None = None,
    runner_class: type[TorchLMRunner] = TorchLMRunner,
) -> TorchLMRunner:
    resolve_format(dtype, device)  # a bad dtype fails before the (slow) load
    t0 = time.perf_counter()
    f = load_file(model)
    fmt = resolve_format(dtype, device, bool(f.q4))
    if runner_class is TorchLMRunner and fmt == "int4" and device.type == "cpu" and kernels == "torch":
        from .cpu_lm import CpuInt4LMRunner, unavailable

        why = unavailable(f.config)
        if why is None:
            runner_class = CpuInt4LMRunner
        else:
            log.info("int4 on ATen's weight-only kernels (bf16 activations): the AVX2 kernel %s", why)
    runner = runner_class(f, device, fmt, kernels, threads, model.name, model.format)
    log.info("loaded %s (tensors %s) in %.1fs", runner.info, f.tensor_types, time.perf_counter() - t0)
    return runner
