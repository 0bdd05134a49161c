"""`speechrt bench lm --eval`: how well each embedded language model answers as the voice agent, per sampling setting.

The evaluation (speechrt/data/lm_eval.json) is spoken-length factual questions with known short answers and
instructions with checkable rules ("Answer in one sentence.", "Be brief.", "Name three colors."). Every item is
asked as a Realtime conversation asks it: the session's default instructions as the system message, the
question as the user's turn, through the model's own chat template, with the default bound of a spoken reply
(max tokens). Sampling is seeded (seed 0, as the server seeds a reply; --eval-seeds N: the mean over seeds 0 to
N-1), so a run repeats.

Per model and setting: factual accuracy (share of questions whose answer contains an accepted answer, on word
boundaries, case-insensitive), instruction pass rate (share of instructions whose every rule holds, and no
repetition), mean answer words, and the share of answers that repeat themselves (a word 4-gram twice).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources

COLORS = (
    "red orange yellow green blue indigo violet purple pink brown black white gray grey cyan magenta "
    "turquoise teal navy maroon beige gold silver lime olive crimson scarlet lavender"
).split()


@dataclass(frozen=True)
class Setting:
    """One sampling setting of the grid: the options the conversation's generation takes."""

    name: str
    temperature: float = 0.0
    top_p: float = 1.0
    stop_repeats: int = 4  # the repetition stop (GenerationOptions.stop_repeats; 0: off)

    def options(self, max_tokens: int, seed: int = 0) -> dict:
        return dict(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop_repeats=self.stop_repeats,
            seed=seed if self.temperature > 0 else None,
        )


SETTINGS = (
    Setting("greedy"),
    Setting("greedy-norepstop", stop_repeats=0),
    Setting("t0.3-p0.9", 0.3, 0.9),
    Setting("t0.3-p0.9-norepstop", 0.3, 0.9, 0),
    Setting("t0.7-p0.9", 0.7, 0.9),
    Setting("t0.7-p0.9-norepstop", 0.7, 0.9, 0),
)


# --- the scoring rules ---------------------------------------------------------------------------------------
def words(text: str) -> list[str]:
    return re.findall(r"[\w'’-]+", text.lower())


def mentions(text: str, phrase: str) -> bool:
    """Does `text` contain `phrase`, case-insensitive, not inside a longer word?"""
    return re.search(r"(?<!\w)" + re.escape(phrase.lower()) + r"(?!\w)", text.lower()) is not None


def correct(answer: str, accept: list[str]) -> bool:
    """A factual answer is right when it mentions one of the accepted answers."""
    return any(mentions(answer, a) for a in accept)


def sentences(text: str) -> int:
    """Sentences in `text`: pieces ending in . ! or ? (or the text's end) with a word in them."""
    return sum(1 for s in re.split(r"[.!?]+(?:\s+|$)", text.strip()) if words(s))


def colors(text: str) -> int:
    """How many different colours (COLORS) `text` names."""
    return len({"gray" if w == "grey" else w for w in words(text) if w in COLORS})


def repeats(text: str, n: int = 4) -> bool:
    """Does `text` say the same n words twice (a repeated word n-gram)?"""
    w = words(text)
    grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
    return len(set(grams)) < len(grams)


def failed_rules(answer: str, item: dict) -> list[str]:
    """The rules of an instruction item that `answer` breaks ([] = it passes): `sentences` (at most that many,
    at least one), `max_words`, `colors` (names at least that many colours), and never a repeated 4-gram."""
    bad = []
    if "sentences" in item and not 1 <= sentences(answer) <= item["sentences"]:
        bad.append(f"sentences {sentences(answer)} > {item['sentences']}")
    if "max_words" in item and not 1 <= len(words(answer)) <= item["max_words"]:
        bad.append(f"words {len(words(answer))} > {item['max_words']}")
    if "colors" in item and colors(answer) < item["colors"]:
        bad.append(f"colors {colors(answer)} < {item['colors']}")
    if repeats(answer):
        bad.append("repeats itself")
    return bad


# --- the run ---------------------------------------------------------------------------------------------------
def load_items(limit: int | None = None) -> tuple[list[dict], list[dict]]:
    """The evaluation's factual and instruction items (the first `limit` of each)."""
    doc = json.loads(resources.files("speechrt").joinpath("data/lm_eval.json").read_text())
    return doc["factual"][:limit], doc["instructions"][:limit]


def score(answers: list[str], factual: list[dict], instructions: list[dict]) -> dict:
    """The scores of one model and setting from its answers (factual items first, then the instructions)."""
    fa, ia = answers[: len(factual)], answers[len(factual) :]
    return {
        "factual_accuracy": sum(correct(a, it["accept"]) for a, it in zip(fa, factual)) / max(1, len(factual)),
        "instruction_pass_rate": sum(not failed_rules(a, it) for a, it in zip(ia, instructions))
        / max(1, len(instructions)),
        "mean_answer_words": sum(len(words(a)) for a in answers) / max(1, len(answers)),
        "repeating_answers": sum(repeats(a) for a in answers) / max(1, len(answers)),
    }


def embedded_models(only: str | None) -> tuple[list[str], dict[str, str]]:
    """The registry's language models that are installed (or just `only`), and why each other one is not run."""
    from speechrt.models import registry
    from speechrt.models.registry import ModelError

    if only is not None:
        return [only], {}
    names, missing = [], {}
    for name in registry.names("lm"):
        try:
            registry.resolve(name, "lm")
        except ModelError as e:
            missing[name] = str(e)
        else:
            names.append(name)
    return names, missing


def run(args) -> int:
    from speechrt.errors import UserError
    from speechrt.pipelines.lm import load_lm
    from speechrt.streaming.realtime.config import SessionConfig
    from speechrt.streaming.realtime.response_options import AUDIO_MAX_OUTPUT_TOKENS

    by_name = {s.name: s for s in SETTINGS}
    chosen = [s.strip() for s in args.eval_settings.split(",") if s.strip()] if args.eval_settings else list(by_name)
    bad = [s for s in chosen if s not in by_name]
    if bad or not chosen:
        raise UserError(f"unknown --eval-settings {', '.join(bad) or repr('')}; valid: {', '.join(by_name)}")
    if args.eval_limit is not None and args.eval_limit < 1:
        raise UserError(f"--eval-limit must be >= 1, got {args.eval_limit}")
    if args.eval_seeds < 1:
        raise UserError(f"--eval-seeds must be >= 1, got {args.eval_seeds}")
    factual, instructions = load_items(args.eval_limit)
    system = SessionConfig().instructions
    questions = [it["q"] for it in factual + instructions]
    models, missing = embedded_models(args.model)
    print(
        f"speechrt bench lm --eval: {len(factual)} factual questions, {len(instructions)} instructions; the "
        f"conversation's system prompt {system!r}; at most {AUDIO_MAX_OUTPUT_TOKENS} tokens (a spoken reply's "
        f"bound); sampling seeded: the mean over seeds 0 to {args.eval_seeds - 1}"
    )
    for name, why in missing.items():
        print(f"  {name}: skipped: {why}")
    rows = []
    for name in models:
        lm = load_lm(name, args.backends.split(",")[0], device=args.device, dtype=args.dtype, step_threads=args.threads)
        if lm.template is None:  # (a base model may carry none: it cannot be asked as a conversation asks)
            missing[name] = "it carries no chat template: the evaluation asks through the model's own template"
            print(f"  {name}: skipped: {missing[name]}")
            continue
        print(f"\n{name} ({lm.info})")
        print(f"{'setting':22} {'factual':>8} {'instructions':>13} {'mean words':>11} {'repeating':>10}")
        for s in chosen:
            # greedy answers are the same for every seed: one pass; sampled ones: the mean over the seeds
            seeds = range(args.eval_seeds if by_name[s].temperature > 0 else 1)
            runs = [
                lm.generate_batch(questions, chat=True, system=system, **by_name[s].options(AUDIO_MAX_OUTPUT_TOKENS, i))
                for i in seeds
            ]
            scores = [score([a.strip() for a in answers], factual, instructions) for answers in runs]
            sc = {k: sum(x[k] for x in scores) / len(scores) for k in scores[0]}
            answers = runs[0]
            rows.append((name, lm.info, by_name[s], sc, len(scores)))
            print(
                f"{s:22} {sc['factual_accuracy']:8.2f} {sc['instruction_pass_rate']:13.2f} "
                f"{sc['mean_answer_words']:11.1f} {sc['repeating_answers']:10.2f}"
            )
            if args.eval_show:
                for q, a in zip(questions, answers):
                    print(f"    Q: {q}\n    A: {a.strip()!r}")
    if args.json:
        _write(args.json, rows, missing, len(factual), len(instructions), AUDIO_MAX_OUTPUT_TOKENS)
    return 0


METRICS = (  # name, unit, better
    ("factual_accuracy", "fraction", "higher"),
    ("instruction_pass_rate", "fraction", "higher"),
    ("mean_answer_words", "words", ""),
    ("repeating_answers", "fraction", "lower"),
)


def _write(path, rows, missing, n_factual, n_instr, max_tokens) -> None:
    from speechrt.bench.record import Record, Results

    out = Results()
    for name, info, s, sc, n_seeds in rows:
        for metric, unit, better in METRICS:
            out.records.append(
                Record(
                    family="lm",
                    model=name,
                    engine="speechrt",
                    backend=info.backend,
                    precision=info.precision,
                    device=info.device,
                    workload=f"eval {n_factual} factual + {n_instr} instructions, {s.name}",
                    metric=metric,
                    unit=unit,
                    value=float(sc[metric]),
                    better=better,
                    params={
                        "temperature": s.temperature,
                        "top_p": s.top_p,
                        "stop_repeats": s.stop_repeats,
                        "max_tokens": max_tokens,
                        "seeds": n_seeds if s.temperature > 0 else 0,
                    },
                )
            )
    for name, why in missing.items():
        out.skip("lm", name, why)
    out.write(path)
