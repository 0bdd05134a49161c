"""`bench lm --eval`: the evaluation's scoring rules on fixed answers (each rule passes one and fails one), and a
real run on the embedded SmolLM2 with a 3-item subset writing finite scores in the bench schema."""

from __future__ import annotations

import math
from pathlib import Path

from speechrt.bench import lm_eval
from speechrt.bench.record import load


def test_a_factual_answer_is_right_when_it_names_an_accepted_answer():
    assert lm_eval.correct("The capital of France is Paris.", ["Paris"])
    assert lm_eval.correct("A week has 7 days.", ["seven", "7"])
    assert not lm_eval.correct("The capital of France is Lyon.", ["Paris"])
    assert not lm_eval.correct("It has 17 legs.", ["seven", "7"])  # not inside a longer number or word


def test_instruction_rules_pass_and_fail():
    one = {"sentences": 1}
    assert lm_eval.failed_rules("The sky is blue because air scatters blue light.", one) == []
    assert lm_eval.failed_rules("The sky is blue. Air scatters blue light!", one) == ["sentences 2 > 1"]
    brief = {"max_words": 5}
    assert lm_eval.failed_rules("Boil it nine minutes.", brief) == []
    assert lm_eval.failed_rules("Put the egg in boiling water for nine minutes.", brief) == ["words 9 > 5"]
    three = {"colors": 3}
    assert lm_eval.failed_rules("Red, green and blue.", three) == []
    assert lm_eval.failed_rules("Camper, Magma, Jack Dorron.", three) == ["colors 0 < 3"]
    assert lm_eval.failed_rules("Gray, grey and red.", three) == ["colors 2 < 3"]  # one colour, two spellings
    assert lm_eval.failed_rules("I like dogs and I like cats.", {}) == []
    assert lm_eval.failed_rules("I like dogs a lot and I like dogs a lot.", {}) == ["repeats itself"]


def test_scores_of_fixed_answers():
    factual, instr = [{"q": "?", "accept": ["Paris"]}, {"q": "?", "accept": ["Tokyo"]}], [{"q": "?", "colors": 3}]
    sc = lm_eval.score(["Paris.", "Kyoto.", "Red, blue, green."], factual, instr)
    assert sc == {
        "factual_accuracy": 0.5,
        "instruction_pass_rate": 1.0,
        "mean_answer_words": 5 / 3,
        "repeating_answers": 0.0,
    }


def test_bench_lm_eval_on_the_embedded_model(bench, tmp_path):
    out = tmp_path / "eval.json"
    r = bench(
        "lm",
        "--eval",
        "--model",
        "smollm2-135m-instruct",
        "--eval-limit",
        "3",
        "--eval-settings",
        "greedy",
        "--threads",
        "1",
        "--json",
        out,
    )
    assert r.returncode == 0, r.stderr
    assert "3 factual questions, 3 instructions" in r.stdout and "smollm2-135m-instruct" in r.stdout
    res = load(out)
    got = {(x.model, x.workload, x.metric): x.value for x in res.records}
    wl = "eval 3 factual + 3 instructions, greedy"
    for metric, _, _ in lm_eval.METRICS:
        assert math.isfinite(got[("smollm2-135m-instruct", wl, metric)])
    assert 0 <= got[("smollm2-135m-instruct", wl, "factual_accuracy")] <= 1
    assert got[("smollm2-135m-instruct", wl, "mean_answer_words")] > 0
    assert all(s.what != "smollm2-135m-instruct" for s in res.skipped)  # the embedded model always runs


def test_bench_lm_eval_says_a_model_without_a_chat_template_is_skipped(bench, tmp_path):
    """A base model that carries no chat template cannot be asked as a conversation asks: one line says so (it made
    the run fail with 'carries no chat template' before), and the JSON lists it as skipped."""
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from lm_archs import byte_bpe, hf_model
    from transformers import PreTrainedTokenizerFast

    d = tmp_path / "base"
    hf_model("qwen2").save_pretrained(d, safe_serialization=True)
    PreTrainedTokenizerFast(tokenizer_object=byte_bpe(), eos_token="<|endoftext|>").save_pretrained(d)
    out = tmp_path / "eval.json"
    r = bench("lm", "--eval", "--model", d, "--eval-limit", "1", "--eval-settings", "greedy", "--json", out)
    assert r.returncode == 0, r.stderr
    assert "skipped: it carries no chat template" in r.stdout
    assert [s.what for s in load(out).skipped] == [str(d)]


def test_without_a_model_option_every_installed_language_model_is_evaluated():
    """The default model list (the run above names its model, so it does not depend on what is installed): every
    registry language model is either run or listed with the reason it is not, and the embedded one always runs."""
    from speechrt.models import registry

    names, missing = lm_eval.embedded_models(None)
    assert "smollm2-135m-instruct" in names
    assert sorted(names + list(missing)) == sorted(registry.names("lm")) and all(missing.values()), missing
    assert lm_eval.embedded_models("x.gguf") == (["x.gguf"], {})
