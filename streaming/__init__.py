"""The server: the engine (engine/), the Realtime side (protocol, sessions, turns, VAD), the HTTP side (http/), its
configuration (config.py), the server that runs them (server.py) and its Ray Serve deployment (scale.py)."""
