"""Hugging Face Hub ids -> the local folder or file of that model, through `huggingface_hub` and its cache.

    openai/whisper-large-v3-turbo                 a repository: its snapshot, only the files a model needs
    Qwen/Qwen2.5-0.5B-Instruct-GGUF:qwen2.5-0.5b-instruct-q4_k_m.gguf   one file of a repository

huggingface_hub's own cache (HF_HUB_CACHE / HF_HOME), offline mode (HF_HUB_OFFLINE=1: the cache only) and token
(HF_TOKEN, `hf auth login`) apply as they do for transformers. A model that cannot be had is one line saying why and
how to get it into the cache.
"""

from __future__ import annotations

import re
from pathlib import Path


class HubError(Exception):
    """A Hub id that gave no model; the message says why and what to do (the registry raises it as a ModelError)."""


# owner/name (the Hub's characters), optionally :file inside the repository
HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})(?::(?P<file>[^:]+))?$")

# what each family's loaders read from a repository: config, tokenizer and weights (not a repository's other copies
# of them: openai/whisper-large-v3's float32 shards, Mistral's consolidated.safetensors, GGUF files, ONNX exports)
_COMMON = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
PATTERNS = {
    "asr": _COMMON
    + ["preprocessor_config.json", "vocabulary.json", "vocabulary.txt", "model.bin"]
    + ["model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors"],
    "lm": _COMMON
    + ["special_tokens_map.json", "chat_template.jinja", "chat_template.json"]
    + ["model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors"],
}
# what `hf download --include` is told to fetch for them: the same files, in fewer words
SUGGEST = {
    "asr": ["*.json", "vocabulary.*", "model.bin", "model.safetensors", "model-*.safetensors"],
    "lm": ["*.json", "*.jinja", "model.safetensors", "model-*.safetensors"],
}
# a file of a repository that needs another beside it (a Piper voice's .onnx its .onnx.json)
COMPANIONS = {".onnx": ".onnx.json"}


# a name ending so is a file's path (mistyped, or not there yet), not a repository
FILE_SUFFIXES = (".gguf", ".onnx", ".pt", ".bin", ".safetensors", ".json")


def is_hub_id(name: str) -> bool:
    """Whether `name` is written as a Hub id (owner/name or owner/name:file); not whether it exists."""
    m = HUB_ID.match(name)
    return m is not None and not name.startswith((".", "~")) and (m["file"] or not name.endswith(FILE_SUFFIXES))


def cache_dir() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def fetch(name: str, family: str) -> Path:
    """The local path of Hub id `name` for a `family` model: a repository's snapshot folder holding the files
    that family's loaders read, or one file (`owner/name:file`); from the cache, downloaded into it when missing."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise HubError(
            f"{name!r} is a Hugging Face Hub id; loading models from the Hub needs huggingface_hub "
            "(pip install huggingface_hub)"
        ) from None
    m = HUB_ID.match(name)
    repo, file = m["repo"], m["file"]
    if family not in PATTERNS and file is None:
        raise HubError(f"{name!r}: name the {family} model's file in the repository: {repo}:<file>")
    try:
        return _download(repo, file, family)
    except HubError:
        raise
    except Exception as e:  # huggingface_hub's errors, network errors
        raise HubError(_explain(repo, file, family, e)) from None


def _download(repo: str, file: str | None, family: str) -> Path:
    """snapshot_download for a file too (allow_patterns: it and its companion): one request that fails at once on
    an unreachable Hub, where hf_hub_download retries with backoff for half a minute."""
    from huggingface_hub import constants, snapshot_download

    if file is None:
        wanted = PATTERNS[family]
    else:
        wanted = [file] + [file[: -len(s)] + c for s, c in COMPANIONS.items() if file.endswith(s)]
    path = Path(snapshot_download(repo, allow_patterns=wanted))
    if file is not None:
        missing = [w for w in wanted if not (path / w).is_file()]
        if missing and constants.HF_HUB_OFFLINE:
            raise HubError(_not_cached(f"{repo}:{file}", f"hf download {repo} {' '.join(wanted)}"))
        if missing:
            raise HubError(
                f"{repo}: the repository has no file {missing[0]!r} (or the Hub could not be reached and its "
                f"snapshot in the cache {cache_dir()} lacks it: `hf download {repo} {' '.join(wanted)}`)"
            )
        return path / file
    if not any(path.glob("*.safetensors")) and not (path / "model.bin").exists():
        ggufs = f"; for a GGUF repository name the file: {repo}:<file>.gguf" if family == "lm" else ""
        raise HubError(
            f"{repo}: the repository holds no model weights speechrt reads (config.json with model.safetensors, "
            f"or a CTranslate2 model.bin){ggufs}"
        )
    return path


def _how(get: str) -> str:
    return (
        f"download it where the Hub is reachable (`{get}`), into the cache {cache_dir()}, or copy that cache here "
        "(HF_HUB_CACHE), or give a local path"
    )


def _not_cached(what: str, get: str) -> str:
    return f"{what} is not in the Hugging Face cache {cache_dir()} and HF_HUB_OFFLINE=1 is set: {_how(get)}"


def _explain(repo: str, file: str | None, family: str, e: Exception) -> str:
    """One line for a model the Hub did not give: what happened and what to do."""
    from huggingface_hub import constants
    from huggingface_hub import errors as hfe

    what = f"{repo}:{file}" if file else repo
    get = f"hf download {repo} " + (file or " ".join(f"--include '{p}'" for p in SUGGEST[family]))
    if isinstance(e, hfe.GatedRepoError):
        return (
            f"{what}: the repository is gated: accept its terms on huggingface.co and log in "
            "(`hf auth login`, or set HF_TOKEN)"
        )
    if isinstance(e, hfe.RepositoryNotFoundError):
        return (
            f"{what}: no such model repository on the Hugging Face Hub (if it is private, log in with "
            "`hf auth login` or set HF_TOKEN)"
        )
    if isinstance(e, hfe.RevisionNotFoundError):
        return f"{what}: the repository has no such revision"
    if isinstance(e, getattr(hfe, "IncompleteSnapshotError", ())):  # huggingface_hub 1.x+
        return f"{what}: its snapshot in the Hugging Face cache {cache_dir()} is incomplete: `{get}` completes it"
    if constants.HF_HUB_OFFLINE:
        return _not_cached(what, get)
    cause = e.__cause__ or e
    return (
        f"{what}: the Hugging Face Hub cannot be reached ({type(cause).__name__}) and the model is not in its cache "
        f"{cache_dir()}: {_how(get)}; then set HF_HUB_OFFLINE=1 to use the cache without asking the Hub"
    )
