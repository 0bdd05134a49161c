"""The Realtime side of the server: one RealtimeSession per WebSocket speaking the OpenAI Realtime API — its
protocol (protocol, events, config, response_options), input audio and turn taking (audio_codec, vad,
audio_buffer, turns, turn, turn_transcripts, agreement, long_turn, items, extras) under one TurnPolicy (policy),
its conversation and the speech-to-speech agent (conversation, agent, reply). It uses the engine below it and
never the HTTP side above it."""
