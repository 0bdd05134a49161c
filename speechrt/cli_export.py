"""`speechrt export {asr,lm,tts}`: a model's runner graphs as ONNX, with manifest.json (see speechrt.export)."""

from __future__ import annotations

from speechrt.cli_paths import output_dir


def add_arguments(p):
    p.add_argument("family", choices=["asr", "lm", "tts"], help="model family")
    p.add_argument(
        "--model",
        default=None,
        help="registry name, path or Hugging Face Hub id (default: the family's embedded model)",
    )
    p.add_argument("--out", required=True, type=output_dir("--out", empty=True), help="output directory (new or empty)")
    p.add_argument(
        "--precision",
        default=None,
        choices=["fp32", "fp16", "int8", "int4"],
        help="asr: fp32 (default), int8, fp16; lm: int4 (default; a GGUF's 4-bit blocks kept exactly), "
        "int8, fp32, fp16; tts: fp32",
    )
    p.add_argument(
        "--variant",
        default="ort",
        choices=["ort", "standard"],
        help="lm only: ort (ONNX Runtime contrib ops, the fast path; default) or standard (plain ONNX ops, "
        "for TensorRT)",
    )
    p.add_argument(
        "--activations",
        default=None,
        choices=["float32", "float16"],
        help="lm int4 / int8 only: the activations' and cache's type (default float32; float16 is what "
        "GPU execution providers run: their GroupQueryAttention has no float32 kernel)",
    )
    p.add_argument("--opset", type=int, default=17, help="ONNX opset (default 17)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args):
    from speechrt.export import export_model

    m = export_model(
        args.family,
        args.model,
        args.out,
        args.precision,
        args.opset,
        args.variant,
        progress=not args.no_progress,
        activations=args.activations,
    )
    print(
        f"{args.out}: {m.family} {m.model}, {m.precision} ({m.variant}), graphs: {', '.join(m.graphs)}; "
        f"{m.extra.get('export_seconds')} s"
    )
    print(f"weights: {m.weights}")
    return 0
