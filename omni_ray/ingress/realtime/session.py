"""One realtime socket's state: its session settings, input audio buffer and turn detection, the
conversation (earlier turns, text and audio, stay in the context) and the response in progress.

Ray-free; the answer comes from a ``Backend`` (the ingress: ``endpoint.IngressBackend``), output
goes through ``send`` (one JSON event at a time). Client events are handled one after another;
a response runs in a task of its own, so audio keeps arriving (and can interrupt it) while the
answer streams. Cancelling that task closes the pipeline stream, which cancels every stage call.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from pydantic import ValidationError

from omni_ray.audio import pcm16_wav
from omni_ray.config.defaults import REALTIME_SAMPLE_RATE as RATE
from omni_ray.config.serving import RealtimeConfig
from omni_ray.ingress.chat_answer import AUDIO_TOKEN_SAMPLES  # the chat usage's
from omni_ray.ingress.realtime import protocol as P
from omni_ray.ingress.realtime.conversation import ConvItem, InputBuffer, merge
from omni_ray.ingress.realtime.vad import TurnDetector

logger = logging.getLogger("ray.serve")

MS = RATE // 1000                 # samples per millisecond (24)
MIN_COMMIT_MS = 100               # OpenAI's smallest committable buffer
# The chat API's refusals of a too-long conversation (``param`` "messages"); None: max_messages.
TRUNCATED_ON = {"context_length_exceeded", "too_many_content_parts", "too_many_media_parts", None}


class Backend(Protocol):
    model_id: str
    default_voice: str

    def check_voice(self, voice: str) -> None:
        """Raise ``ValueError`` for a voice the checkpoint lacks."""

    def respond(self, messages: list[dict], voice: str, modalities: list[str],
                max_tokens: int | None) -> AsyncIterator[dict]:
        """The answer as ``OmniIngress.generate``'s events (text, audio, done); ``ProtocolError``
        for a request the ingress refuses; cancelling the iteration aborts every stage."""


class ResponseStatus(enum.Enum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    CANCELLED = "cancelled"
    FAILED = "failed"


@dataclass
class Response:
    id: str
    item_id: str
    modality: str                  # "audio" (with transcript) or "text"
    voice: str
    max_output_tokens: int | str
    task: asyncio.Task | None = None
    text: str = ""
    samples_sent: int = 0
    status: ResponseStatus = ResponseStatus.IN_PROGRESS
    reason: str | None = None      # turn_detected | client_cancelled | max_output_tokens

    @property
    def audio_ms(self) -> int:
        """Audio sent so far, in ms (what a client trims its playback to)."""
        return self.samples_sent // MS


class RealtimeSession:
    def __init__(self, backend: Backend, send: Callable[[dict], Awaitable[None]],
                 cfg: RealtimeConfig, beta: bool = False):
        """``beta``: the client asked for the beta protocol (``OpenAI-Beta: realtime=v1``):
        server events go out under their beta names (protocol.BETA_NAMES)."""
        self.backend, self._send, self.cfg, self.beta = backend, send, cfg, beta
        self.ev = P.ServerEvents()
        vad = P.ServerVad(type="server_vad", threshold=cfg.vad_threshold,
                          prefix_padding_ms=cfg.prefix_padding_ms,
                          silence_duration_ms=cfg.silence_duration_ms)
        self.session = P.Session(model=backend.model_id, audio=P.SessionAudio(
            input=P.AudioInput(turn_detection=vad),
            output=P.AudioOutput(voice=backend.default_voice)))
        self.items: list[ConvItem] = []
        self.buffer = InputBuffer()
        self.detector: TurnDetector | None = None
        self.turn: tuple[str, int] | None = None   # (item id, start sample) of speech under way
        self.response: Response | None = None
        self.closed = False
        self._vad_from(self.session)
        self._handlers = {
            P.SessionUpdate: self._on_session_update,
            P.BufferAppend: self._on_input_audio_buffer_append,
            P.BufferCommit: self._on_input_audio_buffer_commit,
            P.BufferClear: self._on_input_audio_buffer_clear,
            P.ItemCreate: self._on_conversation_item_create,
            P.ItemTruncate: self._on_conversation_item_truncate,
            P.ResponseCreate: self._on_response_create,
            P.ResponseCancel: self._on_response_cancel,
        }

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        await self.send(self.ev("session.created", session=self.session.public()))

    async def close(self) -> None:
        """The socket is gone: stop the response (every stage call cancelled), drop the state."""
        self.closed = True
        await self.cancel_response("client_cancelled")
        self.items.clear()
        self.buffer = InputBuffer()

    async def send(self, event: dict) -> None:
        if self.closed:
            return
        if self.beta:
            event = P.beta_event(event)
            if event is None:
                return
        await self._send(event)

    async def handle(self, raw: str | bytes) -> None:
        """One client message; a refused one is answered with an ``error`` event."""
        try:
            event = P.parse_client_event(raw)
            await self._handlers[type(event)](event)
        except P.ProtocolError as e:
            await self.send(self.ev.error(e))

    # -- client events -----------------------------------------------------------------------
    async def _on_session_update(self, e: P.SessionUpdate) -> None:
        merged = merge(self.session.model_dump(), P.beta_session(e.session))
        try:
            new = P.Session.model_validate(merged)
        except ValidationError as err:
            raise P.from_validation(err, "session.", e.event_id) from None
        if new.model not in (None, self.backend.model_id):
            raise P.ProtocolError(f"session.model: {new.model[:64]!r} is not served here "
                                  f"({self.backend.model_id!r})", "session.model",
                                  "model_not_found", e.event_id)
        try:
            self.backend.check_voice(new.audio.output.voice)
        except ValueError as err:
            raise P.ProtocolError(f"session.audio.output.voice: {err}",
                                  "session.audio.output.voice", "invalid_value",
                                  e.event_id) from None
        old_vad = self.session.audio.input.turn_detection
        self.session = new
        if new.audio.input.turn_detection != old_vad:
            self._vad_from(new)
        await self.send(self.ev("session.updated", session=new.public()))

    async def _on_input_audio_buffer_append(self, e: P.BufferAppend) -> None:
        pcm = P.decode_audio(e.audio, "audio", e.event_id)
        limit = int(self.cfg.max_buffer_seconds * RATE)
        if self.buffer.end - self.buffer.start + len(pcm) // 2 > limit:
            raise P.ProtocolError(f"audio: the input audio buffer would hold over "
                                  f"realtime.max_buffer_seconds={self.cfg.max_buffer_seconds}; "
                                  "commit or clear it", "audio", "input_audio_buffer_full",
                                  e.event_id)
        floor_ms = self.buffer.start // MS
        self.buffer.pcm += pcm
        if self.detector is None:
            return
        for turn in self.detector.push(pcm, floor_ms):
            if turn.kind == "started":
                await self._speech_started(turn.ms)
            else:
                await self._speech_stopped(turn.ms)
        if self.turn is None:  # between turns keep only what a start's padding may reach
            keep = (self.session.audio.input.turn_detection.prefix_padding_ms + 1000) * MS
            self.buffer.drop_before(self.buffer.end - keep)

    async def _on_input_audio_buffer_commit(self, e: P.BufferCommit) -> None:
        if (self.buffer.end - self.buffer.start) < MIN_COMMIT_MS * MS:
            ms = (self.buffer.end - self.buffer.start) // MS
            raise P.ProtocolError(f"Error committing input audio buffer: buffer too small. "
                                  f"Expected at least {MIN_COMMIT_MS}ms of audio, but buffer "
                                  f"only has {ms}ms of audio.", None,
                                  "input_audio_buffer_commit_empty", e.event_id)
        item_id = self.turn[0] if self.turn else P.new_id("item")
        self.turn = None
        if self.detector is not None:
            self.detector.reset()
        await self._commit(item_id, self.buffer.take(self.buffer.start, self.buffer.end))

    async def _on_input_audio_buffer_clear(self, e: P.BufferClear) -> None:
        self.buffer.drop_before(self.buffer.end)
        self.turn = None
        if self.detector is not None:
            self.detector.reset()
        await self.send(self.ev("input_audio_buffer.cleared"))

    async def _on_conversation_item_create(self, e: P.ItemCreate) -> None:
        it = e.item
        item = ConvItem(id=it.id or P.new_id("item"), role=it.role)
        parts = []
        for j, part in enumerate(it.content):
            param = f"item.content.{j}"
            if part.type in ("input_audio", "audio") and it.role == "user":
                if part.audio is None:
                    raise P.ProtocolError(f"{param}.audio: required for input_audio",
                                          f"{param}.audio", "missing_required_parameter",
                                          e.event_id)
                pcm = P.decode_audio(part.audio, f"{param}.audio", e.event_id)
                item.pcm = (item.pcm or b"") + pcm
                parts.append({"type": "input_audio", "transcript": None})
            else:
                text = part.text if part.text is not None else part.transcript
                if not text:
                    raise P.ProtocolError(f"{param}.text: required for a {part.type} part of a "
                                          f"{it.role} item", f"{param}.text",
                                          "missing_required_parameter", e.event_id)
                item.text += text
                kind = {"user": "input_text", "system": "input_text"}.get(it.role, "output_text")
                parts.append({"type": kind, "text": text})
        self._add(item)
        shown = P.user_item(item.id, parts)
        shown["role"] = it.role
        await self._announce(shown)

    async def _on_conversation_item_truncate(self, e: P.ItemTruncate) -> None:
        item = next((i for i in self.items if i.id == e.item_id), None)
        r = self.response
        if r is not None and r.item_id == e.item_id:
            sent_ms = r.audio_ms
        elif item is not None and item.role == "assistant":
            sent_ms = item.audio_ms
        else:
            raise P.ProtocolError(f"item_id: no assistant audio item {e.item_id[:64]!r}",
                                  "item_id", "item_truncate_invalid_item_id", e.event_id)
        if e.audio_end_ms > sent_ms:
            raise P.ProtocolError(f"audio_end_ms: {e.audio_end_ms} is after the audio sent "
                                  f"({sent_ms} ms)", "audio_end_ms", "invalid_value", e.event_id)
        await self.send(self.ev("conversation.item.truncated", item_id=e.item_id,
                                content_index=e.content_index, audio_end_ms=e.audio_end_ms))

    async def _on_response_create(self, e: P.ResponseCreate) -> None:
        if self.response is not None:
            raise P.ProtocolError("Conversation already has an active response in progress: "
                                  f"{self.response.id}. Wait until the response is finished "
                                  "before creating a new one.", None,
                                  "conversation_already_has_active_response", e.event_id)
        over = e.response or {}
        s = self.session
        try:
            merged = P.Session.model_validate(merge(s.model_dump(), P.beta_session(
                {k: v for k, v in over.items() if k in ("instructions", "output_modalities",
                                                        "modalities", "audio", "voice",
                                                        "max_output_tokens",
                                                        "max_response_output_tokens")})))
        except ValidationError as err:
            raise P.from_validation(err, "response.", e.event_id) from None
        self._start_response(merged)

    async def _on_response_cancel(self, e: P.ResponseCancel) -> None:
        r = self.response
        if r is None or (e.response_id and e.response_id != r.id):
            raise P.ProtocolError("Cancellation failed: no active response found", None,
                                  "response_cancel_not_active", e.event_id)
        await self.cancel_response("client_cancelled")

    # -- turns -------------------------------------------------------------------------------
    async def _speech_started(self, ms: int) -> None:
        item_id = P.new_id("item")
        self.turn = (item_id, ms * MS)
        self.buffer.drop_before(ms * MS)
        await self.send(self.ev("input_audio_buffer.speech_started", audio_start_ms=ms,
                                item_id=item_id))
        vad = self.session.audio.input.turn_detection
        if self.response is not None and vad is not None and vad.interrupt_response:
            await self.cancel_response("turn_detected")  # barge-in

    async def _speech_stopped(self, ms: int) -> None:
        if self.turn is None:
            return
        item_id, start = self.turn
        self.turn = None
        await self.send(self.ev("input_audio_buffer.speech_stopped", audio_end_ms=ms,
                                item_id=item_id))
        await self._commit(item_id, self.buffer.take(start, ms * MS))
        vad = self.session.audio.input.turn_detection
        if vad is not None and vad.create_response:
            if self.response is not None:
                await self.cancel_response("turn_detected")
            self._start_response(self.session)

    async def _commit(self, item_id: str, pcm: bytes) -> None:
        prev = self.items[-1].id if self.items else None
        self._add(ConvItem(id=item_id, role="user", pcm=pcm))
        await self.send(self.ev("input_audio_buffer.committed", item_id=item_id,
                                previous_item_id=prev))
        await self._announce(P.user_item(item_id, [{"type": "input_audio", "transcript": None}]),
                             prev)

    async def _announce(self, item: dict, prev: str | None = None) -> None:
        await self._announce_added(item, prev)
        await self.send(self.ev("conversation.item.done", item=item, previous_item_id=prev))

    def _add(self, item: ConvItem) -> None:
        self.items.append(item)
        del self.items[:-self.cfg.max_items]

    def _vad_from(self, s: P.Session) -> None:
        vad = s.audio.input.turn_detection
        self.detector = None if vad is None else TurnDetector(
            vad.threshold, vad.prefix_padding_ms, vad.silence_duration_ms,
            origin_ms=-(-self.buffer.end // MS))
        self.turn = None

    # -- responses ---------------------------------------------------------------------------
    def _start_response(self, s: P.Session) -> None:
        r = Response(id=P.new_id("resp"), item_id=P.new_id("item"),
                     modality=s.output_modalities[0], voice=s.audio.output.voice,
                     max_output_tokens=s.max_output_tokens)
        self.response = r
        r.task = asyncio.get_running_loop().create_task(self._run(r, s.instructions))

    async def cancel_response(self, reason: str) -> None:
        """Stop the response in progress (if any) and wait until its stages are cancelled and
        its ``response.done`` is sent."""
        r = self.response
        if r is None or r.task is None:
            return
        if r.status is ResponseStatus.IN_PROGRESS:
            r.reason = reason
            r.task.cancel()
        await asyncio.gather(r.task, return_exceptions=True)

    def _messages(self, instructions: str) -> list[dict]:
        """The conversation as the chat API's messages (user audio as wav ``input_audio``)."""
        out: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
        for it in self.items:
            if it.pcm is not None:
                audio = base64.b64encode(pcm16_wav(it.pcm, RATE)).decode()
                parts = [{"type": "input_audio",
                          "input_audio": {"data": audio, "format": "wav"}}]
                if it.text:
                    parts.append({"type": "text", "text": it.text})
                out.append({"role": it.role, "content": parts})
            elif it.text:
                out.append({"role": it.role, "content": it.text})
        return out

    async def _answer(self, instructions: str, voice: str, modalities: list[str],
                      max_tokens: int | None) -> AsyncIterator[dict]:
        """The backend's answer to the conversation. A conversation grown past the request
        limits (prompt tokens, messages, media parts) loses its oldest items until it fits, as
        OpenAI's ``truncation: "auto"``; a single item over them is the response's error."""
        while True:
            answer = self.backend.respond(self._messages(instructions), voice, modalities,
                                          max_tokens)
            async with contextlib.aclosing(answer):
                try:
                    first = await anext(answer)
                except StopAsyncIteration:
                    return
                except P.ProtocolError as e:
                    if e.param != "messages" or e.code not in TRUNCATED_ON \
                            or len(self.items) <= 1:
                        raise
                    logger.info("realtime: %s; dropping the oldest item", e.code or "too long")
                    del self.items[0]
                    continue
                yield first
                async for out in answer:
                    yield out
            return

    async def _run(self, r: Response, instructions: str) -> None:
        ev, kind = self.ev, r.modality
        base = dict(response_id=r.id, item_id=r.item_id, output_index=0, content_index=0)
        usage, error = None, None
        mods = ["text", "audio"] if kind == "audio" else ["text"]
        max_tokens = None if r.max_output_tokens == "inf" else int(r.max_output_tokens)
        try:
            await self.send(ev("response.created", response=self._response_obj(r)))
            item = P.assistant_item(r.item_id, kind, "in_progress")
            await self.send(ev("response.output_item.added", response_id=r.id, output_index=0,
                               item=item))
            await self._announce_added(item, latest=True)
            part = {"type": "audio", "transcript": ""} if kind == "audio" else {
                "type": "text", "text": ""}
            await self.send(ev("response.content_part.added", part=part, **base))
            delta_type = ("response.output_audio_transcript.delta" if kind == "audio"
                          else "response.output_text.delta")
            answer = self._answer(instructions, r.voice, mods, max_tokens)
            async with contextlib.aclosing(answer):  # closed now, also when cancelled
                async for out in answer:
                    if out["type"] == "text":
                        r.text += out["delta"]
                        await self.send(ev(delta_type, delta=out["delta"], **base))
                    elif out["type"] == "audio" and out["num_samples"]:
                        r.samples_sent += out["num_samples"]
                        data = base64.b64encode(out["pcm16"]).decode()
                        await self.send(ev("response.output_audio.delta", delta=data, **base))
                    elif out["type"] == "done":
                        usage = P.realtime_usage(out["usage"])
                        if out["finish_reason"] == "length":
                            r.status, r.reason = ResponseStatus.INCOMPLETE, "max_output_tokens"
            if r.status is ResponseStatus.IN_PROGRESS:
                r.status = ResponseStatus.COMPLETED
        except asyncio.CancelledError:
            r.status = ResponseStatus.CANCELLED
            r.reason = r.reason or "client_cancelled"
        except P.ProtocolError as e:
            r.status, error = ResponseStatus.FAILED, {"type": e.type, "code": e.code,
                                                      "message": e.message}
            await self.send(ev.error(e))
        except Exception as e:  # noqa: BLE001 - a stage failed: the response fails, socket stays
            logger.warning("realtime response %s failed: %s", r.id, e)
            r.status, error = ResponseStatus.FAILED, {"type": "server_error", "code": None,
                                                      "message": str(e)[:300]}
        if usage is None and r.samples_sent:  # cut short: the audio sent, in audio tokens
            frames = -(-r.samples_sent // AUDIO_TOKEN_SAMPLES)
            usage = {"output_tokens": frames, "output_token_details": {"audio_tokens": frames}}
        self._add(_answer_item(r))
        try:
            await self._finish(r, usage, error)
        finally:
            self.response = None

    async def _finish(self, r: Response, usage: dict | None, error: dict | None) -> None:
        """The closing events: the content's done events, the item's, then ``response.done``
        (and, for an interrupted spoken answer, how much audio had been sent)."""
        ev, kind = self.ev, r.modality
        base = dict(response_id=r.id, item_id=r.item_id, output_index=0, content_index=0)
        status = "completed" if r.status is ResponseStatus.COMPLETED else "incomplete"
        item = P.assistant_item(r.item_id, kind, status, r.text)
        try:
            if kind == "audio":
                await self.send(ev("response.output_audio.done", **base))
                await self.send(ev("response.output_audio_transcript.done", transcript=r.text,
                                   **base))
            else:
                await self.send(ev("response.output_text.done", text=r.text, **base))
            part = ({"type": "audio", "transcript": r.text} if kind == "audio"
                    else {"type": "text", "text": r.text})
            await self.send(ev("response.content_part.done", part=part, **base))
            await self.send(ev("response.output_item.done", response_id=r.id, output_index=0,
                               item=item))
            await self.send(ev("conversation.item.done", item=item))
            await self.send(ev("response.done", response=self._response_obj(
                r, output=[item], usage=usage, error=error)))
            if r.status is ResponseStatus.CANCELLED and kind == "audio":
                await self.send(ev("conversation.item.truncated", item_id=r.item_id,
                                   content_index=0, audio_end_ms=r.audio_ms))
        except Exception as e:  # noqa: BLE001 - the socket went away meanwhile
            logger.info("realtime response %s: closing events not sent (%s)", r.id,
                        type(e).__name__)

    async def _announce_added(self, item: dict, prev: str | None = None, *,
                              latest: bool = False) -> None:
        """``conversation.item.added`` and, as OpenAI's GA server also does,
        ``conversation.item.created`` (beta clients get one ``created``: protocol.BETA_NAMES)."""
        if latest:
            prev = self.items[-1].id if self.items else None
        for name in ("conversation.item.added", "conversation.item.created"):
            await self.send(self.ev(name, item=item, previous_item_id=prev))

    def _response_obj(self, r: Response, *, output=None, usage=None, error=None) -> dict:
        return P.response_obj(r.id, r.status.value, r.modality, r.voice, output=output,
                              usage=usage, reason=r.reason, error=error,
                              max_output_tokens=r.max_output_tokens)


def _answer_item(r: Response) -> ConvItem:
    return ConvItem(id=r.item_id, role="assistant", text=r.text, audio_ms=r.audio_ms)
