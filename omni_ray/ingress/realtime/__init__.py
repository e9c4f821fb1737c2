"""``WS /v1/realtime``: OpenAI's Realtime protocol (speech to speech, server VAD, barge-in) over
the same pipeline as the chat API. protocol.py: events; vad.py: turn detection; conversation.py:
items and the input buffer; session.py: one socket's state and its responses; endpoint.py: the
socket's wiring to the ingress (keys, per-key slots, idle timeout)."""
