"""The OpenAI REST endpoints on the server's port, driven by the official `openai` SDK over loopback with the
embedded models: transcription in every response format and streamed, translation refused by an English-only
model, streamed speech that is real speech, chat completions whole and streamed, the model list, and uploads
the server refuses while it goes on serving."""

from __future__ import annotations

import io
import json
import time
import urllib.request

import numpy as np
import pytest
import soundfile as sf

from speechrt.cli_asr import sample_path
from speechrt.models.wer import wer

openai = pytest.importorskip("openai")

SAMPLE = sample_path()
SAMPLE_TEXT = SAMPLE.with_suffix(".txt").read_text()
SPOKEN = "The quick brown fox jumps over the lazy dog. A second sentence follows the first one here."
MAX_UPLOAD = 400_000  # the sample (237 kB) fits, a 1 MB file does not


@pytest.fixture(scope="module")
def server(asr, server_factory):
    import speechrt
    from speechrt.streaming.config import ServerOptions

    lm, tts = speechrt.load_lm(backend="torch"), speechrt.load_tts(backend="torch")
    with server_factory(ServerOptions(port=0, max_upload_bytes=MAX_UPLOAD), asr, lm, tts) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def verbose(client):
    with open(SAMPLE, "rb") as f:
        return client.audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json")


def transcribe(client, fmt, data=None, **kw):
    file = ("sample.wav", data if data is not None else SAMPLE.read_bytes())
    return client.audio.transcriptions.create(model="whisper-1", file=file, response_format=fmt, **kw)


def test_transcription_json_and_verbose_json(client, verbose):
    assert wer(SAMPLE_TEXT, transcribe(client, "json").text) <= 0.15
    assert wer(SAMPLE_TEXT, verbose.text) <= 0.15
    assert verbose.language == "en" and abs(verbose.duration - 7.41) < 0.05
    segs = verbose.segments
    assert segs and segs[0].start == 0.0 and all(s.start < s.end for s in segs)
    assert " ".join(s.text.strip() for s in segs) == verbose.text.strip()


def test_transcription_text_srt_vtt_share_the_segments(client, verbose):
    text = transcribe(client, "text")
    assert isinstance(text, str) and text.strip() == verbose.text.strip()
    srt = transcribe(client, "srt")
    blocks = srt.strip().split("\n\n")
    assert len(blocks) == len(verbose.segments)
    assert blocks[0].splitlines()[0] == "1" and blocks[0].splitlines()[1].startswith("00:00:00,000 --> 00:00:0")
    vtt = transcribe(client, "vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> ") and vtt.count(" --> ") == len(verbose.segments)


def test_transcription_stream_sends_deltas_then_done(client, verbose):
    with open(SAMPLE, "rb") as f:
        events = list(client.audio.transcriptions.create(model="whisper-1", file=f, stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    done = [e for e in events if e.type == "transcript.text.done"]
    assert deltas and len(done) == 1 and events[-1] is done[0]
    assert "".join(deltas).strip() == done[0].text.strip() == verbose.text.strip()


def test_transcription_logprobs(client):
    """include[]=logprobs (json): each text token of the transcript with its log probability and bytes, as
    OpenAI's; the tokens spell the text."""
    r = transcribe(client, "json", include=["logprobs"])
    lps = r.logprobs
    assert lps and "".join(lp.token for lp in lps).strip() == r.text.strip()
    assert all(lp.logprob <= 0 and np.isfinite(lp.logprob) for lp in lps)
    assert all(bytes(int(b) for b in lp.bytes).decode("utf-8", "replace") == lp.token for lp in lps)
    assert wer(SAMPLE_TEXT, r.text) <= 0.15


def test_transcription_logprobs_of_a_long_recording(client):
    """A recording over 30 s: its segments' tokens aligned 30 s at a time, each against the audio that holds them
    (measured: mean log probability -0.15 so; -0.74 with each span's audio 3 s late, -1.5 with it 10 s late)."""
    from speechrt.models.audio import load_audio
    from speechrt.pipelines.tts import encode_audio

    passage = SAMPLE.with_name("passage.flac")
    upload, _ = encode_audio(load_audio(passage), 16000, "opus")  # (the FLAC is over this server's upload limit)
    assert len(upload) < MAX_UPLOAD
    r = transcribe(client, "json", data=upload, include=["logprobs"])
    lps = r.logprobs
    assert "".join(lp.token for lp in lps).strip() == r.text.strip()
    assert wer(passage.with_name("passage.txt").read_text(), r.text) <= 0.1
    values = np.array([lp.logprob for lp in lps])
    assert np.isfinite(values).all() and (values <= 0).all()
    assert np.mean(values) > -0.4, np.mean(values)


def test_word_timestamps(client):
    v = transcribe(client, "verbose_json", timestamp_granularities=["word", "segment"])
    words = v.words
    assert words and "".join(w.word for w in words).strip() == v.text.strip()
    assert all(0 <= w.start <= w.end <= v.duration + 0.5 for w in words)
    assert all(a.start <= b.start for a, b in zip(words, words[1:]))
    assert all(seg["words"] for seg in v.model_dump()["segments"])  # each segment's own, with probabilities


def test_translation_on_an_english_only_model_is_refused(client):
    with pytest.raises(openai.BadRequestError, match="English-only model: it cannot translate"):
        client.audio.translations.create(model="whisper-1", file=("a.wav", SAMPLE.read_bytes()))


def test_bad_uploads_get_json_errors_and_the_server_goes_on(client, server, verbose):
    with pytest.raises(openai.BadRequestError, match="not a readable audio file.*readable formats: WAV") as e:
        transcribe(client, "json", data=b"hello, not audio" * 10)
    message = e.value.body["message"]  # the upload named by its file name, not as <_io.BytesIO object at 0x...>
    assert message.startswith("the file 'sample.wav': not a readable audio file (") and "object at" not in message
    with pytest.raises(openai.BadRequestError, match="is empty"):
        transcribe(client, "json", data=b"")
    with pytest.raises(openai.APIStatusError, match=f"at most {MAX_UPLOAD} bytes") as e:
        transcribe(client, "json", data=b"\0" * (MAX_UPLOAD + 100_000))
    assert e.value.status_code == 413 and e.value.body["code"] == "file_too_large"
    with pytest.raises(openai.NotFoundError, match="transcription models: whisper-tiny.en, speechrt, whisper-1"):
        client.audio.transcriptions.create(model="whisper-huge", file=("a.wav", SAMPLE.read_bytes()))
    with pytest.raises(openai.BadRequestError, match="response_format 'tsv'.*valid: text, json"):
        transcribe(client, "tsv")
    with pytest.raises(openai.BadRequestError, match="include.*logprobs comes with response_format json"):
        transcribe(client, "text", include=["logprobs"])
    with pytest.raises(openai.BadRequestError, match="timestamp_granularities need response_format verbose_json"):
        transcribe(client, "json", timestamp_granularities=["word"])
    with pytest.raises(openai.BadRequestError, match="include.*unknown values; valid: logprobs"):
        transcribe(client, "json", include=["nonsense"])
    with pytest.raises(openai.BadRequestError, match="response_format must be json or text with it, got 'srt'"):
        transcribe(client, "srt", stream=True)
    with pytest.raises(openai.BadRequestError, match=r"voice 'robot' is not available; valid: .*alloy"):
        client.audio.speech.create(model="tts-1", voice="robot", input="Hello.")
    with pytest.raises(openai.BadRequestError, match="instructions .* are not supported"):
        client.audio.speech.create(model="tts-1", voice="alloy", input="Hello.", instructions="Speak cheerfully.")
    assert [m.id for m in client.models.list()][0] == server.asr.name  # still serving (later tests transcribe)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics").read().decode()
    assert 'speechrt_rest_requests_total{endpoint="/v1/audio/transcriptions"}' in metrics
    errors = [line for line in metrics.splitlines() if line.startswith("speechrt_rest_errors_total")]
    assert errors and int(errors[0].split()[1]) >= 8


def test_speech_streams_a_wav_of_real_speech(client):
    t0 = time.perf_counter()
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=SPOKEN, response_format="wav"
    ) as r:
        assert r.headers["content-type"] == "audio/wav"
        rate = int(r.headers["x-sample-rate"])
        chunks, first_at = [], None
        for chunk in r.iter_bytes():
            if first_at is None:
                first_at = time.perf_counter()
            chunks.append(chunk)
        ended = time.perf_counter()
    data = b"".join(chunks)
    # streamed: the first bytes came while the rest was still being synthesized
    assert len(chunks) > 1 and len(chunks[0]) < len(data) // 2 and t0 < first_at < ended
    assert data[:4] == b"RIFF" and data[40:44] == b"\xdb\xff\xff\xff"  # sizes: unknown length, as OpenAI's
    audio, sr = sf.read(io.BytesIO(data), dtype="float32")
    assert sr == rate == 22050 and len(audio) > 3 * sr
    back = transcribe(client, "text", data=data)
    assert wer(SPOKEN, back) <= 0.2, back


def test_speech_in_every_openai_format(client):
    """OpenAI's six response formats through the SDK, mp3 when none is named (OpenAI's default), each with its
    Content-Type and rate (pcm: raw int16 at 24 kHz as OpenAI's; Opus 24 kHz; the others the voice's 22.05 kHz),
    streamed in several chunks (FLAC whole at the end: its header holds its length), decoded (PyAV) to the length of
    the speech, and heard as the sentence when uploaded to the server's own transcription endpoint in that format."""
    import av

    default = client.audio.speech.with_raw_response.create(model="tts-1", voice="echo", input="Hello there.")
    assert default.headers["content-type"] == "audio/mpeg" and sf.info(io.BytesIO(default.content)).format == "MP3"
    for fmt, media, rate, container in (
        ("mp3", "audio/mpeg", 22050, "mp3"),
        ("opus", "audio/ogg; codecs=opus", 24000, "ogg"),
        ("aac", "audio/aac", 22050, "aac"),
        ("flac", "audio/flac", 22050, "flac"),
        ("wav", "audio/wav", 22050, "wav"),
        ("pcm", "audio/pcm;rate=24000;encoding=signed-int;bits=16", 24000, None),
    ):
        with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="echo", input=SPOKEN, response_format=fmt
        ) as r:
            assert r.headers["content-type"] == media and int(r.headers["x-sample-rate"]) == rate, fmt
            chunks = [c for c in r.iter_bytes() if c]
        data = b"".join(chunks)
        assert len(chunks) > 1 or fmt == "flac", fmt  # streamed as synthesized
        if fmt == "flac":  # whole, with its length (libsndfile reads it)
            assert sf.info(io.BytesIO(data)).frames / 22050 > 3.5
        decoded_rate = 48000 if fmt == "opus" else rate  # (Opus decodes at 48 kHz; its header keeps the 24 kHz)
        if container is None:
            audio, data = np.frombuffer(data, "<i2") / 32767.0, wav_bytes(np.frombuffer(data, "<i2") / 32767.0, rate)
        else:
            with av.open(io.BytesIO(data)) as f:
                assert f.format.name.split(",")[0] == container and f.streams.audio[0].rate == decoded_rate, fmt
                audio = np.concatenate([fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)])
        assert 3.5 < len(audio) / decoded_rate < 9, (fmt, len(audio) / decoded_rate)
        back = transcribe(client, "text", data=data)  # the upload in that format (pcm: as a WAV)
        assert wer(SPOKEN, back) <= 0.2, (fmt, back)
    with pytest.raises(openai.BadRequestError, match="response_format 'ogg'.*valid: mp3, opus, aac, flac, wav, pcm"):
        client.audio.speech.create(model="tts-1", voice="alloy", input="Hi.", response_format="ogg")
    with pytest.raises(openai.BadRequestError, match="voice 'nobody'.*valid: "):
        client.audio.speech.create(model="tts-1", voice="nobody", input="Hi.")


def test_speech_as_server_sent_events(client, server):
    """stream_format=sse (OpenAI's): speech.audio.delta events of base64 audio as it is synthesized (pcm: the
    int16 samples at 24 kHz; wav: its streamed header first; mp3: the file's frames as they are encoded), then
    speech.audio.done with the usage (characters in, samples out)."""
    import base64

    def events(fmt):
        with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="alloy", input=SPOKEN, response_format=fmt, stream_format="sse"
        ) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]

    for fmt in ("pcm", "wav", "mp3"):
        evs = events(fmt)
        deltas = [base64.b64decode(e["audio"]) for e in evs[:-1]]
        assert [e["type"] for e in evs] == ["speech.audio.delta"] * len(deltas) + ["speech.audio.done"], fmt
        usage = evs[-1]["usage"]
        assert usage["input_tokens"] == len(SPOKEN) and usage["total_tokens"] == len(SPOKEN) + usage["output_tokens"]
        data = b"".join(deltas)
        if fmt == "pcm":
            assert len(deltas) > 2 and usage["output_tokens"] == len(data) // 2 > 3 * 24000  # streamed, all of it
            data = wav_bytes(np.frombuffer(data, "<i2") / 32767.0, 24000)
        elif fmt == "wav":
            assert deltas[0][:4] == b"RIFF" and len(deltas[0]) == 44 and len(deltas) > 3
        else:
            assert len(deltas) > 2 and sf.info(io.BytesIO(data)).format == "MP3"
            assert usage["output_tokens"] > 3 * 22050  # the voice's samples
        back = transcribe(client, "text", data=data)
        assert wer(SPOKEN, back) <= 0.2, (fmt, back)
    with pytest.raises(openai.BadRequestError, match="stream_format must be 'audio'.*or 'sse'"):
        client.audio.speech.create(model="tts-1", voice="alloy", input="Hi.", extra_body={"stream_format": "ws"})


def wav_bytes(audio: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, np.asarray(audio, np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def test_chat_completions_whole_and_streamed(client, server):
    question = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(model=server.lm.name, messages=question, temperature=0, max_tokens=24)
    answer = whole.choices[0].message.content
    assert "Paris" in answer and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.prompt_tokens > 5 and 0 < whole.usage.completion_tokens <= 24
    chunks = list(
        client.chat.completions.create(
            model=server.lm.name, messages=question, temperature=0, max_completion_tokens=24, stream=True
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == answer
    with pytest.raises(openai.NotFoundError, match=f"chat models: {server.lm.name}"):
        client.chat.completions.create(model="gpt-4o", messages=question)
    # messages over the context's room for a prompt: 400 with the numbers, as OpenAI's endpoint answers;
    # nothing is cut or left out
    long = [{"role": "system", "content": "Answer briefly and politely. " * 600}, *question]
    room = server.engine.prompt_room(24)
    with pytest.raises(openai.BadRequestError, match=f"over the {room} that") as bad:
        client.chat.completions.create(model=server.lm.name, messages=long, max_tokens=24)
    assert bad.value.code == "context_length_exceeded" and "lower max_tokens" in bad.value.message


def test_chat_parameters_this_server_cannot_honour_are_refused_by_name(client, server):
    """functions (the deprecated form of tools), audio output: a 400 naming the parameter, not an answer that
    ignores it; their neutral values are accepted (tools and JSON mode are served: test_tool_calls.py). logprobs,
    logit_bias and the frequency / presence penalties are honoured (the penalties by OpenAI's formula on the tokens
    sampled so far): their out-of-range values are a 400 naming the parameter, and
    a banned token stays out of the answer."""
    question = [{"role": "user", "content": "What is the capital of France?"}]
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
    for kw, text in (
        ({"functions": [tool["function"]]}, "functions \\(deprecated\\) is not supported"),
        ({"top_logprobs": 2}, "top_logprobs needs logprobs=true"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs must be an integer in"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"frequency_penalty": 2.5}, "frequency_penalty must be in"),
        ({"logit_bias": {"12": 300}}, "logit_bias must map token ids"),
        ({"logit_bias": {"99999999": 1}}, "outside the vocabulary"),
    ):
        with pytest.raises(openai.BadRequestError, match=text):
            client.chat.completions.create(model=server.lm.name, messages=question, max_tokens=4, **kw)
    paris = server.lm.tokenizer.encode(" Paris", add_bos=False)[0]
    banned = client.chat.completions.create(
        model=server.lm.name,
        messages=question,
        max_tokens=16,
        temperature=0,
        logit_bias={str(paris): -100},
        presence_penalty=0.5,
        frequency_penalty=0.3,
        logprobs=True,
    )
    assert banned.choices[0].message.content and " Paris" not in [e.token for e in banned.choices[0].logprobs.content]
    ok = client.chat.completions.create(
        model=server.lm.name,
        messages=question,
        max_tokens=4,
        temperature=0,
        response_format={"type": "text"},
        logprobs=False,
        frequency_penalty=0,
        presence_penalty=0,
        tools=[],
        modalities=["text"],
    )
    assert ok.choices[0].message.content


def test_chat_logprobs_whole_and_streamed(client, server):
    """logprobs=true, top_logprobs=2: one entry per token of the answer (OpenAI's shape), the tokens' bytes are
    the answer, each token the likeliest at greedy, and the streamed chunks carry the same entries."""
    question = [{"role": "user", "content": "What is the capital of France?"}]
    kw = dict(model=server.lm.name, messages=question, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    assert content and b"".join(bytes(e.bytes) for e in content).decode() == whole.choices[0].message.content
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob) and e.logprob >= e.top_logprobs[1].logprob
    streamed = [
        e
        for c in client.chat.completions.create(stream=True, **kw)
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in content]
    plain = client.chat.completions.create(model=server.lm.name, messages=question, max_tokens=4)
    assert plain.choices[0].logprobs is None


def test_chat_n_choices(client, server):
    """n choices, each its own sequence in the batch: with a seed, reproducible (choice i samples with seed + i)
    and not all alike; greedy, all alike; streamed, the chunks' indices rebuild the same choices; n over 8 or
    not a whole number is a 400."""
    question = [{"role": "user", "content": "Write a name for a pet cat."}]
    kw = dict(model=server.lm.name, messages=question, max_tokens=10, temperature=1.0, seed=7, n=3)
    a = client.chat.completions.create(**kw)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2] and all(texts) and len(set(texts)) > 1
    assert [c.message.content for c in client.chat.completions.create(**kw).choices] == texts
    assert a.usage.completion_tokens >= 3
    streamed = ["", "", ""]
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
    assert streamed == texts
    greedy = client.chat.completions.create(model=server.lm.name, messages=question, max_tokens=8, temperature=0, n=2)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content
    for n in (9, 0, 1.5):
        with pytest.raises(openai.BadRequestError, match="n must be an integer from 1 to 8"):
            client.chat.completions.create(model=server.lm.name, messages=question, max_tokens=4, n=n)


def test_models_list(client, server):
    """One naming policy (streaming/model_names.py): every name an endpoint accepts is listed and retrievable (a
    dated OpenAI snapshot too), with the loaded model it stands for; 'speechrt' and OpenAI's names work on REST as on
    Realtime (chat answers for 'speechrt' and gpt-realtime); another name is a 404 listing the valid ones."""
    ids = [m.id for m in client.models.list()]
    asr, lm, tts = server.asr.name, server.lm.name, server.tts.name
    assert ids[:4] == [asr, lm, tts, "speechrt"]
    for name, root in (
        ("whisper-1", asr),
        ("gpt-4o-transcribe", asr),
        ("tts-1", tts),
        ("gpt-4o-mini-tts", tts),
        ("gpt-realtime", lm),
        ("gpt-4o-realtime-preview", lm),
        (lm, lm),
    ):
        assert name in ids and client.models.retrieve(name).root == root, name
    assert client.models.retrieve("gpt-4o-realtime-preview-2024-12-17").id == "gpt-4o-realtime-preview-2024-12-17"
    assert client.models.retrieve("speechrt").family == "all"
    question = [{"role": "user", "content": "Say hi."}]
    for name in ("speechrt", "gpt-realtime"):
        assert client.chat.completions.create(model=name, messages=question, max_tokens=2).choices[0].message.content
    with pytest.raises(openai.NotFoundError, match="models: whisper-tiny.en, .*whisper-1"):
        client.models.retrieve("gpt-9")
    # a Hugging Face Hub id (a model loaded by one is named by it) is a model name too, slash and all
    with pytest.raises(openai.NotFoundError, match="model 'openai/whisper-large-v3' is not served here"):
        client.models.retrieve("openai/whisper-large-v3")
    with pytest.raises(openai.NotFoundError, match=f"chat models: {lm}, speechrt, gpt-realtime"):
        client.chat.completions.create(model="whisper-1", messages=question, max_tokens=2)


def test_key_and_admission_limit(asr, server_factory):
    """The Bearer key guards REST as it guards sessions; past --max-rest-requests one more gets 429."""
    import threading

    from speechrt.streaming.config import ServerOptions

    with server_factory(ServerOptions(port=0, api_key="k", max_rest_requests=1, debug=True), asr) as srv:
        url = f"http://127.0.0.1:{srv.port}"
        with pytest.raises(openai.AuthenticationError, match="invalid or missing API key"):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0, timeout=120)
        stall = urllib.request.Request(
            f"{url}/debug/fault",
            json.dumps({"stage": "tts", "stall_s": 3}).encode(),
            {"Content-Type": "application/json", "Authorization": "Bearer k"},
        )
        urllib.request.urlopen(stall).read()  # the next engine stream step (the transcription's) hangs 3 s
        first = {}
        t = threading.Thread(target=lambda: first.update(text=transcribe(client, "text")))
        t.start()
        deadline = time.monotonic() + 30
        while 'endpoint="/v1/audio/transcriptions"} 1' not in urllib.request.urlopen(f"{url}/metrics").read().decode():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(openai.RateLimitError, match="1 REST requests at most at once"):
            client.models.list()
        t.join(60)
        assert wer(SAMPLE_TEXT, first["text"]) <= 0.15
        assert client.models.list().data[0].id == asr.name


def test_unknown_path_lists_the_rest_endpoints(server):
    import urllib.error

    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/v1/audio/nonesuch")
    assert e.value.code == 404
    message = json.loads(e.value.read())["error"]["message"]
    assert "POST /v1/audio/transcriptions" in message and "POST /v1/chat/completions" in message


def test_bench_startups_first_requests_on_a_ready_server(server):
    """`bench startup`'s first-request latency (speechrt.bench.startup.first_requests): the first spoken byte and
    the first streamed chat token each timed from the server's real answers; none with transcription only."""
    from speechrt.bench.startup import first_requests

    got = first_requests(server.port, transcription_only=False)
    assert set(got) == {"first_speech_byte_s", "first_chat_token_s"}
    assert all(v is not None and v > 0 for v in got.values()), got
    assert first_requests(server.port, transcription_only=True) == dict.fromkeys(got)
