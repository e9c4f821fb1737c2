"""OpenAI-compatible HTTP ingress: API models, routes, SSE framing, error mapping."""
