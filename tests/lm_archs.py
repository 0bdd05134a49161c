"""Small random-weight language models of each architecture speechrt runs beyond the Llama graph, written by
transformers (a Hugging Face folder) and as llama.cpp's convert_hf_to_gguf.py writes them (GGUF): the builders
of tests/models/test_architectures.py and tests/backends/test_lm_architectures.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers

from speechrt.models.chat_templates import GEMMA3  # google/gemma-3-*'s own template

VOCAB = 512  # the embedding's rows; the tokenizer has fewer, as real models' do
SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)
SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<s>",
    "</s>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<|end|>",
    "<bos>",
    "<eos>",
    "<start_of_turn>",
    "<end_of_turn>",
]

# Qwen2.5-Instruct's tokenizer_config.json chat_template, unchanged (its tools in the system prompt, calls in
# <tool_call> tags); the others written after the models' own (Qwen3 with its thinking tags, Llama 3.1 with its date
# header, Mistral's [INST] with alternation checks, Phi-3's role tags)
QWEN25 = (Path(__file__).parent / "data" / "qwen2.5-instruct.chat_template.jinja").read_text()
QWEN3 = """{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "assistant" and '</think>' in content %}
        {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
    {%- endif %}
    {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}
{%- endif %}
"""
LLAMA31 = """{{- bos_token }}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""
MISTRAL = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- endif %}
{%- endfor %}
"""
PHI3 = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'user' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"
)

# Gemma 3 at reduced width: 6 layers, the first five over a window of 4 positions (the tests' sequences of 10-16
# tokens cross it), the sixth global with another rotary base; query_pre_attn_scalar apart from head_dim; a final
# logit soft cap (None in Gemma 3's configs, supported all the same; transformers' Gemma 3 has no attention one)
GEMMA3_CONF = dict(
    num_hidden_layers=6,  # five over the window, the sixth global: Gemma 3's pattern (llama.cpp's files assume it)
    head_dim=16,
    sliding_window=4,
    query_pre_attn_scalar=24,
    final_logit_softcapping=8.0,
)

LLAMA3_ROPE = dict(
    rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64
)
# name -> (transformers class prefix, config extras, GGUF arch, bos, eos, chat template)
ARCHS = {
    "qwen2": ("Qwen2", dict(tie_word_embeddings=True, rope_theta=1e6), "qwen2", None, "<|im_end|>", QWEN25),
    "qwen3": ("Qwen3", dict(head_dim=32), "qwen3", None, "<|im_end|>", QWEN3),
    "llama3": (
        "Llama",
        dict(rope_scaling=LLAMA3_ROPE, rope_theta=5e5),
        "llama",
        "<|begin_of_text|>",
        "<|eot_id|>",
        LLAMA31,
    ),
    "mistral": ("Mistral", dict(sliding_window=96), "llama", "<s>", "</s>", MISTRAL),
    "phi3": ("Phi3", dict(pad_token_id=0, sliding_window=80), "phi3", "<s>", "<|end|>", PHI3),
    "gemma3": ("Gemma3", GEMMA3_CONF, "gemma3", "<bos>", "<end_of_turn>", GEMMA3),
}
# transformers' (config, model) classes where they are not {prefix}Config, {prefix}ForCausalLM
CLASSES = {"gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name three colors."},
    {"role": "assistant", "content": "Red, green and blue."},
    {"role": "user", "content": "And one more?"},
]


def byte_bpe():
    """A small byte-level BPE (trained on a few sentences) with the control tokens of the chat templates."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = [m["content"] for m in CONVERSATION] + ["You are Qwen, created by Alibaba Cloud. The quick brown fox."] * 3
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(text, trainer)
    return tok


def sentencepiece_bpe():
    """A small SentencePiece-style BPE as Llama 2 / Mistral 7B / Phi-3 folders carry it in tokenizer.json: '▁' for
    spaces (prepended to the text), <0xNN> byte-fallback tokens for what the vocabulary lacks, and the decoder
    that undoes both and drops the first space."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    vocab = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"]
    vocab += [chr(c) for c in range(33, 127)]
    merges = []
    for word in ("\u2581Name", "\u2581three", "\u2581colors", "\u2581And", "\u2581one", "\u2581more", "\u2581Be", "er"):
        for j in range(2, len(word) + 1):
            a, b = word[: j - 1], word[j - 1]
            if word[:j] not in vocab:
                merges.append((a, b))
                vocab.append(word[:j])
    tok = Tokenizer(
        models.BPE({t: i for i, t in enumerate(vocab)}, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIALS])
    return tok


def gemma_bpe():
    """Gemma's kind of SentencePiece BPE (tokenizer.json of its folders): '▁' for spaces, none prepended, runs of
    spaces as tokens, byte fallback; each merge's token appended to the vocabulary in merge order (Gemma's GGUF
    files list no merges: the loaders recover them by the tokens' order)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"]
    vocab += [chr(c) for c in range(33, 127)] + ["é", "日"]
    merges = []
    for word in ("\u2581\u2581", "\u2581Name", "\u2581three", "\u2581colors", "\u2581And", "\u2581one", "\u2581more"):
        for j in range(2, len(word) + 1):
            if word[:j] not in vocab:
                merges.append((word[: j - 1], word[j - 1]))
                vocab.append(word[:j])
    tok = Tokenizer(
        models.BPE({t: i for i, t in enumerate(vocab)}, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIALS])
    return tok


def tokenizer_of(name: str, byte_bpe):
    """The tokenizer a folder of architecture `name` carries: SentencePiece for Mistral and Phi-3 (as theirs), Gemma's
    own kind for Gemma 3."""
    if name == "gemma3":
        return gemma_bpe()
    return sentencepiece_bpe() if name in ("mistral", "phi3") else byte_bpe


def randomize(model, seed: int):
    """Every parameter random (transformers initializes biases to 0 and norms to 1, which would hide them)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise if "norm" in name else 0.15 * noise)
    return model.eval()


def hf_model(name: str):
    prefix, extra = ARCHS[name][:2]
    conf_cls, model_cls = CLASSES.get(name, (f"{prefix}Config", f"{prefix}ForCausalLM"))
    conf = getattr(transformers, conf_cls)(**{**SIZES, **extra})
    torch.manual_seed(0)
    return randomize(getattr(transformers, model_cls)(conf), seed=len(name))


def save_hf(d, name, model, byte_bpe):
    from transformers import PreTrainedTokenizerFast

    *_, bos, eos, template = ARCHS[name]
    model.save_pretrained(d, safe_serialization=True)
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_of(name, byte_bpe), bos_token=bos, eos_token=eos, chat_template=template
    ).save_pretrained(d)
    return d


def written(name: str, tmp_path_factory, byte_bpe):
    """(transformers model of architecture `name`, the Hugging Face folder it was saved to in a new temporary
    directory)."""
    model = hf_model(name)
    return model, save_hf(tmp_path_factory.mktemp(name), name, model, byte_bpe)


def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py LlamaModel.permute (Q/K rows for llama.cpp's interleaved rotary)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(conf) -> list[float]:
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors: Llama 3's scaling as per-frequency divisors."""
    rp = conf.rope_parameters
    dim = conf.head_dim
    freqs = 1.0 / (rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, lo, hi, old = (
        rp["factor"],
        rp["low_freq_factor"],
        rp["high_freq_factor"],
        rp["original_max_position_embeddings"],
    )
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


_GGUF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",  # Phi-3: gate and up in one tensor (llama.cpp's SwiGLU halves)
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GGUF_GEMMA = {
    **_GGUF_LAYER,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def add_tokenizer(w, name: str, byte_bpe) -> dict:
    """The tokenizer metadata llama.cpp's converter writes: a byte-level BPE ('gpt2': tokens, merges), or for Gemma 3
    its SentencePiece vocabulary ('llama': tokens, scores, types, no merges; runs of spaces stored as spaces)
    -> the vocabulary (token -> id)."""
    if name != "gemma3":
        vocab = byte_bpe.get_vocab(with_added_tokens=True)
        tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
        merges = json.loads(byte_bpe.to_str())["model"]["merges"]
        w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
        return vocab
    tok = gemma_bpe()
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([t.replace("\u2581", " ") if not t.replace("\u2581", "") else t for t in tokens])
    w.add_token_scores([-1000.0 if t in SPECIALS else 0.0 for t in tokens])
    w.add_token_types(
        [3 if t in SPECIALS or t in ("<pad>", "<unk>") else 6 if t.startswith("<0x") else 1 for t in tokens]
    )
    w.add_add_space_prefix(False)
    return vocab


def write_gguf(path, name: str, model, byte_bpe, f16: bool = False):
    """`model` as convert_hf_to_gguf.py writes its architecture (float tensors)."""
    *_, arch, bos, eos, template = ARCHS[name]
    conf = model.config
    gemma = name == "gemma3"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(conf.num_hidden_layers)
    w.add_context_length(conf.max_position_embeddings)
    w.add_embedding_length(conf.hidden_size)
    w.add_feed_forward_length(conf.intermediate_size)
    w.add_head_count(conf.num_attention_heads)
    w.add_head_count_kv(conf.num_key_value_heads)
    w.add_layer_norm_rms_eps(conf.rms_norm_eps)
    rp = conf.rope_parameters
    w.add_rope_freq_base((rp["full_attention"] if gemma else rp)["rope_theta"])
    head_dim = getattr(conf, "head_dim", None) or conf.hidden_size // conf.num_attention_heads
    w.add_rope_dimension_count(head_dim)
    if name in ("qwen3", "gemma3"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch in ("phi3", "gemma3"):
        w.add_sliding_window(conf.sliding_window)
    if gemma and conf.final_logit_softcapping:
        w.add_final_logit_softcapping(conf.final_logit_softcapping)
    w.add_vocab_size(VOCAB)
    vocab = add_tokenizer(w, name, byte_bpe)
    if bos:
        w.add_bos_token_id(vocab[bos])
    w.add_eos_token_id(vocab[eos])
    w.add_add_bos_token(False)
    w.add_chat_template(template)

    def add(n, t):
        if gemma and n.endswith("norm.weight"):  # Gemma3Model.modify_tensors: (1 + w) stored as such
            t = t + 1
        if gemma and n.endswith("attn_q_norm.weight"):  # llama.cpp scales scores by 1 / sqrt(head_dim), not by
            t = t * (head_dim / conf.query_pre_attn_scalar) ** 0.5  # query_pre_attn_scalar: the same model here
        x = t.detach().float().numpy()
        w.add_tensor(n, x.astype(np.float16) if f16 and x.ndim == 2 else x)

    state = model.state_dict()
    add("token_embd.weight", state["model.embed_tokens.weight"])
    add("output_norm.weight", state["model.norm.weight"])
    if not conf.tie_word_embeddings:
        add("output.weight", state["lm_head.weight"])
    if name == "llama3":
        w.add_tensor("rope_freqs.weight", np.array(llama3_rope_factors(conf), dtype=np.float32))
    for i in range(conf.num_hidden_layers):
        for k, v in state.items():
            pre = f"model.layers.{i}."
            if not k.startswith(pre):
                continue
            rest = k[len(pre) :]
            if arch == "llama" and rest.startswith(("self_attn.q_proj", "self_attn.k_proj")):
                v = permute(v, conf.num_attention_heads if "q_proj" in rest else conf.num_key_value_heads)
            add(f"blk.{i}.{(_GGUF_GEMMA if gemma else _GGUF_LAYER)[rest]}", v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def check_logits(runner, model, seed: int, prompt_len: int = 12, steps: int = 4):
    """A random prompt's logits (every position) and `steps` cached decode steps after it equal transformers'
    logits of the whole sequence."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (prompt_len + steps,), generator=g).tolist()
    ref = hf_logits(model, ids)
    with torch.inference_mode():
        cache = runner.new_cache(1, 64)
        got = [runner.model.prefill(cache, 0, torch.tensor(ids[:prompt_len]), all_logits=True)]
        for t in ids[prompt_len:-1]:
            got.append(runner.decode_step(cache, [0], torch.tensor([t])))
    got = torch.cat(got)
    torch.testing.assert_close(got, ref[: len(got)], rtol=1e-4, atol=2e-5)
    assert ref.std() > 0.5  # logits far from uniform: the comparison means something


def greedy_hf(model, ids: list[int], n: int) -> list[int]:
    out = []
    for _ in range(n):
        out.append(int(hf_logits(model, ids + out)[-1].argmax()))
    return out
