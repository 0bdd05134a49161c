"""An AVX2-only machine's code paths on a CPU that has AVX-512, for benchmarks: the nearest this project gets to
an AVX2 machine when the VM it is given has AVX-512 (its numbers are the AVX-512 core's, running AVX2 code: say
so beside them).

    python -m benchmarks.avx2_proxy DIR     # writes DIR/onnxruntime and DIR/sitecustomize.py
    PYTHONPATH=DIR speechrt bench server ...    # anything, with every library on its AVX2 path

- ONNX Runtime has no switch for it: MLAS picks its kernels from CPUID and XGETBV once, when it loads. DIR gets a
  copy of the installed onnxruntime package whose XGETBV instructions (the read of XCR0, the register that says
  which vector state the OS saves) are replaced by `push 7; pop rax`: x87, SSE and AVX state, no AVX-512 state. So
  MLAS, ONNX Runtime's own CPU probe and cpuinfo take the AVX2 kernels, as they do on an AVX2 CPU.
- DIR/sitecustomize.py (Python imports it at start-up from PYTHONPATH) sets SPEECHRT_CPU_ISA=avx2 (speechrt's
  backend choice and its CPU decode kernel's build, speechrt.machine), ATEN_CPU_CAPABILITY=avx2 (torch's
  kernels), ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN) and CT2_FORCE_CPU_ISA=AVX2 (CTranslate2, faster-whisper's engine).

It then checks the copy: int8 MatMulInteger on the copy and on the installed package, side by side. On a CPU
with AVX512-VNNI the copy's is about half (vpmaddubsw in place of vpdpbusd); equal speeds mean the patch missed.
A CPU with AVX-VNNI (the VEX form of vpdpbusd, which needs only AVX state) keeps its VNNI kernel under the patch:
there the copy is not an AVX2-only machine's int8 path.
"""

from __future__ import annotations

import argparse
import bisect
import re
import shutil
import subprocess
import sys
from pathlib import Path

XGETBV = b"\x0f\x01\xd0"
XCR0_AVX_ONLY = b"\x6a\x07\x58"  # push 7; pop rax: the same 3 bytes as XGETBV

SITECUSTOMIZE = '''"""benchmarks.avx2_proxy: every library on its AVX2 code path
(this directory's onnxruntime is patched)."""
import os

for k, v in {"SPEECHRT_CPU_ISA": "avx2", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "CT2_FORCE_CPU_ISA": "AVX2", "SPEECHRT_AVX2_PROXY": "1"}.items():
    os.environ.setdefault(k, v)
'''

INT8_PROBE = """
import time, numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto, numpy_helper
n = 768
w = numpy_helper.from_array(np.random.randint(-128, 127, (n, n)).astype(np.int8), "w")
g = helper.make_graph([helper.make_node("MatMulInteger", ["x", "w"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.UINT8, [n, n])],
                      [helper.make_tensor_value_info("y", TensorProto.INT32, None)], [w])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
so = ort.SessionOptions(); so.intra_op_num_threads = 1
s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
x = np.random.randint(0, 255, (n, n)).astype(np.uint8)
s.run(None, {"x": x}); best = 1e9
for _ in range(8):
    t = time.perf_counter(); s.run(None, {"x": x}); best = min(best, time.perf_counter() - t)
print(ort.__file__, 2 * n ** 3 / best / 1e9)
"""


def _text_sections(lib: Path) -> list[tuple[int, int, int]]:
    """(vma, size, file offset) of the library's .text sections (objdump -h)."""
    heads = subprocess.run(["objdump", "-h", str(lib)], capture_output=True, text=True, check=True).stdout
    # "  idx name  size  vma  lma  file-off  align"
    return [
        (int(vma, 16), int(size, 16), int(off, 16))
        for _, name, size, vma, _, off, *_ in (
            line.split() for line in heads.splitlines() if re.match(r"\s+\d+ \.", line)
        )
        if name == ".text"
    ]


def _disassembled_xgetbvs(lib: Path, *window: str) -> list[int]:
    """Addresses of the XGETBV instructions objdump decodes in .text (or in the --start/--stop-address window)."""
    dis = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-j", ".text", *window, str(lib)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [int(m.group(1), 16) for m in re.finditer(r"^\s*([0-9a-f]+):\s+xgetbv\s*$", dis, re.M)]


def _functions(lib: Path) -> list[tuple[int, int]]:
    """[start, end) of every function the unwind tables (.eh_frame's FDEs) describe, sorted."""
    out = subprocess.run(
        ["readelf", "--debug-dump=frames", str(lib)], capture_output=True, text=True, check=False
    ).stdout
    return sorted((int(a, 16), int(b, 16)) for a, b in re.findall(r"FDE cie=\S+ pc=([0-9a-f]+)\.\.([0-9a-f]+)", out))


def xgetbv_offsets(lib: Path, whole: bool = False) -> list[int]:
    """File offsets of the XGETBV instructions in a shared library, found by disassembling it (objdump): the
    same three bytes occur inside other instructions too. Only the functions holding those bytes are disassembled,
    each from its start as the unwind tables give it (a 35-MB library: well under a second, against ~7 s for the
    whole .text); bytes in no described function, or `whole`, disassemble all of .text."""
    if shutil.which("objdump") is None:
        raise SystemExit("objdump not found: install binutils (apt install binutils)")
    sections = _text_sections(lib)
    data = lib.read_bytes()
    found: set[int] = set()
    funcs = [] if whole or shutil.which("readelf") is None else _functions(lib)
    starts = [a for a, _ in funcs]
    for vma, size, off in sections:
        seen = set()
        at = data.find(XGETBV, off, off + size)
        while at >= 0:
            addr = vma + at - off
            i = bisect.bisect_right(starts, addr) - 1
            if i < 0 or not funcs[i][0] <= addr < funcs[i][1]:
                found = None  # bytes outside every described function: read the whole .text
                break
            seen.add(funcs[i])
            at = data.find(XGETBV, at + 1, off + size)
        if found is None:
            break
        for a, b in sorted(seen):
            found.update(_disassembled_xgetbvs(lib, f"--start-address={a:#x}", f"--stop-address={b:#x}"))
    if found is None or whole or not funcs:
        found = set(_disassembled_xgetbvs(lib))
    return sorted(off + addr - vma for addr in found for vma, size, off in sections if vma <= addr < vma + size)


def patch_xgetbv(data: bytearray, offsets: list[int]) -> None:
    """Replace the XGETBV at each offset of `data` in place."""
    for at in offsets:
        if data[at : at + len(XGETBV)] != XGETBV:
            raise SystemExit(f"no XGETBV at offset {at:#x}: the disassembly and the file disagree")
        data[at : at + len(XGETBV)] = XCR0_AVX_ONLY


def make(out: Path) -> list[tuple[str, int]]:
    """DIR/onnxruntime (patched copy) and DIR/sitecustomize.py; the patched (library, sites) pairs."""
    import onnxruntime

    src = Path(onnxruntime.__file__).parent
    dst = out / "onnxruntime"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    patched = []
    for lib in sorted(dst.glob("capi/*.so*")):
        sites = xgetbv_offsets(lib)
        if sites:
            data = bytearray(lib.read_bytes())
            patch_xgetbv(data, sites)
            lib.write_bytes(bytes(data))
            patched.append((lib.name, len(sites)))
    if not patched:
        raise SystemExit(f"no XGETBV found in {src}/capi: this ONNX Runtime build cannot be patched here")
    (out / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return patched


def int8_gops(pythonpath: str | None) -> tuple[str, float]:
    """(the onnxruntime imported, int8 MatMulInteger GOP/s on one thread) in a fresh interpreter."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-c", INT8_PROBE], env=env, capture_output=True, text=True, check=True)
    where, gops = out.stdout.split()[-2:]
    return where, float(gops)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.avx2_proxy", description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="where to write the patched onnxruntime and sitecustomize.py")
    args = ap.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    for lib, n in make(args.dir):
        print(f"{lib}: {n} XGETBV read(s) of XCR0 now report x87/SSE/AVX state only")
    native, proxy = int8_gops(None), int8_gops(str(args.dir))
    if not proxy[0].startswith(str(args.dir.resolve())):
        raise SystemExit(f"PYTHONPATH={args.dir} imported {proxy[0]}, not the patched copy")
    print(
        f"int8 MatMulInteger, one thread: installed {native[1]:.0f} GOP/s, AVX2 proxy {proxy[1]:.0f} GOP/s "
        f"({proxy[1] / native[1]:.2f}x)"
    )
    print(f"run with: PYTHONPATH={args.dir} ...")


if __name__ == "__main__":
    main()
