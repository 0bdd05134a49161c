"""The user docs checked against the code, so that they cannot drift:

- every `--option` that README.md and docs/*.md name exists on the command they name it with (or, named alone, on
  some `speechrt` command), and where the text gives its default as "`--option` (default X" that is the parser's;
- every code block of README.md is run or checked: the two set-up commands are the install steps CI runs (.ci/run
  extracts the test command; the serve command is the same install and `speechrt serve`), and each example, marked
  `<!-- docs-test: NAME -->` before its block, runs as pasted (against a real `speechrt serve`, on a free port
  instead of 8765) with its output checked here."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from speechrt.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = {
    p.relative_to(ROOT).as_posix(): p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
}
# generated from result files (speechrt bench report): they quote the commands that made each run
GENERATED = {"docs/benchmarks.md"}
MARK = re.compile(r"<!-- docs-test: ([\w-]+)[^>]*-->\s*```(\w+)\n(.*?)```", re.S)
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def parsers() -> dict[str, argparse.ArgumentParser]:
    """'serve', 'bench server', 'kernels report', ... -> its parser."""
    out = {}

    def walk(p, name):
        out[name] = p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub, sp in a.choices.items():
                    walk(sp, f"{name} {sub}".strip())

    walk(build_parser(), "")
    return out


PARSERS = parsers()


def options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in p._actions for s in a.option_strings}


# what an option in the docs belongs to: the last command named before it in its paragraph
TOOL = re.compile(
    r"speechrt ((?:bench |kernels |export )?[a-z]+)|\b(pip3?|pytest|python3? -m (?!speechrt)[\w.]+|polygraphy|ruff)\b"
)


def option_mentions(text: str):
    """(option, the speechrt command it is named with or None, the default the text gives or None) for each
    `--option` of speechrt in the text: the command is the last one named before it in its paragraph; options of
    other tools (pip, pytest, `python -m benchmarks...`, polygraphy, ruff) are left out."""
    for para in re.split(r"\n\s*\n", text):
        for m in re.finditer(r"(?<![\w-])--[a-z][a-z0-9-]*", para):
            tools = list(TOOL.finditer(para[: m.start()]))
            if tools and tools[-1].group(2):
                continue
            default = re.match(r"`?\s*\(default:? `?([^`,;:)\s]+)", para[m.end() :])
            yield m.group(0), (tools[-1].group(1) if tools else None), (default.group(1) if default else None)


def said(action: argparse.Action, default: str) -> bool:
    """The default the docs give is the parser's; or, where the parser's is None (a default that depends on the
    machine or on other options), the option's help says it."""
    if action.default is None:
        return default in (action.help or "")
    return default in (str(action.default), str(action.default).removesuffix(".0"))


def table_defaults(text: str):
    """(option, the default cell) for each row that names one option in a table whose second column is
    its default: `| option | default | ... |` then `| `--option` | default | what it does |`."""
    for table in re.finditer(r"^\| *(?:option|flag) *\| *default *\|.*\n(?:\|.*\n?)+", text, re.M):
        for m in re.finditer(r"^\| `(--[a-z][a-z0-9-]*)` \| ([^|]+)\|", table.group(0), re.M):
            yield m.group(1), m.group(2).strip()


def table_said(action: argparse.Action, cell: str) -> bool:
    """A table's default cell: the parser's default (its first word, or the cell as the help words it), "off"
    for a flag, "none" for no default."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return cell == "off"
    if cell.startswith("none"):
        return action.default in (None, [])
    word, help = cell.strip("`").split()[0].strip("`,"), action.help or ""
    if action.default is None:  # the help words a default that depends on the machine or on other options
        return cell.replace("`", "") in help or re.search(rf"default\b[^()]*(?<![\w-]){re.escape(word)}\b", help)
    return said(action, word) or cell in help


def test_every_option_the_docs_name_exists_with_the_default_they_give():
    known = {name: options(p) for name, p in PARSERS.items()}
    bad = []
    for doc, text in DOCS.items():
        if doc in GENERATED:
            continue
        for opt, default in table_defaults(text):
            where = [n for n, o in known.items() if opt in o]
            if where and not any(table_said(known[n][opt], default) for n in where):
                bad.append(
                    f"{doc}: {opt} default {default!r} in its table, the parser's: {known[where[0]][opt].default}"
                )
        for opt, cmd, default in option_mentions(text):
            where = [cmd] if cmd in known and opt in known[cmd] else [n for n, o in known.items() if opt in o]
            if not where:
                bad.append(f"{doc}: {opt}" + (f" (named with `speechrt {cmd}`)" if cmd else "") + ": no such option")
                continue
            if default is not None and not any(said(known[n][opt], default) for n in where):
                have = sorted({str(known[n][opt].default) for n in where})
                bad.append(f"{doc}: {opt} default {default!r}, the parser's: {have}")
    assert not bad, "\n".join(bad)


def test_help_texts_state_their_defaults():
    """Every option with a default other than None/False says it in its help (with %(default)s or in words)."""
    bad = []
    for key, p in PARSERS.items():
        for a in p._actions:
            if not a.option_strings or a.help in (None, argparse.SUPPRESS) or isinstance(a, argparse._HelpAction):
                continue
            if a.default in (None, False, argparse.SUPPRESS, []) or isinstance(a, argparse._StoreFalseAction):
                continue
            if "default" not in a.help:
                bad.append(f"speechrt {key} {a.option_strings[-1]}")
    assert not bad, f"help without its default: {bad}"


def test_the_option_check_finds_a_wrong_default_and_a_missing_option():
    text = "`speechrt serve --max-sessions` (default 5) and `--no-such-flag`."
    found = list(option_mentions(text))
    assert ("--max-sessions", "serve", "5") in found and ("--no-such-flag", "serve", None) in found
    assert str(options(PARSERS["serve"])["--max-sessions"].default) != "5"
    assert all("--no-such-flag" not in options(p) for p in PARSERS.values())
    table = "| option | default | what |\n| --- | --- | --- |\n"
    table += "| `--max-sessions` | 5 | sessions |\n| `--transcription-only` | on | asr |"
    serve = options(PARSERS["serve"])
    rows = list(table_defaults(table))
    assert rows == [("--max-sessions", "5"), ("--transcription-only", "on")]
    assert not table_said(serve["--max-sessions"], "5") and table_said(serve["--max-sessions"], "32")
    assert not table_said(serve["--transcription-only"], "on") and table_said(serve["--transcription-only"], "off")
    assert not table_said(serve["--threads"], "4") and table_said(serve["--threads"], "all cores")  # worded in help


def test_links_between_the_docs_lead_to_files_that_exist():
    bad = []
    for doc, text in DOCS.items():
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not re.match(r"[a-z]+://", target) and not (ROOT / doc).parent.joinpath(target).exists():
                bad.append(f"{doc}: {target}")
    assert not bad, "\n".join(bad)


def test_every_readme_code_block_is_checked():
    blocks = [code for _, code in BLOCK.findall(README)]
    marked = [code for _, _, code in MARK.findall(README)]
    setup = [c for c in blocks if c.startswith("python3 -m venv")]
    assert len(setup) == 2, "the two set-up commands"
    unchecked = [c for c in blocks if c not in marked and c not in setup]
    assert not unchecked, f"README code blocks without a docs-test marker: {unchecked}"
    assert set(EXPECT) == {name for name, _, _ in MARK.findall(README)}, "each marked example has its checks here"


def test_the_setup_commands_are_what_ci_runs():
    ci = subprocess.run(
        ["awk", r"/<!-- ci: test command -->/{f=1;next} f&&/^```/{if(s)exit; s=1; next} f&&s{print}", "README.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert "python -m pytest" in ci and "pip install -e '.[dev]'" in ci
    install = ci[: ci.index(" && python -m pytest")]
    serve = [c.strip() for _, c in BLOCK.findall(README) if c.strip().endswith("speechrt serve")]
    assert serve == [install.replace("pip install -e '.[dev]'", "pip install -e .") + " && speechrt serve"]


def examples() -> dict[str, tuple[str, str]]:
    return {name: (lang, code) for name, lang, code in MARK.findall(README)}


def run_python(code: str, cwd: Path, port: int | None = None) -> str:
    if port is not None:
        code = code.replace("127.0.0.1:8765", f"127.0.0.1:{port}")
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def wav_seconds(path: Path) -> float:
    import soundfile as sf

    info = sf.info(str(path))
    return info.frames / info.samplerate


def sf_format(path: Path) -> str:
    import soundfile as sf

    return sf.info(str(path)).format


def says(text: str, words: str = "welcome to the speech runtime") -> bool:
    """`words` in `text`, whatever the case and the spaces (speech synthesized and transcribed back may split a
    word: "run time")."""
    return words.replace(" ", "") in re.sub(r"\s+", "", text.lower())


def check_realtime(out: str, tmp: Path):
    heard = re.search(r"^you said: (.+)$", out, re.M)
    answer = re.search(r"^answer: (.+)$", out, re.M)
    assert heard and says(heard.group(1)), out
    assert answer and len(answer.group(1).split()) >= 2, out


def check_rest(out: str, tmp: Path):
    lines = out.splitlines()
    assert says(lines[0]), out
    assert "paris" in out.lower(), out
    assert wav_seconds(tmp / "hello.mp3") > 0.3 and sf_format(tmp / "hello.mp3") == "MP3"  # OpenAI's default format


def check_python_api(out: str, tmp: Path):
    assert says(out) and "paris" in out.lower(), out
    assert wav_seconds(tmp / "out.wav") > 0.3


def check_cli(out: str, tmp: Path):
    assert says(out) and "paris" in out.lower(), out
    assert "whisper-tiny.en" in out and wav_seconds(tmp / "welcome.wav") > 1


# each marked README example: does it need a server, and what its output must show
EXPECT = {
    "realtime-example": (True, check_realtime),
    "rest-example": (True, check_rest),
    "python-api-example": (False, check_python_api),
    "cli-example": (False, check_cli),
}


@pytest.fixture(scope="module")
def server():
    from reliability.rel_helpers import ServerProcess

    s = ServerProcess()
    yield s
    s.stop()


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_readme_example_runs_as_pasted(name, tmp_path, request):
    lang, code = examples()[name]
    needs_server, check = EXPECT[name]
    port = request.getfixturevalue("server").port if needs_server else None
    if lang == "python":
        out = run_python(code, tmp_path, port)
    else:
        assert lang == "sh", lang
        bin_dir = Path(sys.executable).parent
        r = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"),
        )
        assert r.returncode == 0, r.stdout + r.stderr
        out = r.stdout
    check(out, tmp_path)
