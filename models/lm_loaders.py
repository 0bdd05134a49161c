"""A resolved language model, whatever its format, loaded as an LMFile: the loader per format."""

from __future__ import annotations

from . import gguf_loader, hf_llama
from .lm_file import LMFile
from .registry import ModelError


def load_lm(model) -> LMFile:
    """A resolved language model (models.registry.ResolvedModel: GGUF file or Hugging Face directory) -> LMFile."""
    if model.format == "gguf":
        return gguf_loader.load(model.path)
    if model.format == "hf-llama":
        return hf_llama.load(model.path)
    raise ModelError(f"{model.path}: format {model.format!r} is not a language-model format; valid: gguf, hf-llama")
