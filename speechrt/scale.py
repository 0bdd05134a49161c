"""`speechrt.scale:app`: the Ray Serve application of speechrt (streaming/scale.py), for `serve run
speechrt.scale:app` and Serve config files (docs/scale-out.md), whose `args` are `speechrt serve` flags.
Importing it imports ray."""

from __future__ import annotations

from speechrt.errors import UserError
from speechrt.streaming.config import ServerConfig
from speechrt.streaming.scale import ScaleOptions, application


def config_from(flags: dict | None) -> tuple[ServerConfig, ScaleOptions]:
    """`speechrt serve` flags given as a dict (a Serve config's `args`: {"transcription-only": true,
    "replicas": 2, ...}; `_` and `-` alike) -> (the server's configuration, the scale options)."""
    from speechrt import cli_serve
    from speechrt.cli import build_parser

    argv = ["serve", "--ray"]
    for k, v in (flags or {}).items():
        flag = "--" + str(k).replace("_", "-")
        if v is True:
            argv.append(flag)
        elif v not in (False, None):
            argv += [flag, str(v)]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        raise UserError(
            f"bad speechrt arguments {flags!r}: the keys are `speechrt serve` flags "
            "(see `speechrt serve --help`), e.g. {'transcription-only': true, 'replicas': 2}"
        ) from None
    return cli_serve.server_config(args), cli_serve.scale_options(args)


def app(args: dict | None = None):
    """Ray Serve application builder (`serve run speechrt.scale:app transcription-only=true replicas=2`,
    or import_path: speechrt.scale:app with `args:` in a Serve config file)."""
    return application(*config_from(args))
