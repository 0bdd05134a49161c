"""ServerConfig as `speechrt serve` builds it: the options the command line leaves to the device are set again
for the device where the models load (a Ray replica's GPU, whatever the machine that built the configuration)."""

from __future__ import annotations

from speechrt import cli_serve
from speechrt.cli import build_parser
from speechrt.streaming.asr_options import LOADED_FINAL_MARGIN_S


def config(*argv):
    return cli_serve.server_config(build_parser().parse_args(["serve", "--device", "cpu", *argv]))


def test_options_left_to_the_device_follow_the_replicas_device():
    c = config()
    assert c.device_defaults == {"max_batch", "loaded_final_margin"}
    assert (c.options.max_batch, c.options.loaded_final_margin) == (8, LOADED_FINAL_MARGIN_S)  # this CPU's
    gpu, cpu = c.on_device(True), c.on_device(False)
    assert (gpu.max_batch, gpu.loaded_final_margin) == (32, None)
    assert cpu == c.options
    assert gpu.final_margin == c.options.final_margin and gpu.max_sessions == c.options.max_sessions


def test_options_given_on_the_command_line_stay_on_every_device():
    c = config("--max-batch", "4", "--loaded-final-margin", "2", "--final-margin", "6")
    assert c.device_defaults == frozenset()
    for o in (c.on_device(True), c.on_device(False)):
        assert (o.max_batch, o.loaded_final_margin, o.final_margin) == (4, 2.0, 6.0)


def test_a_small_final_margin_caps_the_loaded_one_on_a_cpu():
    c = config("--final-margin", "2")
    assert c.on_device(False).loaded_final_margin == 2.0 and c.on_device(True).loaded_final_margin is None
