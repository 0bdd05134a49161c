"""Small random-weight Whisper large-v3 family models (128 mel bins, 51866-token vocabulary with large-v3's
special-token layout, the decoder depths of large-v3-turbo and distil-large-v3 at reduced width), written as
transformers saves them (a Hugging Face folder) and as CTranslate2's converter writes them: the builders of
tests/models/test_whisper_large.py, tests/kernels/test_whisper_large_triton.py and the hub tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import transformers

from speechrt.models.registry import resolve
from speechrt.models.whisper_tokenizer import LANGUAGES

# large-v3's special tokens after the 50257 byte-level BPE tokens (its tokenizer.json and generation_config.json):
# 100 languages (v2's 99 and 'yue' at 50358), so every later special token sits one id above v2's
SPECIALS = (
    ["<|endoftext|>", "<|startoftranscript|>"]
    + [f"<|{lang}|>" for lang in LANGUAGES]
    + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    + [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
)
IDS = {s: 50257 + i for i, s in enumerate(SPECIALS)}
VOCAB = 50257 + len(SPECIALS)  # 51866
# the published ids (openai/whisper-large-v3 generation_config.json), not derived from the list above
SOT, YUE, TRANSLATE, TRANSCRIBE, SOT_PREV, NO_SPEECH, NO_TIMESTAMPS = 50258, 50358, 50359, 50360, 50362, 50363, 50364
# decoder depths at reduced width: large-v3-turbo has 4 decoder layers, distil-large-v3 2 (large-v3: 32)
VARIANTS = {"large-v3-turbo": 4, "distil-large-v3": 2}
SIZES = dict(
    vocab_size=VOCAB,
    num_mel_bins=128,
    d_model=64,
    encoder_layers=4,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=256,
    decoder_ffn_dim=256,
    max_source_positions=1500,
    max_target_positions=448,
    decoder_start_token_id=SOT,
    pad_token_id=50257,
    bos_token_id=50257,
    eos_token_id=50257,
    init_std=0.1,  # wider than the default 0.02: logits that differ
)


def write_tokenizer(path: Path) -> Path:
    """large-v3's tokenizer.json: the multilingual byte-level BPE (from the embedded whisper-base, the same
    vocabulary and merges) with large-v3's special tokens (yue, <|nospeech|>, the timestamps) at their ids."""
    j = json.loads((resolve("whisper-base", "asr").path / "tokenizer.json").read_text())
    flags = {k: v for k, v in j["added_tokens"][0].items() if k not in ("id", "content")}
    j["added_tokens"] = [dict(id=i, content=s, **flags) for s, i in IDS.items()]
    for name, spec in j["post_processor"]["special_tokens"].items():
        spec["ids"] = [IDS[name]]
    path.write_text(json.dumps(j))
    return path


def generation_config(model) -> None:
    """large-v3's generation settings (what `generate(language=...)` and `detect_language` read)."""
    g = model.generation_config
    g.lang_to_id = {f"<|{lang}|>": IDS[f"<|{lang}|>"] for lang in LANGUAGES}
    g.task_to_id = {"translate": TRANSLATE, "transcribe": TRANSCRIBE}
    g.is_multilingual = True
    g.no_timestamps_token_id = NO_TIMESTAMPS
    g.prev_sot_token_id = SOT_PREV
    g.decoder_start_token_id = SOT
    g.begin_suppress_tokens = [220, 50257]
    g.max_length = 448


def model(variant: str, seed: int = 0):
    """A random transformers WhisperForConditionalGeneration of `variant`'s layer structure."""
    torch.manual_seed(seed)
    cfg = transformers.WhisperConfig(decoder_layers=VARIANTS[variant], **SIZES)
    m = transformers.WhisperForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # layer norms and biases away from identity / zero
        for n, p in m.named_parameters():
            if "layer_norm" in n or n.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
        # positions that differ: greedy output that is not one token repeated
        m.model.decoder.embed_positions.weight.normal_(0, 0.5)
    generation_config(m)
    return m


@torch.no_grad()
def prefer_language(m, mel: torch.Tensor, language: str, margin: float = 0.5) -> None:
    """Set the (tied) embedding row of <|language|> to the detected language's, moved so that the model detects
    `language` in `mel` by `margin` logits: auto detection then has a known answer (and the row stays as
    likely among the text tokens as the language it replaces)."""
    enc = m.model.encoder(mel).last_hidden_state
    h = m.model.decoder(input_ids=torch.tensor([[SOT]]), encoder_hidden_states=enc).last_hidden_state[0, -1]
    emb = m.model.decoder.embed_tokens.weight
    ids = list(m.generation_config.lang_to_id.values())
    logits = emb[ids] @ h
    tid = IDS[f"<|{language}|>"]
    emb[tid] = emb[ids[int(logits.argmax())]] + h * margin / float(h @ h)


def save_hf(m, d: Path) -> Path:
    """`m` saved as transformers saves it (config.json, generation_config.json, model.safetensors), with the
    tokenizer."""
    m.save_pretrained(d, safe_serialization=True)
    write_tokenizer(d / "tokenizer.json")
    return d


def save_ct2(hf_dir: Path, d: Path, tokenizer: bool = True) -> Path:
    """The HF folder converted by CTranslate2's converter (model.bin, config.json, vocabulary.json), float32,
    with tokenizer.json copied (as faster-whisper's repositories ship it) or without (the converter's default)."""
    import ctranslate2

    if d.exists():
        shutil.rmtree(d)
    conv = ctranslate2.converters.TransformersConverter(
        str(hf_dir), copy_files=["tokenizer.json"] if tokenizer else None
    )
    conv.convert(str(d), quantization="float32")
    return d


def greedy_hf(m, mel: torch.Tensor, suppress: list[int], n: int, language: str | None) -> list[int]:
    """transformers' greedy ids after the prompt (language given, or detected when None), no timestamps."""
    out = m.generate(
        mel,
        language=language,
        task="transcribe",
        return_timestamps=False,
        max_new_tokens=n,
        suppress_tokens=suppress,
        begin_suppress_tokens=None,
        do_sample=False,
        num_beams=1,
    )
    return [t for t in out[0].tolist() if t != 50257][:n]
