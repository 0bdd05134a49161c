"""Text front end: English normalization, incremental sentence splitting, phonemization identical to Piper's
(the peer, same espeak-ng, same voice config), and clear errors for text that cannot be spoken."""

from __future__ import annotations

import pytest

from speechrt.errors import UserError
from speechrt.models.piper_loader import VoiceConfig
from speechrt.models.registry import resolve
from speechrt.models.tts_normalize import cardinal, normalize_english, ordinal, year
from speechrt.models.tts_sentences import SentenceStream, stream_segments
from speechrt.models.tts_text import TextFrontEnd, TextOptions, check_text


@pytest.fixture(scope="module")
def front():
    path = resolve("piper-en_US-joe-medium", "tts").path
    return TextFrontEnd(VoiceConfig.from_file(path.with_suffix(".onnx.json")))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("It costs $12.50 today.", "It costs twelve dollars and fifty cents today."),
        ("Only $1 and €3 or £2.05.", "Only one dollar and three euros or two pounds and five pence."),
        ("A $3.5M deal.", "A three point five million dollars deal."),
        ("Born on 03/15/1999 at 3:30 pm.", "Born on March fifteenth, nineteen ninety-nine at three thirty p m."),
        (
            "Due 2024-01-02, not March 3rd, 2021.",
            "Due January second, twenty twenty-four, not March third, twenty twenty-one.",
        ),
        ("On 15 Jan 2020 we met.", "On the fifteenth of January, twenty twenty we met."),
        (
            "Dr. Smith lives on Elm St. He is 21st in line.",
            "doctor Smith lives on Elm Street. He is twenty-first in line.",
        ),
        ("Apples, pears, etc. Then more, e.g. plums.", "Apples, pears, et cetera. Then more, for example plums."),
        (
            "We ran 10 km at 12 mph, 45% of the way.",
            "We ran ten kilometers at twelve miles per hour, forty-five percent of the way.",
        ),
        (
            "Pi is 3.14 and a crowd of 1,234,567 came.",
            "Pi is three point one four and a crowd of one million two hundred thirty-four thousand five hundred "
            "sixty-seven came.",
        ),
        ("Call No. 5 at 10:05.", "Call number five at ten oh five."),
        ("Plain words stay exactly as they are.", "Plain words stay exactly as they are."),
    ],
)
def test_normalize_english(text, expected):
    assert normalize_english(text) == expected


def test_number_words():
    assert [cardinal(n) for n in (0, 13, 40, 99, 105, 1000, 2_000_017)] == [
        "zero",
        "thirteen",
        "forty",
        "ninety-nine",
        "one hundred five",
        "one thousand",
        "two million seventeen",
    ]
    assert [ordinal(n) for n in (1, 2, 3, 12, 20, 101)] == [
        "first",
        "second",
        "third",
        "twelfth",
        "twentieth",
        "one hundred first",
    ]
    assert [year(y) for y in (1905, 2000, 2008, 2010, 1900)] == [
        "nineteen oh five",
        "two thousand",
        "two thousand eight",
        "twenty ten",
        "nineteen hundred",
    ]


PIPER_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello there, how are you? I am fine; thanks: really! Good.",
    "Mixed-case WORDS and contractions don't break it, do they?",
    "Numbers like 42 are read by espeak itself when normalization is off.",
    "A [[ hˈɛloʊ ]] raw phoneme block, as Piper allows.",
]


@pytest.mark.parametrize("text", PIPER_TEXTS)
def test_phoneme_ids_match_piper(front, text):
    piper = pytest.importorskip("piper", reason="piper-tts is the peer")
    pv = (
        piper.PiperVoice.load(str(resolve("piper-en_US-joe-medium", "tts").path))
        if not hasattr(test_phoneme_ids_match_piper, "pv")
        else test_phoneme_ids_match_piper.pv
    )
    test_phoneme_ids_match_piper.pv = pv
    theirs = [pv.phonemes_to_ids(p) for p in pv.phonemize(text) if p]
    ours = list(front.sentences(text, TextOptions(normalize=False)))
    assert ours == theirs


def test_sentences_split_like_piper(front):
    ids = list(front.sentences("First sentence. Second one? Third!"))
    assert len(ids) == 3
    assert all(s[0] == 1 and s[-1] == 2 for s in ids)  # ^ ... $


@pytest.mark.parametrize("bad", ["", "   ", "...!?", "\n\t"])
def test_empty_text_is_an_error(front, bad):
    with pytest.raises(UserError, match="nothing to say"):
        list(front.sentences(bad))


def test_unsupported_characters(front):
    with pytest.raises(UserError, match=r"unsupported characters.*'你'.*Latin-script"):
        list(front.sentences("Hello 你好 world"))
    with pytest.raises(UserError, match=r"U\+1F600"):
        list(front.sentences("Great job 😀"))
    with pytest.raises(UserError, match="U\\+0007"):
        list(front.sentences("bell \x07 here"))
    # accented Latin letters are fine; drop mode removes what cannot be read
    assert list(front.sentences("Café naïve résumé."))
    assert check_text("Great job 😀", "en-us", "drop") == "Great job "


def test_sentence_stream_cuts_as_soon_as_complete():
    s = SentenceStream(min_clause_words=4)
    assert s.push("Hello there") == []
    assert s.push(". Dr. Smith paid 3") == ["Hello there."]  # "Dr." is not an end
    assert s.push(".5 dollars") == []  # "3." was not a sentence end: a digit followed
    assert s.push(" for it! And") == ["Dr. Smith paid 3.5 dollars for it!"]
    assert s.push(" then, after a long while, ") == ["And then, after a long while,"]  # clause with >= 4 words
    assert s.push("short, ") == []  # clause too short to stand alone
    assert s.push("it ended") == []
    assert s.flush() == ["short, it ended"]


def test_stream_segments_line_breaks_and_long_runs():
    words = " ".join(["word"] * 50)
    segs = list(stream_segments(["First line without a period\nSecond ", words], max_words=40))
    assert segs[0] == "First line without a period"
    assert len(segs[1].split()) == 40 and len(segs[2].split()) == 11
    with pytest.raises(UserError):
        SentenceStream(min_clause_words=0)
