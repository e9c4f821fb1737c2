"""A chat completion's or speech request's body -> the ``OmniRequest`` the stages run.

Every route that starts an answer (``/v1/chat/completions``, ``/v1/audio/speech``,
``/v1/audio/transcriptions``, ``WS /v1/realtime``, the handle methods, the warm-up) builds it
here, so each gets the same checks: the model's name, the request's cost before any decoding,
voices, messages and their media (read, then decoded in a worker thread), the prompt against
``limits`` and the model's length, and the sampling defaults with the body's overrides. A refusal
is a 4xx ``APIError`` naming the field (omni_ray/ingress/errors.py; docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

from omni_ray.audio_formats import STREAM_AUDIO_FORMATS
from omni_ray.config.request import OmniRequest
from omni_ray.config.sampling import SamplingParams
from omni_ray.config.serving import OmniServingArgs
from omni_ray.ingress import media
from omni_ray.ingress.api_models import ChatCompletionRequest, InputAudioPart, TextPart
from omni_ray.ingress.audio_store import TranscriptStore
from omni_ray.ingress.errors import APIError, bad_request
from omni_ray.ingress.input_limits import check_request_cost
from omni_ray.ingress.speech import SpeechRequest
from omni_ray.inputs.processor import InputProcessor
from omni_ray.models.speakers import resolve_speaker

logger = logging.getLogger("ray.serve")


class RequestBuilder:
    """Builds a replica's requests from its args, tokenizer, input processor, the checkpoint's
    speakers and the spoken answers a later turn may name (``transcripts``)."""

    def __init__(self, args: OmniServingArgs, tokenizer, inputs: InputProcessor,
                 speakers: dict, transcripts: TranscriptStore):
        self.args, self.tokenizer, self.inputs = args, tokenizer, inputs
        self.speakers, self.transcripts = speakers, transcripts

    def check_model(self, model: str) -> None:
        if model != self.args.model_id:
            raise APIError(404, f"model {clip(model)!r} not found; this server serves "
                                f"{self.args.model_id!r}", param="model", type="invalid_request_error",
                           code="model_not_found")

    async def chat(self, body: ChatCompletionRequest) -> tuple[OmniRequest, str]:
        """A chat completion body's request and its answer's audio format: model, cost, voice,
        messages (media read and decoded), prompt and sampling, each checked against the
        limits; a 4xx ``APIError`` naming the field otherwise."""
        lim = self.args.limits
        self.check_model(body.model)
        check_request_cost(body, lim)  # before any decoding or tokenizing
        modalities = tuple(body.modalities or ["text"])
        if len(set(modalities)) != len(modalities):
            raise bad_request("modalities: duplicate entries", "modalities")
        voice = self.args.default_speaker if body.audio is None else body.audio.voice
        audio_format = answer_audio_format(body)
        try:
            speaker = resolve_speaker(voice, self.speakers)  # as the CLI: any case
        except ValueError as e:
            if "audio" in modalities:
                raise bad_request(f"audio.voice: {e}", "audio.voice") from None
            speaker = resolve_speaker(self.args.default_speaker, self.speakers)  # text only
        messages = [await self._message(i, m) for i, m in enumerate(body.messages)]
        if not any(m["role"] == "user" for m in messages):
            raise bad_request("messages: at least one user message is required", "messages")
        prompt_ids, mm = await asyncio.to_thread(self._prompt, messages)
        max_tokens = body.max_completion_tokens or body.max_tokens or lim.default_max_tokens
        if max_tokens > lim.max_tokens:
            raise bad_request(f"max_tokens: {max_tokens} is over limits.max_tokens={lim.max_tokens}",
                              "max_tokens")
        if len(prompt_ids) > lim.max_prompt_tokens:
            raise bad_request(f"messages: prompt has {len(prompt_ids)} tokens, over "
                              f"limits.max_prompt_tokens={lim.max_prompt_tokens}", "messages",
                              code="context_length_exceeded")
        if len(prompt_ids) + max_tokens > self.args.max_model_len:
            raise bad_request(f"messages: prompt ({len(prompt_ids)} tokens) + max_tokens "
                              f"({max_tokens}) exceeds the model's length {self.args.max_model_len}",
                              "messages", code="context_length_exceeded")
        frames = body.max_audio_frames or lim.default_max_audio_frames
        if frames > lim.max_audio_frames:
            raise bad_request(f"max_audio_frames: {frames} is over limits.max_audio_frames="
                              f"{lim.max_audio_frames}", "max_audio_frames")
        thinker = self.args.thinker.default_sampling or SamplingParams()
        over = {k: v for k, v in dict(temperature=body.temperature, top_p=body.top_p,
                                      seed=body.seed, ignore_eos=body.ignore_eos).items()
                if v is not None}
        if over:
            thinker = thinker.model_copy(update=over)
        talker = self.args.talker.default_sampling or SamplingParams()
        over = {k: v for k, v in dict(seed=None if talker.greedy else body.seed,
                                      ignore_eos=body.ignore_eos).items() if v is not None}
        if over:
            talker = talker.model_copy(update=over)
        req = OmniRequest(request_id=f"chatcmpl-{uuid.uuid4().hex}", prompt_token_ids=prompt_ids,
                          modalities=modalities, speaker=speaker, max_tokens=max_tokens,
                          max_audio_frames=frames, thinker_sampling=thinker, talker_sampling=talker,
                          mm=mm)
        if self.args.security.log_prompts:  # debug only: prompts stay out of logs by default
            logger.info("request %s prompt: %s", req.request_id, json.dumps(messages))
        return req, audio_format

    async def speech(self, body: SpeechRequest) -> OmniRequest:
        """``/v1/audio/speech``'s request: the prompt and the given answer of ``speech_ids``."""
        from omni_ray.models.tokenizer import speech_ids

        self.check_model(body.model)
        try:
            speaker = resolve_speaker(body.voice_name, self.speakers)
        except ValueError as e:
            param = "voice" if isinstance(body.voice, str) else "voice.id"
            raise bad_request(f"{param}: {e}", param) from None
        prompt, answer = await asyncio.to_thread(speech_ids, self.tokenizer, body.input)
        lim = self.args.limits
        if len(answer) > lim.max_tokens:
            raise bad_request(f"input: {len(answer)} tokens, over limits.max_tokens="
                              f"{lim.max_tokens}", "input", code="input_too_long")
        if len(prompt) + len(answer) > self.args.max_model_len:
            raise bad_request(f"input: {len(prompt) + len(answer)} tokens with its prompt, over "
                              f"the model's length {self.args.max_model_len}", "input",
                              code="context_length_exceeded")
        return OmniRequest(request_id=f"speech-{uuid.uuid4().hex}", prompt_token_ids=prompt,
                           answer_token_ids=answer, modalities=("text", "audio"),
                           speaker=speaker, max_tokens=len(answer),
                           max_audio_frames=body.frames(len(answer), lim.max_audio_frames),
                           talker_sampling=self.args.talker.default_sampling or SamplingParams())

    async def _message(self, i: int, m) -> dict:
        """One message as ``chat_prompt`` takes it; media parts carry their (checked, not yet
        decoded) bytes and the name of their field."""
        role = "system" if m.role == "developer" else m.role
        empty = m.content is None or m.content == "" or m.content == []
        if m.audio is not None:
            return {"role": role, "content": self._earlier_answer(i, m, empty)}
        if empty:
            raise bad_request(f"messages.{i}.content: must not be empty", f"messages.{i}.content")
        if isinstance(m.content, str):
            return {"role": role, "content": m.content}
        parts = []
        for j, part in enumerate(m.content):
            param = f"messages.{i}.content.{j}"
            if isinstance(part, TextPart):
                parts.append({"type": "text", "text": part.text})
                continue
            # Media limits and the remote-URL policy first, so their message wins.
            data = await media.read_part(part, param, self.args.limits, self.args.security)
            if role != "user":
                raise bad_request(f"{param}: audio and image parts are accepted in user messages "
                                  "only", f"{param}.type", code="unsupported_content")
            unsupported = self.media_unsupported()
            if unsupported:
                raise bad_request(f"{param}: content part type {part.type!r} is not supported by "
                                  f"this deployment ({unsupported})", f"{param}.type",
                                  code="unsupported_content")
            if isinstance(part, InputAudioPart):
                parts.append({"type": "audio", "data": data, "format": part.input_audio.format,
                              "param": param})
            else:
                parts.append({"type": "image", "data": data, "param": param})
        if all(p["type"] == "text" for p in parts):
            return {"role": role, "content": "".join(p["text"] for p in parts)}
        return {"role": role, "content": parts}

    def _earlier_answer(self, i: int, m, empty: bool) -> str:
        """The transcript of the spoken answer an assistant turn names by ``audio.id``."""
        param = f"messages.{i}.audio"
        if m.role != "assistant":
            raise bad_request(f"{param}: only assistant messages refer to an earlier spoken "
                              "answer", param)
        if not empty:
            raise bad_request(f"{param}: give the assistant turn's content or its audio.id, not "
                              "both", param)
        text = self.transcripts.get(m.audio.id)
        if text is None:
            raise bad_request(f"{param}.id: no spoken answer {clip(m.audio.id)!r} here: unknown, "
                              "expired (expires_at) or answered by another server replica",
                              f"{param}.id", code="invalid_audio_id")
        return text

    def media_unsupported(self) -> str | None:
        """Why this deployment cannot take audio / image input, or None."""
        if self.args.disaggregated:
            return "thinker prefill/decode disaggregation"
        if not self.inputs.supports_media:
            return "the checkpoint has no processor files"
        return None

    def _prompt(self, messages: list[dict]):
        """Decode the media parts and run the processor (in a worker thread): prompt token ids
        and the encoder inputs (None for text-only prompts)."""
        from omni_ray.inputs.audio import decode_audio
        from omni_ray.inputs.errors import InputError
        from omni_ray.inputs.image import decode_image

        lim = self.args.limits
        media_parts = [p for m in messages if not isinstance(m["content"], str)
                       for p in m["content"] if p["type"] != "text"]
        if len(media_parts) > lim.max_media_parts:
            raise bad_request(f"messages: {len(media_parts)} audio/image parts, over "
                              f"limits.max_media_parts={lim.max_media_parts}", "messages",
                              code="too_many_media_parts")
        for p in media_parts:
            try:
                if p["type"] == "audio":
                    p["audio"] = decode_audio(p["data"], p["format"],
                                              max_seconds=lim.max_audio_seconds)
                else:
                    p["image"] = decode_image(p["data"], max_pixels=lim.max_image_pixels)
            except InputError as e:
                raise bad_request(f"{p['param']}.{e.field}: {e.message}",
                                  f"{p['param']}.{e.field}", code=e.code) from None
        try:
            return self.inputs.build(messages, raw_media=self.args.thinker.backend == "vllm")
        except ValueError as e:  # the processor refused the media (e.g. an extreme aspect ratio)
            if not media_parts:
                raise
            raise bad_request(f"messages: cannot process the audio/image input: {e}", "messages",
                              code="invalid_media") from None


def answer_audio_format(body: ChatCompletionRequest) -> str:
    """The answer's ``audio.format``; streamed answers are pcm16 (the default when the body names
    none), another format asked for a streamed answer with audio is a 400 naming it."""
    if not body.stream:
        return "wav" if body.audio is None else body.audio.format
    if body.audio is None or "format" not in body.audio.model_fields_set:
        return STREAM_AUDIO_FORMATS[0]
    fmt = body.audio.format
    if "audio" in (body.modalities or ()) and fmt not in STREAM_AUDIO_FORMATS:
        raise bad_request(f"audio.format: {fmt!r} cannot be streamed; streamed answers carry "
                          f"{' or '.join(STREAM_AUDIO_FORMATS)} pieces (as OpenAI's)",
                          "audio.format", code="unsupported_value")
    return fmt


def validate(model, body):
    """``model.model_validate(body)`` for a handle caller; a ``ValidationError`` (which does not
    pickle well across Ray) as a 400 ``APIError`` naming the first field."""
    from pydantic import ValidationError

    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err.get("loc", ())) or None
        raise bad_request(f"{field}: {err.get('msg')}" if field else str(err.get("msg")),
                          field) from None


def clip(text: str, n: int = 64) -> str:
    """At most ``n`` characters of a client's string, for echoing it in an error."""
    return text if len(text) <= n else f"{text[:n]}...({len(text)} characters)"
