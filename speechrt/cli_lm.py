"""`speechrt chat ["prompt"]`: stream a language model's reply to the terminal.

With a prompt: one reply, then exit. Without one: an interactive conversation (the history is kept and
re-rendered through the model's chat template each turn); /reset clears it, /quit or Ctrl-D ends.
"""

from __future__ import annotations

import sys


def add_arguments(p):
    p.add_argument("prompt", nargs="?", help="the user message; omit for an interactive chat")
    p.add_argument("--system", default=None, help="system prompt (default: the chat template's own, if any)")
    p.add_argument("--max-tokens", type=int, default=512, help="most tokens per reply (default 512)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 = greedy (default 0)")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off) (default: %(default)s)")
    p.add_argument(
        "--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats (1 = off) (default: %(default)s)"
    )
    p.add_argument(
        "--frequency-penalty",
        type=float,
        default=0.0,
        help="OpenAI's, in [-2, 2]: minus this times each token's count in the reply so far (0 = off)",
    )
    p.add_argument(
        "--presence-penalty",
        type=float,
        default=0.0,
        help="OpenAI's, in [-2, 2]: minus this from each token the reply has used (0 = off)",
    )
    p.add_argument("--seed", type=int, default=None, help="sampling seed")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument(
        "--model",
        default=None,
        help="registry name, .gguf file, Hugging Face directory, or Hub id owner/name[:file.gguf] "
        "(default: smollm2-135m-instruct)",
    )
    p.add_argument(
        "--backend",
        default="auto",
        help="torch, triton, onnxruntime, tensorrt or auto (default: auto, the backend and "
        "precision measured fastest on this kind of machine, see backends/auto.py; torch where none was measured)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu)")
    p.add_argument(
        "--dtype",
        default=None,
        help="int4, int8, fp8, bfloat16, float16, float32 (default: the precision --backend auto "
        "chose; on another backend, on the CPU int4 for files with 4-bit blocks, else int8; bf16/fp16 on GPUs)",
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")


def _options(args) -> dict:
    from speechrt.pipelines.generation import GenerationOptions

    o = dict(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        stop=tuple(args.stop),
        frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty,
    )
    GenerationOptions(**o)  # validate before loading the model
    return o


def _stream(pieces, out) -> str:
    text = []
    for piece in pieces:
        out.write(piece)
        out.flush()
        text.append(piece)
    out.write("\n")
    out.flush()
    return "".join(text)


def run(args):
    import torch

    from speechrt.errors import UserError
    from speechrt.pipelines.lm import load_lm

    opts = _options(args)
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    if args.prompt is not None and not args.prompt.strip():
        raise UserError("the prompt is empty; give a message, or no prompt for an interactive chat")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    lm = load_lm(args.model, backend=args.backend, device=args.device, dtype=args.dtype)
    out = sys.stdout
    if args.prompt is not None:
        _stream(lm.chat(args.prompt, system=args.system, **opts), out)
        return 0
    history: list[dict] = []
    interactive = sys.stdin.isatty()
    if interactive:
        print(f"chatting with {lm.info}; /reset, /quit or Ctrl-D", file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        line = line.strip()
        if not line:
            continue
        if line in ("/quit", "/exit"):
            break
        if line == "/reset":
            history.clear()
            continue
        history.append({"role": "user", "content": line})
        reply = _stream(lm.chat(history, system=args.system, **opts), out)
        history.append({"role": "assistant", "content": reply})
    return 0
