"""SPEECHRT_CPU_ISA=avx2 (speechrt.machine: the flags beyond AVX2 hidden from speechrt's choices) and
benchmarks.avx2_proxy (ONNX Runtime held to its AVX2 kernels by patching its reads of XCR0): the flags a
capped process sees, the patch on a small library whose XGETBV result is read back, and a patched copy of the
installed ONNX Runtime computing what the installed one does."""

from __future__ import annotations

import ctypes
import platform
import shutil
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import avx2_proxy
from speechrt.kernels import cpu_decode
from speechrt.machine import BEYOND_AVX2, cpu_flags

x86 = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="XGETBV is an x86 instruction")
tools = pytest.mark.skipif(
    shutil.which("objdump") is None or shutil.which("cc") is None, reason="needs objdump (binutils) and a C compiler"
)


def test_cpu_isa_avx2_hides_wider_flags(monkeypatch):
    monkeypatch.delenv("SPEECHRT_CPU_ISA", raising=False)
    native = cpu_flags()
    if not native:
        pytest.skip("/proc/cpuinfo lists no flags here")
    monkeypatch.setenv("SPEECHRT_CPU_ISA", "avx2")
    capped = cpu_flags()
    assert not any(f.startswith(BEYOND_AVX2) for f in capped)
    assert capped == {f for f in native if not f.startswith(("avx512", "amx", "avx_vnni"))}
    assert ("avx2" in capped) == ("avx2" in native)
    assert cpu_decode.vnni_flags() == []  # the decode kernel is built in its AVX2 form
    monkeypatch.setenv("SPEECHRT_CPU_ISA", "native")
    assert cpu_flags() == native


def test_cpu_isa_unknown_value_names_the_valid_ones(monkeypatch):
    monkeypatch.setenv("SPEECHRT_CPU_ISA", "avx512")
    with pytest.raises(ValueError, match="valid values are 'avx2'.*'native'"):
        cpu_flags()


LIB = r"""
unsigned long long xcr0(void) {
    unsigned int eax, edx;
    __asm__ volatile ("xor %%ecx, %%ecx\n\txgetbv" : "=a"(eax), "=d"(edx) : : "ecx");
    return ((unsigned long long)edx << 32) | eax;
}
"""


@x86
@tools
def test_patched_xgetbv_reports_avx_state_only(tmp_path):
    src, lib = tmp_path / "x.c", tmp_path / "libx.so"
    src.write_text(LIB)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    before = ctypes.CDLL(str(lib)).xcr0
    before.restype = ctypes.c_ulonglong
    assert before() & 0x7 == 0x7  # x87, SSE and AVX state: every x86-64 CPU that runs this project

    offsets = avx2_proxy.xgetbv_offsets(lib)
    assert len(offsets) == 1
    # the XGETBV's function alone disassembled (from the unwind tables) finds what the whole .text's disassembly does
    assert offsets == avx2_proxy.xgetbv_offsets(lib, whole=True)
    data = bytearray(lib.read_bytes())
    avx2_proxy.patch_xgetbv(data, offsets)
    patched = tmp_path / "libx_patched.so"
    patched.write_bytes(bytes(data))
    after = ctypes.CDLL(str(patched)).xcr0
    after.restype = ctypes.c_ulonglong
    assert after() & 0xFFFFFFFF == 0x7  # no AVX-512 state (bits 5-7) nor AMX's (17-18)

    with pytest.raises(SystemExit, match="no XGETBV at offset"):
        avx2_proxy.patch_xgetbv(bytearray(lib.read_bytes()), [offsets[0] + 1])


PROBE = """
import sys, numpy as np, onnxruntime as ort
from onnx import helper, TensorProto, numpy_helper
rng = np.random.default_rng(int(sys.argv[1]))
w = numpy_helper.from_array(rng.standard_normal((67, 45)).astype(np.float32), "w")
w7 = numpy_helper.from_array(rng.integers(-64, 64, (67, 45)).astype(np.int8), "w7")
w8 = numpy_helper.from_array(rng.integers(-128, 128, (67, 45)).astype(np.int8), "w8")
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"]),
                       helper.make_node("MatMulInteger", ["xq", "w7"], ["y7"]),
                       helper.make_node("MatMulInteger", ["xq", "w8"], ["y8"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [37, 67]),
                       helper.make_tensor_value_info("xq", TensorProto.UINT8, [37, 67])],
                      [helper.make_tensor_value_info(n, t, None) for n, t in
                       (("y", TensorProto.FLOAT), ("y7", TensorProto.INT32), ("y8", TensorProto.INT32))], [w, w7, w8])
s = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                         providers=["CPUExecutionProvider"])
x, xq = rng.standard_normal((37, 67)).astype(np.float32), rng.integers(0, 256, (37, 67)).astype(np.uint8)
y, y7, y8 = s.run(None, {"x": x, "xq": xq})
np.savez(sys.argv[2], y=y, y7=y7, y8=y8, where=ort.__file__)
"""


@x86
@tools
def test_patched_onnxruntime_computes_as_the_installed_one(tmp_path):
    proxy = tmp_path / "proxy"
    patched = avx2_proxy.make(proxy)
    assert any(lib.startswith("onnxruntime_pybind11_state") for lib, _ in patched)
    assert "SPEECHRT_CPU_ISA" in (proxy / "sitecustomize.py").read_text()
    seed = int(np.random.default_rng().integers(1 << 30))
    runs = {}
    for name, path in (("installed", None), ("proxy", str(proxy))):
        env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
        if path:
            env["PYTHONPATH"] = path
        out = tmp_path / f"{name}.npz"
        subprocess.run([sys.executable, "-c", PROBE, str(seed), str(out)], env=env, check=True)
        runs[name] = np.load(out)
    assert str(runs["proxy"]["where"]).startswith(str(proxy))
    assert not str(runs["installed"]["where"]).startswith(str(proxy))
    # 7-bit weights (as quantizers' reduce_range makes them): exact integer sums on every path
    np.testing.assert_array_equal(runs["proxy"]["y7"], runs["installed"]["y7"])
    # full-range weights: MLAS's AVX2 kernel adds u8*s8 pairs in int16 (vpmaddubsw) and saturates, as it does on
    # an AVX2 CPU; VNNI (vpdpbusd) sums in int32. So where the CPU has VNNI, the patched copy's sums differ
    # AVX-VNNI (vpdpbusd in its VEX form, Intel since Alder Lake / Sapphire Rapids) needs only the AVX state that the
    # patched XCR0 keeps: there MLAS's AVX2 path sums in int32 too, and the copy's sums equal the installed one's
    native = cpu_flags() or set()
    if "avx_vnni" in native:
        np.testing.assert_array_equal(runs["proxy"]["y8"], runs["installed"]["y8"])
    elif "avx512_vnni" in native:
        assert (runs["proxy"]["y8"] != runs["installed"]["y8"]).any(), "the patched copy ran the VNNI kernel"
    y, ref = runs["proxy"]["y"], runs["installed"]["y"]
    assert np.isfinite(y).all()
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
