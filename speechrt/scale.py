"""`speechrt.scale:app`: the Ray Serve application of speechrt (streaming/scale.py), for `serve run
speechrt.scale:app` and Serve config files (docs/scale-out.md). Importing it imports ray."""

from speechrt.streaming.scale import (
    app,  # noqa: F401
)
