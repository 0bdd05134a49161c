"""WebSocket streaming server, realtime protocol, sessions, scheduler, VAD, SDK client."""
