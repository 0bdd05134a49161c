"""`bench lm`'s engines, each built in its own worker process from a spec: ours (the real token loop), llama.cpp
and transformers (onnxruntime-genai is genai_peer.py, torch-compile-static and torch-static static_llama.py); each
times greedy decoding of a fixed number of tokens for a batch of token-id prompts -> (time to first token, decode
tokens/s)."""

from __future__ import annotations

import time

GRAMMAR_TAG = "+json"  # an engine name's suffix: ours with every sequence under SCHEMA's grammar
# a JSON schema of a few fields whose list is long enough that no run closes the object before its last token
# (every run writes the same number of tokens)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string", "enum": ["Paris", "London", "Berlin"]},
        "notes": {"type": "array", "items": {"type": "string"}, "minItems": 1000},
    },
    "required": ["name", "age", "city", "notes"],
    "additionalProperties": False,
}


class Ours:
    name = "speechrt"

    def __init__(self, model, device, dtype, threads, backend="torch", grammar=False):
        import torch

        from speechrt.pipelines.lm import load_lm

        torch.set_num_threads(threads)
        self.lm = load_lm(model, backend, device=device, dtype=dtype)
        info = self.lm.info
        self.note = f"{info.backend}, {info.precision} on {info.device} (torch {torch.__version__})"
        self.meta = {"backend": info.backend, "precision": info.precision, "device": info.device}
        self.caches = {}
        self.grammar = None
        if grammar:
            from speechrt.pipelines.grammar import Grammar

            self.grammar = Grammar.json_schema(SCHEMA)
            self.lm.prepare_grammars()
            self.note += ", every sequence under a JSON schema grammar (llguidance)"

    def run(self, prompts, n):
        from speechrt.pipelines.generation import GenerationOptions
        from speechrt.pipelines.lm_batching import stream

        # n tokens, as the peers make
        o = GenerationOptions(max_tokens=n, stop_token_ids=(), stop_repeats=0, grammar=self.grammar)
        B, size = len(prompts), max(len(p) for p in prompts) + n
        cache = self.caches.get(B)
        if cache is None or cache.max_seq < size:  # kept between runs, as a server keeps its cache
            cache = self.caches[B] = self.lm.runner.new_cache(B, size)
        got, t_first = 0, None
        t0 = time.perf_counter()
        for _ev in stream(self.lm.runner, self.lm.tokenizer, prompts, o, cache=cache):
            got += 1
            if got == B:
                t_first = time.perf_counter()
        t1 = time.perf_counter()
        assert got == B * n, (got, B, n)
        return t_first - t0, B * (n - 1) / (t1 - t_first)


class LlamaCpp:
    name = "llama.cpp"

    def __init__(self, path, threads, max_batch, n_ctx, extra_bufts):
        import llama_cpp as L
        import llama_cpp.llama as LL
        import numpy as np

        self.L, self.np = L, np
        mp0, cp0 = LL.llama_cpp.llama_model_default_params, LL.llama_cpp.llama_context_default_params

        def mp():
            p = mp0()
            p.use_extra_bufts = extra_bufts
            return p

        def cp():
            p = cp0()
            p.n_seq_max = max_batch
            p.kv_unified = True  # the n_ctx cells are shared by all sequences
            return p

        LL.llama_cpp.llama_model_default_params, LL.llama_cpp.llama_context_default_params = mp, cp
        try:
            self.llama = L.Llama(
                str(path),
                n_threads=threads,
                n_threads_batch=threads,
                n_ctx=n_ctx,
                n_batch=512,
                n_ubatch=512,
                verbose=False,
            )
        finally:
            LL.llama_cpp.llama_model_default_params, LL.llama_cpp.llama_context_default_params = mp0, cp0
        self.ctx = self.llama._ctx.ctx
        self.n_vocab = self.llama.n_vocab()
        self.batch = L.llama_batch_init(512, 0, max_batch)
        self.note = f"llama-cpp-python {L.__version__}, GGUF as stored" + ("" if extra_bufts else ", no extra bufts")
        stored = path.stem.rpartition(".")[2]  # SmolLM2-135M-Instruct.Q4_1 -> Q4_1
        self.meta = {"backend": "ggml", "precision": stored if stored != path.stem else "gguf", "device": "cpu"}

    def _decode(self, entries):
        b = self.batch
        b.n_tokens = len(entries)
        for i, (t, p, s, lg) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, p, 1, lg
            b.seq_id[i][0] = s
        rc = self.L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _argmax(self, i):
        ptr = self.L.llama_get_logits_ith(self.ctx, i)
        return int(self.np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def run(self, prompts, n):
        L = self.L
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        B = len(prompts)
        t0 = time.perf_counter()
        entries, outs = [], []
        for s, p in enumerate(prompts):  # all prompts in one batch: B sequences
            for j, t in enumerate(p):
                last = j == len(p) - 1
                if last:
                    outs.append(len(entries))
                entries.append((t, j, s, last))
        self._decode(entries)
        toks = [self._argmax(i) for i in outs]
        t1 = time.perf_counter()
        pos = [len(p) for p in prompts]
        for _ in range(n - 1):
            self._decode([(toks[s], pos[s], s, True) for s in range(B)])
            toks = [self._argmax(s) for s in range(B)]
            pos = [q + 1 for q in pos]
        t2 = time.perf_counter()
        return t1 - t0, B * (n - 1) / (t2 - t1)


class Transformers:
    name = "transformers"

    def __init__(self, path, threads, device="cpu"):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch, self.device = torch, torch.device(device)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
        if self.device.type != "cpu":  # on a GPU in the dtype our GPU default uses (bf16 where supported)
            gpu_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
            model = model.to(self.device, gpu_dtype)
        self.model = model
        self.note = f"transformers {transformers.__version__}, {model.dtype} on {self.device} (dequantized GGUF)"
        self.meta = {
            "backend": "torch",
            "precision": str(model.dtype).removeprefix("torch."),
            "device": str(self.device),
        }

    def _gen(self, ids, mask, n):
        return self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
        )

    def run(self, prompts, n):
        torch = self.torch
        T = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (T - len(p)) + list(p) for p in prompts], device=self.device)  # left padding
        mask = torch.tensor([[0] * (T - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        B = len(prompts)
        with torch.inference_mode():
            t0 = time.perf_counter()
            self._gen(ids, mask, 1).tolist()  # .tolist(): the tokens reach the host, as ours do
            t1 = time.perf_counter()
            self._gen(ids, mask, n).tolist()
            t2 = time.perf_counter()
        ttft = t1 - t0
        return ttft, B * (n - 1) / max(t2 - t1 - ttft, 1e-9)


def start_engine(spec: dict):
    """Build one engine (in its worker process) -> (engine, None) or (None, reason it is skipped)."""
    from speechrt.models import registry

    rm = registry.resolve(spec["model"], "lm")
    name, threads = spec["engine"], spec["threads"]
    try:
        if name.startswith("speechrt"):
            words = name.split()
            backend = words[1] if len(words) > 1 else "torch"
            grammar = words[-1] == GRAMMAR_TAG
            return Ours(spec["model"], spec["device"], spec["dtype"], threads, backend, grammar), None
        if name in ("torch-compile-static", "torch-static"):  # the gpt-fast recipe, from any file we load
            from speechrt.bench.static_llama import StaticPeer

            return StaticPeer(
                spec["model"], spec["device"], spec["dtype"], threads, name == "torch-compile-static"
            ), None
        if rm.format != "gguf":
            return None, "needs a GGUF model"
        if name == "onnxruntime-genai":
            from speechrt.bench.genai_peer import INSTALL, Genai

            try:
                import onnx_ir  # noqa: F401
                import onnxruntime_genai  # noqa: F401
                import onnxscript  # noqa: F401
            except ImportError as ex:
                return None, f"not installed ({ex.name}; {INSTALL})"
            from speechrt.export import cache_dir

            return Genai(rm.path, cache_dir(), threads), None
        if name == "llama.cpp":
            try:
                import llama_cpp  # noqa: F401
            except ImportError:
                return None, "not installed (pip install llama-cpp-python)"
            return LlamaCpp(rm.path, threads, max(spec["batches"]), spec["n_ctx"], spec["extra_bufts"]), None
        try:
            import accelerate  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as ex:
            return None, f"not installed ({ex.name}; pip install transformers accelerate)"
        return Transformers(rm.path, threads, spec["device"]), None
    except Exception as ex:  # a peer that cannot start is reported, not fatal
        if name.startswith("speechrt"):
            raise
        return None, f"failed to start: {type(ex).__name__}: {ex}"
