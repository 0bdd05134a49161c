"""The Hugging Face model types the language-model loader reads (models/hf_llama.py), named apart from it so that
the registry can recognize a model folder without importing the loader."""

HF_ARCHS = {
    "llama": "Llama 1-3.x, SmolLM2",
    "mistral": "Mistral",
    "qwen2": "Qwen2 / Qwen2.5",
    "qwen3": "Qwen3 (dense)",
    "phi3": "Phi-3 / Phi-3.5 without long-context rope scaling",
    "gemma3_text": "Gemma 3 (text: 270M, 1B; sliding-window and global layers)",
}


def supported() -> str:
    return ", ".join(f"{k} ({v})" for k, v in HF_ARCHS.items())
