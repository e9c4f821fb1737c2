"""What a request may cost, checked from the parsed body before any work (no decoding, no
tokenizing): message and content-part counts and the prompt's characters.

The character bound follows ``limits.max_prompt_tokens``: ``limits.max_prompt_chars`` (tokens x
``limits.max_prompt_chars_per_token``), so a 30 MB prompt is a 400 in milliseconds instead of a
minute of tokenizing. Media sizes, sample rates and pixels are checked per part, also before
decoding (``ingress/media.py``, ``inputs/audio.py``, ``inputs/image.py``).
"""

from __future__ import annotations

from omni_ray.config.serving import LimitsConfig
from omni_ray.ingress.api_models import ChatCompletionRequest, TextPart
from omni_ray.ingress.errors import bad_request


def check_request_cost(body: ChatCompletionRequest, lim: LimitsConfig) -> None:
    """A 400 naming the field and the limit when the body asks for more than ``lim`` allows."""
    if len(body.messages) > lim.max_messages:
        raise bad_request(f"messages: at most limits.max_messages={lim.max_messages} allowed",
                          "messages")
    parts = sum(len(m.content) for m in body.messages if isinstance(m.content, list))
    if parts > lim.max_content_parts:
        raise bad_request(f"messages: {parts} content parts, over limits.max_content_parts="
                          f"{lim.max_content_parts}", "messages", code="too_many_content_parts")
    chars = sum(_chars(m.content) for m in body.messages)
    if chars > lim.max_prompt_chars:
        raise bad_request(f"messages: the prompt has {chars} characters, over limits."
                          f"max_prompt_chars={lim.max_prompt_chars} (limits.max_prompt_tokens="
                          f"{lim.max_prompt_tokens} x limits.max_prompt_chars_per_token="
                          f"{lim.max_prompt_chars_per_token})", "messages",
                          code="context_length_exceeded")


def _chars(content) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    return sum(len(p.text) for p in content if isinstance(p, TextPart))
