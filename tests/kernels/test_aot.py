"""Every Triton kernel compiles ahead of time, at the models' shapes, for sm_80, sm_90, gfx90a and
gfx942 with no GPU: no register spills, and the matmul-like kernels use the matrix instructions.
One `speechrt kernels report` run (a subprocess: the kernels in this process are interpreted) serves
all the checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from speechrt import kernels

pytest.importorskip("triton", reason="Triton is not installed (pip install 'speechrt[triton]')")

TARGETS = ("sm_80", "sm_90", "gfx90a", "gfx942")
MATMUL_LIKE = {
    "_linear_kernel",
    "_linear_int8_kernel",
    "_attention_kernel",
    "_decode_attention_grouped_kernel",
    # the fused decode-step kernels (kernels/aot_specs_fused.py: SmolLM2 and Llama-3.2-1B shapes, 1 and 64 rows)
    "_norm_qkv_rope_kernel",
    "_linear_residual_kernel",
    "_norm_gate_up_kernel",
    "_norm_logits_kernel",
    # the Whisper decoder step's (Whisper tiny and large-v3-turbo shapes, 1 and 64 rows)
    "_norm_linear_kernel",
    # the quantized linears (kernels/aot_specs_quant.py): W4A16 and FP8 at the SmolLM2 and Llama-3.2-1B shapes
    "_linear_w4_kernel",
    "_linear_fp8_kernel",
    # the fused decode-step kernels on int4 / fp8 / int8 weights (kernels/aot_specs_quant.py)
    "_norm_qkv_rope_q_kernel",
    "_linear_residual_q_kernel",
    "_norm_gate_up_q_kernel",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("aot") / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run(
        [sys.executable, "-m", "speechrt", "kernels", "report", "--json", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    rows = json.loads(path.read_text()) if path.exists() else None
    return r, rows


def _kernels() -> dict:
    """Every @triton.jit kernel (not helper) in the modules the Triton kernel set uses: name -> its Python function."""
    import importlib

    found = {}
    for mod in [
        *kernels.TRITON_MODULES,
        "speechrt.kernels.triton_decode_attention",
        "speechrt.kernels.triton_fused",
        "speechrt.kernels.triton_fused_whisper",
        "speechrt.kernels.triton_fused_quant",
        "speechrt.kernels.triton_fused_split",
        "speechrt.kernels.triton_whisper_pick",
        "speechrt.kernels.triton_repeats",
    ]:
        m = importlib.import_module(mod)
        found |= {n: k.fn for n, k in vars(m).items() if n.startswith("_") and n.endswith("_kernel")}
    return found


def test_report_command_succeeds(report):
    r, rows = report
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert rows, "no JSON written"
    assert "all compiled, no spills" in r.stdout
    for t in TARGETS:
        assert t in r.stdout


def test_every_kernel_compiled_for_every_target(report):
    _, rows = report
    seen = {}
    for row in rows:
        seen.setdefault(row["kernel"], set()).add(row["target"])
    expected = set(_kernels())
    assert expected and expected <= set(seen), f"kernels missing from the report: {sorted(expected - set(seen))}"
    for k, targets in seen.items():
        assert targets == set(TARGETS), (k, targets)
    failed = [(r["kernel"], r["variant"], r["target"], r["error"]) for r in rows if not r["ok"]]
    assert not failed, failed


def test_no_spills_and_resources_read(report):
    _, rows = report
    for r in rows:
        assert r["regs"] is not None and r["regs"] > 0, r
        assert r["spills"] == 0, r
        assert r["smem"] is not None and r["smem"] >= 0, r
        if r["target"].startswith("gfx"):
            assert r["sgprs"] is not None and r["sgprs"] > 0, r
            assert r["regs"] <= 512, r  # CDNA2/3: 512 VGPR+AGPR per lane at most
        else:
            assert r["regs"] <= 255, r


def test_matrix_instructions_in_matmul_kernels(report):
    _, rows = report
    mm = [r for r in rows if r["kernel"] in MATMUL_LIKE]
    assert {r["kernel"] for r in mm} == MATMUL_LIKE
    missing = [(r["kernel"], r["variant"], r["target"]) for r in mm if not r["mma"]]
    assert not missing, f"no mma/wgmma/v_mfma in {missing}"
    # elementwise kernels must not claim a matrix instruction (the detector is not vacuous)
    assert not any(r["mma"] for r in rows if r["kernel"] in {"_gelu_kernel", "_silu_mul_kernel"})


def test_specs_compile_what_the_launches_run():
    """A launch specializes an int argument equal to 1 as the constant 1: the models' K strides and a one-row step's
    row count. The specs compile those binaries (the others: runtime ints), and say nothing aligned about them."""
    from speechrt.kernels.aot_specs import specs
    from speechrt.kernels.aot_specs_fused import fused_specs

    every = specs() + fused_specs()
    strided = [s for s in every if "sxk" in s.signature]
    assert strided and all(s.signature["sxk"] == s.signature["swk"] == "constexpr" for s in strided)
    assert all(s.constexprs["sxk"] == s.constexprs["swk"] == 1 for s in strided)
    rows = {s.variant: s for s in strided if "M" in s.signature}
    one = [v for v in rows if "M=1" in v or " 1x" in v]
    assert one and all(rows[v].constexprs.get("M") == 1 for v in one)
    assert all(rows[v].signature["M"] == "i32" for v in rows if "M=64" in v)
    assert not any(a in s.constexprs for s in every for a in s.aligned)


def test_amd_spills_are_those_to_memory():
    """On AMD a spill is one to scratch memory: VGPRs always; SGPRs only where the kernel has scratch (without it
    they went into VGPR lanes, as the fp8 decode GEMV's do on gfx90a / gfx942)."""
    from speechrt.kernels.aot import _amd_resources

    def asm(vgpr_spills, sgpr_spills, scratch):
        return (
            f"    .vgpr_count:     115\n    .sgpr_count:     106\n    .agpr_count:     0\n"
            f"    .vgpr_spill_count: {vgpr_spills}\n    .sgpr_spill_count: {sgpr_spills}\n; ScratchSize: {scratch}\n"
        )

    assert _amd_resources(asm(0, 5, 0)) == {"regs": 115, "sgprs": 106, "spills": 0, "scratch": 0}
    assert _amd_resources(asm(0, 5, 16))["spills"] == 5
    assert _amd_resources(asm(3, 0, 12))["spills"] == 3


def test_decode_step_kernels_wait_for_their_predecessor_on_sm_90(report):
    """Every kernel of the decode steps (those with a PDL flag: kernels/triton_pdl.py) compiles for sm_90 with
    programmatic dependent launch: it waits for the previous kernel (griddepcontrol.wait) before anything else. Not on
    sm_80 (no such instruction) and not in the other kernels (prefill attention, activations, rotary)."""
    import inspect

    _, rows = report
    fns, flagged = _kernels(), set()
    for r in rows:
        if "PDL" in inspect.signature(fns[r["kernel"]]).parameters:
            flagged.add(r["kernel"])
            assert r["pdl"] is (r["target"] == "sm_90") or (r["target"].startswith("gfx") and r["pdl"] is None), r
        else:
            assert not r["pdl"], r
    assert {"_norm_qkv_rope_kernel", "_linear_residual_q_kernel", "_decode_attention_grouped_kernel"} <= flagged
    assert {"_norm_linear_kernel", "_whisper_pick_kernel", "_rms_norm_kernel", "_sum_residual_kernel"} <= flagged
    assert "_attention_kernel" not in flagged and "_gelu_kernel" not in flagged


def test_split_variants_compile_as_each_vendor_launches_them():
    """A fused op's one-row K-split variant compiles as kernels/triton_fused_split.py launches it: on NVIDIA with its
    splits merged in the launch, under the register cap MERGE_MAXNREG; on AMD leaving its partial sums to the
    second launch (no cap)."""
    from speechrt.kernels.aot_specs_fused import fused_specs
    from speechrt.kernels.aot_specs_quant import quant_specs
    from speechrt.kernels.triton_decode_attention import MERGE_MAXNREG

    for hip in (False, True):
        split = [s for s in fused_specs(hip) + quant_specs(hip) if s.constexprs.get("SPLIT")]
        assert len(split) >= 10 and all("split-K" in s.variant for s in split)
        for s in split:
            assert s.constexprs["MERGE"] is (not hip), s.variant
            assert s.options.get("maxnreg") == (None if hip else MERGE_MAXNREG), s.variant
    # decode attention's splits merged in the launch: capped on NVIDIA as its launcher caps them (Triton 3.6 spilled
    # SmolLM2's grouped variant without the cap), never on AMD; one split, or the two-launch path, uncapped
    from speechrt.kernels import triton_decode_attention as dec
    from speechrt.kernels.aot_specs import specs

    assert dec.merge_options(torch.device("cuda")) == {"maxnreg": MERGE_MAXNREG}
    assert dec.merge_options(torch.device("cpu")) == {}
    for hip in (False, True):
        attn = [s for s in specs(hip) if s.kernel.startswith("_decode_attention")]
        merged = [s for s in attn if s.constexprs["OUT_MODE"] == dec.MERGE]
        assert len(merged) >= 5 and len(attn) > len(merged)
        for s in attn:
            capped = s.constexprs["OUT_MODE"] == dec.MERGE and not hip
            assert s.options.get("maxnreg") == (MERGE_MAXNREG if capped else None), s.variant
