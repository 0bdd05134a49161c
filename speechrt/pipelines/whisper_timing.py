"""Word-level timestamps from the decoder's cross-attention, as openai/whisper (timing.py) and faster-whisper
(`word_timestamps=True`) compute them, written once for every runner that exposes the weights
(ASRRunner.cross_attention).

For one 30-s window and the text tokens decoded in it: one decoder pass over
<|startoftranscript|>... <|notimestamps|> text <|endoftext|> gives the cross-attention logits of the
model's alignment heads; softmax over the window's audio positions, standardized over the tokens,
median-filtered over time (width 7), averaged over the heads -> a [text + 1, frames] matrix whose
cheapest monotonic path (dynamic time warping of its negation) assigns each token the audio position
where it starts. Tokens are grouped into words (a word starts at a token that begins with a space, a
punctuation token, or a special token), leading and trailing punctuation is merged into the neighbouring
word, and a word's probability is the mean of its tokens' probabilities. The long-word clamps at
sentence and segment boundaries are faster-whisper's.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np
import torch

from speechrt.models.audio import HOP_LENGTH, N_FRAMES, SAMPLE_RATE, utterance_mel

PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
TOKENS_PER_SECOND = 50  # encoder positions per second: 16 kHz / 160 samples per frame / stride 2
MEDIAN_FILTER_WIDTH = 7
NO_SPACE_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})  # words split where unicode allows


@dataclass
class Word:
    start: float
    end: float
    word: str
    probability: float

    def to_dict(self) -> dict:
        return {"word": self.word, "start": self.start, "end": self.end, "probability": round(self.probability, 4)}


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median over windows of `width` (odd) along the last axis, the edges reflected (x[-1] -> x[1])."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1), axis=-1).astype(x.dtype)


def dtw(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest path through cost matrix x [N, M] from (0, 0) to (N-1, M-1) by steps (1, 1), (1, 0),
    (0, 1) -> (row indices, column indices) along it. Ties are broken as openai/whisper's dtw_cpu and
    CTranslate2 do (diagonal only when strictly cheapest, then down, else right); the cells of one
    anti-diagonal depend only on the two before it, so each is computed in one vectorized step."""
    N, M = x.shape
    x = np.asarray(x, dtype=np.float32)
    cost = np.full((N + 1, M + 1), np.inf, dtype=np.float32)
    trace = np.full((N + 1, M + 1), -1, dtype=np.int8)
    cost[0, 0] = 0
    for d in range(2, N + M + 1):  # cells i + j = d, 1 <= i <= N, 1 <= j <= M
        i = np.arange(max(1, d - M), min(N, d - 1) + 1)
        j = d - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        t = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        cost[i, j] = x[i - 1, j - 1] + np.choose(t, [c0, c1, c2])
        trace[i, j] = t
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j, path = N, M, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    path.reverse()
    a = np.array(path, dtype=np.int64).reshape(-1, 2)
    return a[:, 0], a[:, 1]


def split_to_word_tokens(tok, tokens: list[int], language: str = "en") -> tuple[list[str], list[list[int]]]:
    """Tokens -> (words, tokens of each word). Pieces end where the text decodes to whole characters; in
    languages written with spaces a piece joins the word before it unless it starts with a space, is
    punctuation or is a special token (<|endoftext|> decodes to '' and stays a word of its own)."""
    full = tok.decode(tokens)
    pieces, piece_tokens, current, offset = [], [], [], 0
    for t in tokens:
        current.append(t)
        decoded = tok.decode(current)
        bad = decoded.find("\ufffd")
        if bad < 0 or full[offset + bad : offset + bad + 1] == "\ufffd":
            pieces.append(decoded)
            piece_tokens.append(current)
            current, offset = [], offset + len(decoded)
    if language in NO_SPACE_LANGUAGES:
        return pieces, piece_tokens
    words: list[str] = []
    word_tokens: list[list[int]] = []
    for piece, ptoks in zip(pieces, piece_tokens):
        if ptoks[0] >= tok.eot or piece.startswith(" ") or piece.strip() in string.punctuation or not words:
            words.append(piece)
            word_tokens.append(list(ptoks))
        else:
            words[-1] += piece
            word_tokens[-1].extend(ptoks)
    return words, word_tokens


def token_alignment(
    runner, tok, encoded, text_tokens: list[int], num_frames: int, sot_sequence: list[int]
) -> tuple[np.ndarray, np.ndarray]:
    """`text_tokens` (non-empty) decoded in the window `encoded` (one row; its first `num_frames` mel frames
    hold audio) -> (the start in seconds of each token and of the end-of-text after them [T + 1],
    each token's probability among the text tokens [T])."""
    tokens = [*sot_sequence, tok.no_timestamps, *text_tokens, tok.eot]
    logits, qk = runner.cross_attention(encoded, torch.tensor([tokens], device=runner.device))
    n = len(sot_sequence)
    probs = torch.softmax(logits[0, n : n + len(text_tokens), : tok.eot].float(), -1)
    token_probs = probs[torch.arange(len(text_tokens)), torch.tensor(text_tokens)].cpu().numpy()
    w = torch.softmax(qk[0, :, :, : max(num_frames // 2, 1)].float(), -1).cpu().numpy()  # [heads, T, frames]
    w = (w - w.mean(-2, keepdims=True)) / w.std(-2, keepdims=True)  # standardized over the tokens
    matrix = median_filter(w, MEDIAN_FILTER_WIDTH).mean(0)[n:-1]  # rows: text tokens and end-of-text
    text_idx, time_idx = dtw(-matrix)
    jumps = np.pad(np.diff(text_idx), (1, 0), constant_values=1).astype(bool)
    return time_idx[jumps] / TOKENS_PER_SECOND, token_probs


def group_words(tok, text_tokens: list[int], starts: np.ndarray, probs: np.ndarray, language: str = "en") -> list[dict]:
    """Tokens with their starts and probabilities (token_alignment) -> words [{word, tokens, start, end,
    probability}], a word ending where the next begins."""
    words, word_tokens = split_to_word_tokens(tok, text_tokens + [tok.eot], language)
    if len(word_tokens) <= 1:
        return []
    bounds = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    return [
        dict(
            word=word, tokens=toks, start=float(starts[i]), end=float(starts[j]), probability=float(np.mean(probs[i:j]))
        )
        for word, toks, i, j in zip(words, word_tokens, bounds[:-1], bounds[1:])
    ]


def merge_punctuations(
    alignment: list[dict], prepended: str = PREPEND_PUNCTUATIONS, appended: str = APPEND_PUNCTUATIONS
) -> None:
    """Opening punctuation joins the word after it, closing punctuation the word before it (in place; the
    emptied entries keep their place with word '' and no tokens)."""
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        prev, nxt = alignment[i], alignment[j]
        if prev["word"].startswith(" ") and prev["word"].strip() in prepended:
            nxt["word"], nxt["tokens"] = prev["word"] + nxt["word"], prev["tokens"] + nxt["tokens"]
            prev["word"], prev["tokens"] = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        prev, nxt = alignment[i], alignment[j]
        if not prev["word"].endswith(" ") and nxt["word"] in appended:
            prev["word"], prev["tokens"] = prev["word"] + nxt["word"], prev["tokens"] + nxt["tokens"]
            nxt["word"], nxt["tokens"] = "", []
        else:
            i = j
        j += 1


def find_alignment(
    runner, tok, encoded, text_tokens: list[int], num_frames: int, sot_sequence: list[int], language: str = "en"
) -> list[dict]:
    """Words of `text_tokens` decoded in the window `encoded` (one row; `num_frames` mel frames of it hold
    audio) -> [{word, tokens, start, end, probability}] with times in seconds from the window's start."""
    if not text_tokens:
        return []
    starts, probs = token_alignment(runner, tok, encoded, text_tokens, num_frames, sot_sequence)
    return group_words(tok, text_tokens, starts, probs, language)


def add_word_timestamps(
    runner,
    tok,
    encoded,
    segments: list[dict],
    time_offset: float,
    num_frames: int,
    sot_sequence: list[int],
    language: str,
    last_speech: float,
) -> float:
    """Words for the segments of one window (dicts with start, end, tokens; each gets `words`, a list of
    Word, and its start/end moved to its first/last word's unless those look too long) -> the end of
    the last speech, for the next window."""
    text = [t for s in segments for t in s["tokens"] if t < tok.eot]
    alignment = find_alignment(runner, tok, encoded, text, num_frames, sot_sequence, language)
    return place_words(tok, segments, alignment, time_offset, last_speech)


def place_words(tok, segments: list[dict], alignment: list[dict], time_offset: float, last_speech: float) -> float:
    """add_word_timestamps with the window's words found (find_alignment)."""
    seg_tokens = [[t for t in s["tokens"] if t < tok.eot] for s in segments]
    durations = np.array([w["end"] - w["start"] for w in alignment])
    durations = durations[durations.nonzero()]
    median = min(0.7, float(np.median(durations))) if len(durations) else 0.0
    longest = median * 2
    if len(durations):  # words at sentence ends are at most twice the median long
        for i in range(1, len(alignment)):
            if alignment[i]["end"] - alignment[i]["start"] > longest:
                if alignment[i]["word"] in ".。!！?？":
                    alignment[i]["end"] = alignment[i]["start"] + longest
                elif alignment[i - 1]["word"] in ".。!！?？":
                    alignment[i]["start"] = alignment[i]["end"] - longest
    merge_punctuations(alignment)
    k = 0
    for seg, toks in zip(segments, seg_tokens):
        saved, words = 0, []
        while k < len(alignment) and saved < len(toks):
            a = alignment[k]
            if a["word"]:
                words.append(
                    Word(
                        round(time_offset + a["start"], 2),
                        round(time_offset + a["end"], 2),
                        a["word"],
                        a["probability"],
                    )
                )
            saved += len(a["tokens"])
            k += 1
        if words:
            _clamp_segment_words(seg, words, median, longest, last_speech)
            last_speech = seg["end"]
        seg["words"] = words
    return last_speech


def _clamp_segment_words(seg: dict, words: list[Word], median: float, longest: float, last_speech: float) -> None:
    first, last = words[0], words[-1]
    # the first (and second) word after a pause are at most twice the median long
    if first.end - last_speech > median * 4 and (
        first.end - first.start > longest or (len(words) > 1 and words[1].end - first.start > longest * 2)
    ):
        if len(words) > 1 and words[1].end - words[1].start > longest:
            boundary = max(words[1].end / 2, words[1].end - longest)
            first.end = words[1].start = boundary
        first.start = max(0, first.end - longest)
    # the segment's own start/end timestamps win over a first/last word that looks too long
    if seg["start"] < first.end and seg["start"] - 0.5 > first.start:
        first.start = max(0, min(first.end - median, seg["start"]))
    else:
        seg["start"] = first.start
    if seg["end"] > last.start and seg["end"] + 0.5 < last.end:
        last.end = max(last.start + median, seg["end"])
    else:
        seg["end"] = last.end


def token_bytes(tok, token: int) -> bytes:
    """The bytes a token stands for (byte-level BPE: one token may hold part of a UTF-8 character)."""
    return bytes(_BYTE_DECODER[c] for c in tok.tok.id_to_token(token) or "")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (printable bytes as themselves, the others shifted past 255), reversed."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_DECODER = _byte_decoder()


def last_end(segments: list[dict]) -> float | None:
    """The end of the last word of the window's segments, else of its last segment (faster-whisper's get_end)."""
    for s in reversed(segments):
        if s.get("words"):
            return s["words"][-1].end
    return segments[-1]["end"] if segments else None


PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"


def word_anomaly(w: Word) -> float:
    """How unlike a spoken word `w` is: improbable, very short or very long (faster-whisper)."""
    d, score = w.end - w.start, 0.0
    if w.probability < 0.15:
        score += 1.0
    if d < 0.133:
        score += (0.133 - d) * 15
    if d > 2.0:
        score += d - 2.0
    return score


def is_anomaly(seg: dict | None) -> bool:
    """A segment whose first (up to 8) words are mostly anomalous: a likely hallucination."""
    if seg is None or not seg["words"]:
        return False
    words = [w for w in seg["words"] if w.word not in PUNCTUATION][:8]
    score = sum(word_anomaly(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def skip_hallucinations(
    found: list[dict], threshold: float, window_seek: int, window_frames: int, content_frames: int, last_speech: float
) -> tuple[int | None, bool]:
    """hallucination_silence_threshold (faster-whisper's, with word timestamps): in one window's segments
    (`found`, with words; window starting at mel frame `window_seek`, `window_frames` long; `last_speech`:
    the end of the last word before it), a likely hallucination after more than `threshold` seconds of
    silence is skipped -> (the mel frame the next window starts at, or None to keep the seek; True when the
    whole window's text is dropped). Segments from a hallucination surrounded by silence on are removed
    from `found`."""
    fps = SAMPLE_RATE / HOP_LENGTH
    offset, duration = window_seek / fps, window_frames / fps
    window_end, content_end = offset + N_FRAMES / fps, content_frames / fps
    with_words = [s for s in found if s["words"]]
    if with_words and is_anomaly(with_words[0]) and with_words[0]["start"] - offset > threshold:
        return window_seek + round((with_words[0]["start"] - offset) * fps), True  # skip the leading silence
    last_end = last_speech
    for i, seg in enumerate(found):
        if not seg["words"]:
            continue
        if is_anomaly(seg):
            nxt = next((s for s in found[i + 1 :] if s["words"]), None)
            next_start = nxt["words"][0].start if nxt is not None else offset + duration
            before = seg["start"] - last_end > threshold or seg["start"] < threshold or seg["start"] - offset < 2.0
            after = next_start - seg["end"] > threshold or is_anomaly(nxt) or window_end - seg["end"] < 2.0
            if before and after:
                seek = round(max(offset + 1, seg["start"]) * fps)
                if content_end - seg["end"] < threshold:
                    seek = content_frames
                del found[i:]
                return seek, False
        last_end = seg["end"]
    return None, False


def utterance_words(
    runner, tok, encoded, text: list[int], samples: int, language: str, task: str
) -> tuple[list[Word], list[tuple[int, bytes, float]]]:
    """The text tokens `text` of one utterance of `samples` samples (at most 30 s, `encoded` its encoder output)
    -> (its words with start/end in seconds from its start, [(token, its bytes, log probability among the text
    tokens)]): one decoder pass over the tokens (ASRPipeline.align; call under inference mode)."""
    starts, probs = token_alignment(runner, tok, encoded, text, samples // HOP_LENGTH, tok.sot_sequence(language, task))
    segment = {"start": 0.0, "end": round(samples / SAMPLE_RATE, 2), "tokens": text}
    place_words(tok, [segment], group_words(tok, text, starts, probs, language), 0.0, 0.0)
    logprobs = [(t, token_bytes(tok, t), float(np.log(max(p, 1e-30)))) for t, p in zip(text, probs.tolist())]
    return segment["words"], logprobs


def alignment_steps(runner, decoder, tok, audio: np.ndarray, text: list[int], language, task: str, frames=None):
    """ASRPipeline.align_steps' work: the encoder pass over `audio` (its first `frames` mel frames where given and
    the runner trims, else a whole window), yielding None, then the decoder pass over the text tokens `text` ->
    (words, token logprobs) as utterance_words."""
    with torch.inference_mode(), runner.loop():
        mel = utterance_mel(audio, runner.config.n_mels, runner.device)[None]
        encoded = runner.encode(mel[:, :, :frames] if frames is not None and runner.trims else mel)
        language = language or decoder.detect_languages(encoded)[0]
    yield None
    with torch.inference_mode(), runner.loop():
        return utterance_words(runner, tok, encoded, text, len(audio), language, task)
