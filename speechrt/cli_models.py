"""`speechrt models`: the registered models and whether their packages are installed."""


def add_arguments(p):
    p.add_argument("--family", choices=["asr", "lm", "tts", "vad"], help="list one family's models only (default: all)")


def run(args):
    from speechrt.models import registry

    for name, e in registry.MODELS.items():
        if args.family and e.family != args.family:
            continue
        try:
            path = registry.resolve(name, e.family).path
            where = str(path)
            if e.parts:  # a model.bin split across packages: where its other pieces are
                where += "".join(f"\n     + {p}" for p in registry.ct2_weight_files(path)[1:])
        except registry.ModelError:
            where = f"not installed ({e.install or 'pip install ' + e.package})"
        default = " (default)" if registry.DEFAULTS[e.family] == name else ""
        print(f"{e.family:4} {name:24} {e.description}{default}\n     {where}")
    return 0
