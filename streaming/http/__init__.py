"""The server's HTTP side: the ASGI app (app.py: the Realtime WebSocket, /healthz, the demo page), the OpenAI REST
endpoints (rest.py and the endpoint modules), and the /metrics page (metrics.py)."""
