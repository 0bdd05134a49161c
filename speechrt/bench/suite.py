"""`speechrt bench all`: every family's benchmark (asr, lm, tts, the server load sweep, kernels) on every
backend and precision available on this machine, as one run with one result file.

Each step is one `speechrt bench FAMILY ... --json` in its own process (torch and llama.cpp keep thread
pools that would steal each other's cores, and a failing step must not end the run), its output in the
log file. A step that cannot run here (the triton backend without a GPU, a precision the device lacks)
becomes a skip with its error message. Peers (faster-whisper, llama.cpp/transformers, Piper, WhisperLive)
run in the first step of their family; the rows of later steps are compared with them, measured in the
same run on the same input.

--quick (a few minutes on a 2-core CPU) times each model family once, on the backend and precision `speechrt serve`
runs here (`serves`: ModelConfig.runs, which `--backend auto` resolves through), with the short recording, few
tokens and repeats and low stream counts; the full mode every backend and precision, the 58-second passage, batch
sizes 1 to 8, the 1..32 stream sweep and torch.compile.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from speechrt.bench.fingerprint import usable_cores
from speechrt.bench.record import FAMILIES, Results, load
from speechrt.cli_paths import output_file

SUITE_FAMILIES = tuple(f for f in FAMILIES if f != "gpu")
DATA = Path(__file__).resolve().parent.parent / "data"


def add_arguments(p):
    p.add_argument("--quick", action="store_true", help="the short version (a few minutes on a 2-core CPU)")
    p.add_argument(
        "--families", default=",".join(SUITE_FAMILIES), help="comma list of families to run (default: %(default)s)"
    )
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto (default: cuda when a GPU is visible)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for every engine (default: all cores)")
    p.add_argument(
        "--json",
        default="speechrt-bench.json",
        type=output_file("--json", "speechrt-bench.json"),
        help="result file (default: %(default)s)",
    )
    p.add_argument(
        "--log",
        default=None,
        type=output_file("--log", "speechrt-bench.log"),
        help="the steps' output (default: the result file with .log)",
    )
    p.add_argument("--machine", default=None, help="name of this machine in reports (default: its GPU or CPU)")
    p.add_argument(
        "--note",
        action="append",
        default=[],
        help="a note kept with the results and shown in reports (repeatable), e.g. what else ran on the machine",
    )


# the arguments that leave a family's peers out (they already ran in an earlier step of this run)
NO_PEERS = {
    "asr": ("--peers", "none"),
    "lm": ("--peers", ""),
    "tts": ("--no-peer",),
    "server": ("--peer", "none"),
    "kernels": (),
}


@dataclass(frozen=True)
class Step:
    family: str
    what: str  # the backend / precision it covers, for the progress line and skips
    args: tuple[str, ...]  # after `speechrt bench FAMILY`
    estimate_s: float  # expected seconds on a 2-core CPU (the ETA's starting point)


def _precisions(family: str, device: str) -> list[str]:
    """The precisions the full run times a family in on `device`; 'auto' is each backend's own choice here."""
    from speechrt.backends.threads import cpu_has_native_bf16

    if family == "asr":
        return ["float16", "bfloat16", "float32"] if device == "cuda" else ["float32", "auto"]
    if device == "cuda":
        return ["bfloat16", "float16", "int8", "int4"]
    return ["int4", "int8", "float32"] + (["bfloat16"] if cpu_has_native_bf16() else [])


def serves(family: str, device: str) -> tuple[str, str]:
    """(backend, precision) `speechrt serve --device DEVICE` runs a family's model on here (ModelConfig.runs, with
    serve's defaults: `--backend auto`); 'auto' where the backend keeps its own default precision."""
    from speechrt.streaming.config import ModelConfig

    backend, dtype = ModelConfig(device=device).runs(family)
    return backend, dtype or "auto"


def _what(backend: str, dtype: str) -> str:
    return f"{backend} {'default precision' if dtype == 'auto' else dtype} (as serve runs it)"


def _quick_steps(family: str, device: str, t: list[str]) -> list[Step] | None:
    """--quick: one step per model family, on the backend and precision `serve` runs here (`serves`)."""
    if family not in ("asr", "lm", "tts"):
        return None
    b, dt = serves(family, device)
    what = _what(b, dt)
    if family == "asr":
        audio = ["--audio", str(DATA / "sample.wav"), "--reference", str(DATA / "sample.txt")]
        return [
            Step("asr", what, ("--backend", b, "--device", device, "--dtypes", dt, "--repeats", "2", *audio, *t), 30)
        ]
    if family == "lm":  # llama.cpp the peer: transformers' GGUF load alone takes ~40 s on 2 cores
        size = ["--tokens", "16", "--batch", "1,4", "--repeats", "2", "--peers", "llama.cpp"]
        return [Step("lm", what, ("--backends", b, "--device", device, "--dtype", dt, *size, *t), 45)]
    return [Step("tts", what, ("--backends", b, "--device", device, "--repeats", "2", *t), 20)]


def _family_steps(family: str, device: str, quick: bool, t: list[str]) -> list[Step]:
    from speechrt import backends

    if quick and (steps := _quick_steps(family, device, t)) is not None:
        return steps
    if family == "asr":
        return [
            Step(
                "asr",
                b,
                (
                    "--backend",
                    b,
                    "--device",
                    device,
                    "--dtypes",
                    ",".join(_precisions("asr", device)),
                    "--repeats",
                    "3",
                    *t,
                ),
                75,
            )
            for b in backends.available("asr")
        ]
    if family == "lm":
        size = ["--tokens", "64", "--batch", "1,2,4,8", "--repeats", "3"]
        return [
            Step("lm", f"{b} {dt}", ("--backends", b, "--device", device, "--dtype", dt, *size, *t), 120)
            for b in backends.available("lm")
            for dt in _precisions("lm", device)
        ]
    if family == "tts":
        return [
            Step(
                "tts",
                b,
                ("--backends", b, "--device", device, "--repeats", "5", *t),
                45,
            )
            for b in backends.available("tts")
        ]
    if family == "server":
        dev = ("--device", device, *t)
        if quick:
            return [
                Step(
                    "server",
                    "transcription 1,2 streams",
                    ("--mode", "transcription", "--streams", "1,2", "--utterances", "1", *dev),
                    120,
                ),
                Step(
                    "server",
                    "conversation 1 stream",
                    ("--mode", "conversation", "--streams", "1", "--utterances", "2", *dev),
                    45,
                ),
            ]
        return [
            Step(
                "server",
                "transcription 1..32 streams",
                ("--mode", "transcription", "--streams", "1,2,4,8,16,32", *dev),
                300,
            ),
            Step("server", "conversation 1..4 streams", ("--mode", "conversation", "--streams", "1,2,4", *dev), 200),
        ]
    if family == "kernels":
        if device == "cpu":
            return [Step("kernels", "reference on the CPU", ("--device", "cpu", *t), 25)]
        return [Step("kernels", "triton on the GPU", ("--no-compile",) if quick else (), 30 if quick else 90)]
    from speechrt.errors import UserError

    raise UserError(f"unknown family {family!r}; valid: {', '.join(SUITE_FAMILIES)}")


def plan(families: list[str], device: str, quick: bool, threads: int | None) -> list[Step]:
    """The steps for these families on this machine: one per backend the registry says runs the family
    here (backends.available), and per precision where the family's bench times one at a time."""
    t = ["--threads", str(threads)] if threads else []
    return [s for f in families for s in _family_steps(f, device, quick, t)]


class Progress:
    """One line on stderr: a bar, the step, elapsed time and the estimated time left. The estimate is the
    steps' expected times, scaled by how fast the finished steps ran against theirs."""

    def __init__(self, steps: list[Step], stream=sys.stderr):
        self.steps, self.stream, self.t0 = steps, stream, time.monotonic()
        self.done_estimate = self.done_actual = 0.0
        self.tty = stream.isatty()

    def eta(self, i: int) -> float:
        """Seconds left before step i starts running (steps i.. remain)."""
        scale = self.done_actual / self.done_estimate if self.done_estimate else 1.0
        return scale * sum(s.estimate_s for s in self.steps[i:])

    def show(self, i: int, status: str = "") -> None:
        n = len(self.steps)
        width = 24
        filled = width * i // n
        step = self.steps[i] if i < n else None
        what = f"{step.family} {step.what}" if step else "done"
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {i}/{n} {what[:44]:44} "
            f"{_mmss(time.monotonic() - self.t0)} elapsed, ~{_mmss(self.eta(i))} left {status}"
        )
        self.stream.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        self.stream.flush()

    def finished(self, i: int, seconds: float) -> None:
        self.done_estimate += self.steps[i].estimate_s
        self.done_actual += seconds


def _mmss(s: float) -> str:
    return f"{int(s) // 60}:{int(s) % 60:02d}"


def _run_step(step: Step, out_json: Path, log) -> tuple[int, str]:
    """-> (exit code, the error's last line when it failed)"""
    cmd = [sys.executable, "-m", "speechrt", "bench", step.family, *step.args, "--json", str(out_json)]
    log.write(f"\n$ {' '.join(cmd)}\n")
    log.flush()
    with tempfile.TemporaryFile("w+") as err:
        rc = subprocess.run(cmd, stdout=log, stderr=err, text=True).returncode
        err.seek(0)
        text = err.read()
    log.write(text)
    log.flush()
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return rc, (lines[-1].removeprefix("speechrt bench: error: ") if lines else f"exit code {rc}")


def link_peers(results: Results) -> None:
    """Our rows measured without a peer in their own step get the peer of their family measured in this
    run: the same workload and metric, the same precision if there is one."""
    peers = [r for r in results.records if r.engine not in ("speechrt", "probe", "torch.compile")]
    for i, r in enumerate(results.records):
        if r.engine != "speechrt" or r.peer:
            continue
        cands = [p for p in peers if p.family == r.family and p.workload == r.workload and p.metric == r.metric]
        best = next((p for p in cands if p.precision == r.precision), cands[0] if cands else None)
        if best is not None:
            results.records[i] = dataclasses.replace(r, peer=best.label)


def run(args):
    import torch

    from speechrt.bench.fingerprint import fingerprint
    from speechrt.errors import UserError

    families = [f.strip() for f in args.families.split(",") if f.strip()]
    bad = [f for f in families if f not in SUITE_FAMILIES]
    if bad or not families:
        raise UserError(
            f"unknown famil{'ies' if len(bad) > 1 else 'y'} {', '.join(bad) or '(none)'}; "
            f"valid: {', '.join(SUITE_FAMILIES)}"
        )
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu, cuda or auto, got {args.device!r}")
    out_path = Path(args.json)
    log_path = Path(args.log) if args.log else out_path.with_suffix(".log")
    steps = plan(families, device, args.quick, args.threads)
    machine = fingerprint(args.machine)
    mode = "quick" if args.quick else "full"
    print(
        f"speechrt bench all ({mode}) on {machine['label']}, device {device}: {len(steps)} steps, "
        f"about {_mmss(sum(s.estimate_s for s in steps))} expected; output in {log_path}",
        flush=True,
    )
    merged = Results(notes=list(args.note))
    load_before = os.getloadavg()[0]
    progress = Progress(steps)
    peers_done: set[str] = set()
    with open(log_path, "w") as log, tempfile.TemporaryDirectory(prefix="speechrt-bench-") as tmp:
        for i, step in enumerate(steps):
            progress.show(i)
            t0 = time.monotonic()
            step_json = Path(tmp) / f"step{i}.json"
            if step.family in peers_done:  # its peers ran in an earlier step of this run
                step = dataclasses.replace(step, args=step.args + NO_PEERS[step.family])
            rc, err = _run_step(step, step_json, log)
            progress.finished(i, time.monotonic() - t0)
            if rc == 0 and step_json.exists():
                peers_done.add(step.family)
                merged.extend(load(step_json))
                merged.notes.append(f"{step.family} {step.what}: {time.monotonic() - t0:.0f} s")
            else:
                merged.skip(step.family, step.what, err if rc == 2 else f"failed (exit code {rc}): {err}")
        progress.show(len(steps))
    if progress.tty:
        sys.stderr.write("\n")
    link_peers(merged)
    merged.notes.insert(
        len(args.note),
        f"bench all --{mode} on {device}: {_mmss(time.monotonic() - progress.t0)} in all; "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after (on "
        f"{usable_cores()} cores; above 0 is other work sharing the CPU)",
    )
    merged.notes = list(dict.fromkeys(merged.notes))  # steps of one family repeat their settings line
    merged.write(out_path, machine=machine)
    print(f"{len(merged.records)} measurements, {len(merged.skipped)} skipped -> {out_path}")
    for s in merged.skipped:
        print(f"  skipped {s.family} {s.what}: {s.reason}")
    return 0
