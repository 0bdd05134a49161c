"""A lent GPU session's device calls, rehearsed here on the CPU in a copy of the lent machines' image.

A GPU is lent to few sessions, for 15 minutes; a call that fails at install or import there loses the session.
This runs the same calls, in the same order, each with the same pieces of `.gpukit/` (benchmarks.gpu_kit), in a
checkout copied the way the device tool copies it (tracked files, plus the pieces carried), with `python3` from a
venv holding the image's packages at the image's versions (KINDS.md: Python 3.12, torch 2.11.0 with Triton 3.6.0,
numpy 2.5.2, onnxruntime 1.30.0, ...; torch's wheel from the registry is its CUDA build: ~5 GB, made once in
--venv). Without a GPU, `bench gpu` skips what needs one, so the rehearsal shows: the wheels install, speechrt
installs and imports under that Python and those packages, the models arrive in pieces and unpack, and then the
checks that also run on the CPU (the decode loops of both embedded models, the mel batch and a two-level server
ramp) pass there:

    python -m benchmarks.gpu_rehearsal                  # builds the kit and the venv if missing, then the calls
    python -m benchmarks.gpu_rehearsal --print-plan     # the device calls, as the GPU session makes them
    python -m benchmarks.gpu_rehearsal --plan ramp      # another session's calls (PLANS: checks, ramp, lm-1b)

Not shown here: anything on a GPU, the transfers' time, and Triton 3.6's compiler (`python -m
speechrt.kernels.aot` with that Triton on PYTHONPATH does that). Triton 3.6's interpreter is not used: under numpy
2.5 it cannot index a range with a loaded scalar, which compiled kernels can."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import gpu_kit

# the image's packages that speechrt imports, at the versions read there (KINDS.md, 2026-11); the rest of
# gpu_kit.ON_IMAGE at the registry's versions
IMAGE_PINS = (
    "torch==2.11.0 triton==3.6.0 numpy==2.5.2 onnxruntime==1.30.0 tokenizers==0.23.2 transformers==5.17.0 "
    "safetensors==0.8.0 onnx==1.23.1 huggingface-hub==1.33.0 accelerate==1.15.0"
).split()
IMAGE_PYTHON = "3.12"
# a GPU session's calls: (pieces carried, speechrt's arguments after `--` or None, the call's timeout in s); $OUT is
# the folder whose files come back. "checks": every check that loads no model within 490 s while only kit0 has come,
# then the models and the two decode loops; the others bring the models first and run one long call with kit0.
PLANS = {
    "checks": (
        (("kit0",), "bench gpu --json $OUT/gpu.json --budget 490", 590),
        (("kit1",), None, 120),
        (("kit2",), None, 120),
        (("kit3",), None, 120),
        ((), "bench gpu --json $OUT/gpu-models.json --checks lm-loop,asr-loop --budget 100", 200),
    ),
    # issue 51's ramp, 1..2048 streams, with the GPU's busy share per level
    "ramp": (
        (("kit1",), None, 120),
        (("kit2",), None, 120),
        (("kit3",), None, 120),
        (("kit0",), "bench gpu --checks gpu,server-ramp --json $OUT/ramp.json --budget 500", 590),
    ),
    # the Llama-3.2-1B shape's step against gpt-fast's recipe, and SmolLM2 against it in bench lm
    "lm-1b": (
        (("kit1",), None, 120),
        (("kit2",), None, 120),
        (("kit3",), None, 120),
        (("kit0",), "bench gpu --checks gpu,lm-1b,lm-peers --json $OUT/lm-1b.json --budget 500", 590),
    ),
}
# after the plan, what runs without a GPU on the models the plan brought (the CPU paths of the checks)
ON_CPU = (
    "bench gpu --device cpu --checks lm-loop,asr-loop,mel-batch,server-ramp --server-levels 1,2 --server-budget 30 "
    "--json $OUT/cpu.json"
)


def print_plan(plan) -> None:
    for pieces, cli, timeout in plan:
        cmd = "python3 -m benchmarks.gpu_kit run" + (f" -- {cli}" if cli else "")
        carry = f", carry={json.dumps(['.gpukit/' + p for p in pieces])}" if pieces else ""
        print(f"run(command={json.dumps(cmd)}{carry}, timeout_s={timeout})")
    print("give_back()")


def find_python(version: str = IMAGE_PYTHON) -> str:
    """A Python `version` that runs: pythonX.Y on PATH, else one of pyenv's (whose shim may refuse) -> its path."""
    found = [shutil.which(f"python{version}")]
    found += sorted(map(str, Path("~/.pyenv/versions").expanduser().glob(f"{version}.*/bin/python{version}")))
    for py in filter(None, found):
        if subprocess.run([py, "--version"], capture_output=True).returncode == 0:
            return py
    raise SystemExit(f"no Python {version} here (the image's): install one, or name it with --python")


def image_venv(venv: Path, python: str) -> Path:
    """`venv` with the image's packages (made once: a marker file says it is complete) -> its python3."""
    py, done = venv / "bin" / "python3", venv / ".image-packages"
    if done.is_file() and done.read_text().split() == IMAGE_PINS:
        return py
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    others = sorted(gpu_kit.ON_IMAGE - {p.split("==")[0] for p in IMAGE_PINS})
    subprocess.run([str(py), "-m", "pip", "install", "-q", *IMAGE_PINS, *others, "wheel"], check=True)
    done.write_text(" ".join(IMAGE_PINS))
    return py


def checkout_copy(dest: Path) -> None:
    """The checkout's tracked files at `dest`, as the device tool copies them (ignored files stay behind)."""
    for n in gpu_kit.tracked_files():
        (dest / n).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(n, dest / n)


def call(there: Path, py: Path, kit: Path, pieces, cli: str | None, timeout: float) -> tuple[int, float, Path]:
    """One device call: `pieces` carried to `there`/.gpukit, then gpu_kit's run there -> (exit status, seconds,
    its $OUT)."""
    shutil.rmtree(there / ".gpukit", ignore_errors=True)
    for p in pieces:
        shutil.copytree(kit / p, there / ".gpukit" / p)
    out = Path(tempfile.mkdtemp(prefix="out-", dir=there.parent))
    cmd = [str(py), "-m", "benchmarks.gpu_kit", "run"]
    if cli:
        cmd += ["--", *cli.replace("$OUT", str(out)).split()]
    env = dict(os.environ, PATH=f"{py.parent}{os.pathsep}{os.environ['PATH']}", OUT=str(out))
    env["GPUKIT_DIR"] = str(there.parent / "gpukit")
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "SPEECHRT_CACHE"):  # nothing of this environment
        env.pop(key, None)
    print(f"\n== carry {', '.join(pieces) or 'nothing'}: {' '.join(cmd[1:])}", flush=True)
    t = time.perf_counter()
    try:
        rc = subprocess.run(cmd, cwd=there, env=env, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    return rc, time.perf_counter() - t, out


def checks_of(path: Path) -> dict[str, str]:
    """A `bench gpu` result file's checks -> {name: status}."""
    return {c["name"]: c["status"] for c in json.loads(path.read_text()).get("checks", [])}


def rehearse(args) -> list[str]:
    """The plan, then ON_CPU -> what went wrong (nothing: the calls can be made as planned)."""
    kit = Path(args.kit)
    if not (kit / "kit0" / gpu_kit.MANIFEST).is_file():
        gpu_kit.main(["build", "--dir", str(kit)])
    py = image_venv(Path(args.venv), args.python or find_python())
    plan = PLANS[args.plan]
    built, carried = {p.name for p in kit.glob("kit*")}, {p for pieces, _, _ in plan for p in pieces}
    problems = [f"the plan carries {sorted(carried)}, the build made {sorted(built)}"] if built != carried else []
    with tempfile.TemporaryDirectory(prefix="gpu-rehearsal-") as tmp:
        there = Path(tmp) / "checkout"
        checkout_copy(there)
        for pieces, cli, timeout in (*plan, ((), ON_CPU, 900)):
            rc, took, out = call(there, py, kit, pieces, cli, timeout)
            print(f"== exit {rc} after {took:.0f} s (planned within {timeout} s)", flush=True)
            if rc or took > timeout:
                problems.append(f"{cli or 'run'} with {pieces}: exit {rc} after {took:.0f} s")
            if cli == ON_CPU and (out / "cpu.json").is_file():
                ran = checks_of(out / "cpu.json")
                problems += [f"{name} on the CPU: {status}" for name, status in ran.items() if status != "pass"]
            elif cli and not list(out.glob("*.json")):
                problems.append(f"{cli}: no result file")
            if cli and not (out / gpu_kit.LOG).is_file():
                problems.append(f"{cli}: no {gpu_kit.LOG} in $OUT")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_rehearsal", description=__doc__.split("\n\n")[0])
    p.add_argument("--plan", choices=sorted(PLANS), default="checks", help="which session (default: %(default)s)")
    p.add_argument("--print-plan", action="store_true", help="print the GPU session's device calls and stop")
    p.add_argument("--kit", default=str(gpu_kit.KIT), help="the pieces (built there if missing; default .gpukit)")
    p.add_argument("--venv", default="/tmp/gpu-image-venv", help="the image's packages (made once; ~5 GB)")
    p.add_argument("--python", help=f"a Python {IMAGE_PYTHON}, as the image's (default: found on PATH or pyenv's)")
    args = p.parse_args(argv)
    if args.print_plan:
        print_plan(PLANS[args.plan])
        return 0
    problems = rehearse(args)
    print("\n" + ("rehearsal: every call as planned" if not problems else "rehearsal: " + "; ".join(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
