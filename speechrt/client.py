"""The Python SDK for a speechrt server (see speechrt.streaming.client)."""

from speechrt.streaming.client import *  # noqa: F401,F403
from speechrt.streaming.client import __all__  # noqa: F401
