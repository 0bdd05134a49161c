"""The triton ASR runner's graph slots (backends/triton/asr.py) on the embedded Whisper, through the batch
transcription a loaded server runs (`transcribe_batch`: batches of several utterances of random lengths, final
and live options, live openings capped at 4 tokens, drafts checked and re-fed), against the plain torch runner:
the same tokens. On the CPU the slot path runs uncaptured on the reference kernels (what differs from the plain
runner is only the slots: padded rows, caches and encoder keys/values, states moved in and out); `speechrt
bench gpu --checks asr-batches` runs the same comparison captured on a GPU with the Triton kernels."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from speechrt.backends.torch.asr import TorchASRRunner
from speechrt.backends.triton.asr import TritonASRRunner
from speechrt.bench.gpu_graphs import random_cuts
from speechrt.cli_asr import sample_path
from speechrt.models.audio import load_audio
from speechrt.models.registry import resolve
from speechrt.models.whisper_loaders import load_weights
from speechrt.pipelines.asr import ASRPipeline
from speechrt.streaming.asr_options import asr_options
from speechrt.streaming.realtime.config import SessionConfig

pytestmark = pytest.mark.usefixtures("one_cpu_thread")


@pytest.fixture(scope="module")
def pipelines():
    model = resolve(None, "asr")
    w = load_weights(model)
    cpu = torch.device("cpu")
    plain = ASRPipeline(TorchASRRunner(w, cpu, torch.float32))
    slots = ASRPipeline(TritonASRRunner(w, cpu, torch.float32, capture=False, kernels="torch"))
    assert slots.runner.graphs_enabled and not slots.runner.capture and not slots.runner.block_steps
    blocks = ASRPipeline(TritonASRRunner(w, cpu, torch.float32, capture=False, kernels="torch", block_steps=8))
    return plain, slots, blocks


def test_server_batches_on_the_slots_give_the_plain_runners_tokens(pipelines):
    """... and so do blocks of 8 greedy steps per call, the logit rules and argmax on the device
    (backends/whisper_loop.py), the draft's known tokens fed in the blocks."""
    plain, slots, blocks = pipelines
    audio = load_audio(sample_path().with_name("passage.flac"))  # 58 s of read speech
    rng = random.Random()  # fresh cuts every run
    cfg = SessionConfig(type="transcription")
    final, live = asr_options(cfg), asr_options(cfg, live=True)
    opening = dataclasses.replace(live, sample_len=4)

    def cuts(k):
        return random_cuts(audio, k, rng, 6)

    batches = [
        (cuts(rng.randint(3, 6)), final, None),
        (cuts(rng.randint(1, 2)), opening, None),
        (cuts(rng.randint(5, 8)), final, None),
    ]
    grown = cuts(3)  # live rounds of growing turns: each drafted with the transcript of its first 70 %
    drafts = [r.tokens for r in plain.transcribe_batch([a[: len(a) * 7 // 10] for a in grown], live)]
    batches.append((grown, live, drafts))
    for audios, opts, dr in batches:
        want = plain.transcribe_batch(audios, opts, dr)
        for pipe in (slots, blocks):
            got = pipe.transcribe_batch(audios, opts, dr)
            assert [r.tokens for r in got] == [r.tokens for r in want]
            assert [r.avg_logprob for r in got] == pytest.approx([r.avg_logprob for r in want], rel=1e-4, abs=1e-4)
        assert all(r.text.strip() for r in want if len(r.tokens) > 2)  # real speech, real transcripts
    assert set(slots.runner.slot_rows) <= {1, 2, 4, 8}
    assert {4, 8} <= {k for ks in blocks.runner.block_sizes.values() for k in ks} <= {2, 4, 8}


def test_blocks_give_the_host_loops_timestamps(pipelines):
    """Long-form transcription with timestamps (the timestamp rules in the blocks: pairs, monotonic, forced)
    through blocks of 8 steps: the plain runner's tokens, segments and times."""
    plain, _, blocks = pipelines
    audio = load_audio(sample_path().with_name("passage.flac"))[: 16000 * 14]
    want, got = plain.transcribe(audio), blocks.transcribe(audio)
    assert [s.tokens for s in got.segments] == [s.tokens for s in want.segments]
    assert [(s.start, s.end) for s in got.segments] == [(s.start, s.end) for s in want.segments]
    assert len(want.segments) >= 2 and want.text.strip()


def test_warm_batches_reach_every_buckets_step_and_prompt_widths():
    """A server's warm-up on a GPU (ASRPipeline.warm_batches, run by the engine before it reports ready) gives
    every batch-size bucket up to --max-batch its slot, so no bucket compiles or captures while serving; the
    clips are real speech, so each batch decodes past its prompt."""
    cpu = torch.device("cpu")
    fresh = ASRPipeline(
        TritonASRRunner(load_weights(resolve(None, "asr")), cpu, torch.float32, capture=False, kernels="torch")
    )
    assert fresh.runner.slot_rows == []
    fresh.warm_batches(6)
    assert {2, 4, 8} <= set(fresh.runner.slot_rows) <= {1, 2, 4, 8}
    # and every prompt width of every slot (long drafts come with long turns, under load)
    assert all(w == [8, 16, 32, 64, 128] for w in fresh.runner.prompt_widths.values()), fresh.runner.prompt_widths
    fresh.warm_batches(1)  # nothing past batch 1 to warm
    assert set(fresh.runner.slot_rows) <= {1, 2, 4, 8}
