"""`speechrt chat` as a user runs it: a real process, the embedded model, output streamed to stdout."""

from __future__ import annotations

import subprocess
import sys

import pytest


def speechrt(*args, stdin=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "speechrt", *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )


def test_chat_answers_the_capital_of_france():
    p = speechrt("chat", "What is the capital of France?", "--max-tokens", "12")
    assert p.returncode == 0, p.stderr
    assert "Paris" in p.stdout


def test_interactive_chat_keeps_the_conversation():
    q = "What is the capital of France?"
    p = speechrt("chat", "--max-tokens", "16", stdin=f"{q}\n/reset\n{q}\nAnd of Italy?\n/quit\nnot read\n")
    assert p.returncode == 0, p.stderr
    replies = [line for line in p.stdout.splitlines() if line.strip()]
    assert len(replies) == 3
    assert "Paris" in replies[0] and replies[1] == replies[0]  # /reset: the same question, the same greedy reply
    assert "Ital" in replies[2] or "Rom" in replies[2]  # the follow-up is answered in the conversation's context


@pytest.mark.parametrize(
    "args,message",
    [
        (["chat", "hi", "--temperature", "-1"], "temperature must be >= 0"),
        (["chat", "hi", "--model", "no-such-model"], "registered lm models: smollm2-135m-instruct"),
        (["chat", "hi", "--dtype", "int3"], "unsupported dtype 'int3'"),
        (["chat", "hi", "--frequency-penalty", "3"], "frequency_penalty must be a number in [-2, 2]"),
        (["chat", "hi", "--device", "tpu"], "unsupported device 'tpu'"),
        (["bench", "lm", "--batch", "9"], "--batch sizes must be between 1 and 8"),
    ],
)
def test_bad_arguments_give_clear_errors(args, message, capsys):
    """In this process (each is refused before a model loads; a process costs seconds of imports): the
    command's own entry point, exit code 2 and the message on stderr."""
    from speechrt.cli import main

    try:
        rc = main(args)
    except SystemExit as e:  # argparse's own checks
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err


def test_a_bad_argument_in_a_real_process_ends_without_a_traceback():
    p = speechrt("chat", "hi", "--model", "no-such-model")
    assert p.returncode == 2
    assert "registered lm models: smollm2-135m-instruct" in p.stderr and "Traceback" not in p.stderr
