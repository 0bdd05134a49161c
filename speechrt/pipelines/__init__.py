"""One pipeline per model family — the layer between the runners (speechrt.backends) and their users (the
public API, the CLI, the benchmarks, the server's engine):

- asr.py (ASRPipeline): an ASR runner + log-mel and tokenizer + the Whisper decoding loops
  (whisper_decoding.py: windows and batched utterances with drafts; whisper_search.py: greedy, sampled and
  beam search in a window; whisper_long_form.py: any length, window to window; whisper_loops.py: loop cuts);
- lm.py (LMPipeline): an LM runner + tokenizer and chat template + the continuous batcher
  (lm_batching.py: the one token loop; generation.py: options, sampling, incremental text; the loop test
  shared with Whisper and the device's decode blocks is speechrt.backends.token_repeats);
- tts.py (TTSPipeline): a TTS runner + the text front end + windowed streaming of each sentence's latent.

Each is built from a model name or path, a backend and a device by its `load_*` function.
"""
