// omni_ray playground: streaming chat over the OpenAI-compatible API only
// (GET v1/models, GET v1/audio/voices, POST v1/chat/completions with stream: true; in "speak this
// text" mode POST v1/audio/speech with response_format pcm). Text is shown as it arrives;
// speech (pcm16, 24 kHz mono, little-endian) is decoded per chunk and scheduled back to back
// with Web Audio, so playback starts with the first chunk. Images go in the user message as
// image_url data URLs.
"use strict";

(() => {
  const SAMPLE_RATE = 24000;
  const LEAD_S = 0.05; // schedule a little ahead of "now" so a chunk never starts in the past
  const KEY_STORAGE = "omni_ray.playground.apiKey";
  const MODALITIES = { text: ["text"], audio: ["audio"], both: ["text", "audio"] };
  const $ = (id) => document.getElementById(id);

  // What the metrics panel shows; tests read it as window.__playground.
  const state = (window.__playground = {
    status: "idle", model: null, error: null, requests: 0,
    text: "", transcript: "", finishReason: null, usage: null,
    firstTokenMs: null, firstAudioMs: null, doneMs: null,
    audioChunksScheduled: 0, audioSeconds: 0, playbackStarted: false,
    attachment: null, recording: false, image: null,
    speechBytes: 0, speechChecksum: 0, // raw pcm of the last spoken text: its length and sum of int16s
  });
  const history = []; // this conversation, as OpenAI messages
  let attached = null; // spoken input for the next message: {data (base64), format, seconds}
  let attachedImage = null; // image for the next message: {url (a data: URL), label}
  let recorder = null; // MediaRecorder while recording
  let player = null; // {ctx, nextTime, sources}
  let controller = null; // AbortController of the request in flight

  // -- HTTP ------------------------------------------------------------------------------------
  const url = (path) => new URL(path, document.baseURI).toString(); // keeps any route prefix

  function headers(json) {
    const h = {};
    if (json) h["Content-Type"] = "application/json";
    const key = $("api-key").value.trim();
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  // An HTTP error as one line: OpenAI's {"error": {"message"}} when the body has it.
  async function httpError(what, resp) {
    let text = "";
    try { text = await resp.text(); } catch (_) { /* body unreadable: status only */ }
    let message = text.slice(0, 500);
    try {
      const body = JSON.parse(text);
      if (body && body.error) message = body.error.message || JSON.stringify(body.error);
    } catch (_) { /* not JSON: keep the raw text */ }
    return new Error(`${what} failed (HTTP ${resp.status}): ${message || resp.statusText}`);
  }

  async function loadModels() {
    const resp = await fetch(url("v1/models"), { headers: headers(false) });
    if (!resp.ok) throw await httpError("GET /v1/models", resp);
    const ids = ((await resp.json()).data || []).map((m) => m.id);
    if (!ids.length) throw new Error("GET /v1/models returned no models");
    const sel = $("model");
    const keep = ids.includes(sel.value) ? sel.value : ids[0];
    sel.replaceChildren(...ids.map((id) => new Option(id, id, false, id === keep)));
    sel.disabled = false;
    state.model = keep;
    return keep;
  }

  // The checkpoint's voices (GET v1/audio/voices) into the voice list; the page's built-in list
  // stays when the server is older than that route.
  async function loadVoices() {
    const resp = await fetch(url("v1/audio/voices"), { headers: headers(false) });
    if (!resp.ok) throw await httpError("GET /v1/audio/voices", resp);
    const body = await resp.json();
    const names = (body.voices || []).map((v) => (typeof v === "string" ? v : v.id || v.name));
    if (!names.length) return;
    const sel = $("voice");
    const keep = names.includes(sel.value) ? sel.value
      : names.includes(body.default) ? body.default : names[0];
    sel.replaceChildren(...names.map((n) => new Option(n, n, false, n === keep)));
  }

  // Calls onEvent(data) for each SSE event's data; stops after "[DONE]".
  async function readSSE(resp, onEvent) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    let data = [];
    for (;;) {
      const { value, done } = await reader.read();
      buf += decoder.decode(value || new Uint8Array(), { stream: !done });
      const lines = buf.split("\n");
      buf = done ? "" : lines.pop();
      for (let line of lines) {
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (data.length && onEvent(data.join("\n")) === "done") return;
          data = [];
        } else if (line.startsWith("data:")) {
          data.push(line.slice(line.startsWith("data: ") ? 6 : 5));
        } // comments (":...") and other fields are ignored
      }
      if (done) {
        if (data.length) onEvent(data.join("\n"));
        return;
      }
    }
  }

  // -- audio -----------------------------------------------------------------------------------
  function ensurePlayer() {
    if (!player) {
      const Ctx = window.AudioContext || window.webkitAudioContext;
      player = { ctx: new Ctx(), nextTime: 0, sources: new Set() };
    }
    if (player.ctx.state === "suspended") player.ctx.resume();
    return player;
  }

  function stopAudio() {
    if (!player) return;
    for (const src of player.sources) { try { src.stop(); } catch (_) { /* not started */ } }
    player.sources.clear();
    player.nextTime = 0;
  }

  function pcm16ToFloat32(b64) {
    const bin = atob(b64);
    const out = new Float32Array(bin.length >> 1);
    for (let i = 0; i < out.length; i++) {
      const v = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8);
      out[i] = (v >= 0x8000 ? v - 0x10000 : v) / 32768;
    }
    return out;
  }

  // Little-endian int16 bytes as float32 samples (an even number of bytes).
  function pcmBytesToFloat32(bytes) {
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const out = new Float32Array(bytes.byteLength >> 1);
    for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true) / 32768;
    return out;
  }

  function scheduleChunk(samples, reqId) {
    if (!samples.length) return;
    const p = ensurePlayer();
    const buffer = p.ctx.createBuffer(1, samples.length, SAMPLE_RATE);
    buffer.copyToChannel(samples, 0);
    const src = p.ctx.createBufferSource();
    src.buffer = buffer;
    src.connect(p.ctx.destination);
    const startAt = Math.max(p.nextTime, p.ctx.currentTime + LEAD_S);
    src.start(startAt);
    src.onended = () => { p.sources.delete(src); render(); };
    p.sources.add(src);
    p.nextTime = startAt + buffer.duration;
    state.audioChunksScheduled += 1;
    state.audioSeconds += buffer.duration;
    if (state.audioChunksScheduled === 1) watchPlayback(startAt, reqId);
  }

  // playbackStarted turns true once the audio clock has passed the first chunk's start.
  function watchPlayback(startAt, reqId) {
    const tick = () => {
      if (reqId !== state.requests || !player) return;
      if (player.ctx.state === "running" && player.ctx.currentTime >= startAt) {
        state.playbackStarted = true;
        render();
      } else {
        setTimeout(tick, 20);
      }
    };
    tick();
  }

  // -- UI --------------------------------------------------------------------------------------
  function showError(message) {
    state.error = message;
    $("error").textContent = message;
    $("error").hidden = false;
  }

  function clearError() {
    state.error = null;
    $("error").textContent = "";
    $("error").hidden = true;
  }

  function bubble(role, text) {
    const div = document.createElement("div");
    div.className = "msg " + role;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role;
    const body = document.createElement("div");
    body.className = "body";
    body.textContent = text;
    div.append(who, body);
    $("log").append(div);
    div.scrollIntoView({ block: "end" });
    return body;
  }

  const ms = (v) => (v === null ? "–" : `${v} ms`);

  function render() {
    const playing = player !== null && player.sources.size > 0 && state.playbackStarted;
    $("status").textContent = state.status + (playing ? " · playing" : "");
    $("ttft").textContent = ms(state.firstTokenMs);
    $("ttfa").textContent = ms(state.firstAudioMs);
    $("audio-duration").textContent = state.audioChunksScheduled
      ? `${state.audioSeconds.toFixed(2)} s (${state.audioChunksScheduled} chunks)` : "–";
    const u = state.usage;
    $("usage").textContent = u ? `${u.prompt_tokens} prompt + ${u.completion_tokens} completion tokens` : "–";
  }

  function setBusy(busy) {
    $("send").disabled = busy;
    $("stop").disabled = !busy;
  }

  // -- spoken input: microphone or file, sent as an input_audio content part --------------------
  function b64(bytes) {
    let bin = "";
    for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    return btoa(bin);
  }

  // Mono PCM16 WAV of an AudioBuffer (the server resamples to what the model reads).
  function wavBytes(buffer) {
    const n = buffer.length, rate = buffer.sampleRate, ch = buffer.numberOfChannels;
    const out = new DataView(new ArrayBuffer(44 + 2 * n));
    const text = (o, t) => { for (let i = 0; i < t.length; i++) out.setUint8(o + i, t.charCodeAt(i)); };
    text(0, "RIFF"); out.setUint32(4, 36 + 2 * n, true); text(8, "WAVE"); text(12, "fmt ");
    out.setUint32(16, 16, true); out.setUint16(20, 1, true); out.setUint16(22, 1, true);
    out.setUint32(24, rate, true); out.setUint32(28, 2 * rate, true); out.setUint16(32, 2, true);
    out.setUint16(34, 16, true); text(36, "data"); out.setUint32(40, 2 * n, true);
    const chans = Array.from({ length: ch }, (_, c) => buffer.getChannelData(c));
    for (let i = 0; i < n; i++) {
      let v = 0;
      for (const d of chans) v += d[i];
      v = Math.max(-1, Math.min(1, v / ch));
      out.setInt16(44 + 2 * i, v < 0 ? v * 0x8000 : v * 0x7fff, true);
    }
    return new Uint8Array(out.buffer);
  }

  async function decodeToWav(arrayBuffer) {
    const ctx = new (window.OfflineAudioContext || window.webkitOfflineAudioContext)(1, 1, 44100);
    const buffer = await ctx.decodeAudioData(arrayBuffer);
    return { bytes: wavBytes(buffer), seconds: buffer.duration };
  }

  function attach(audio) {
    attached = audio;
    state.attachment = audio ? { format: audio.format, seconds: audio.seconds } : null;
    $("attachment").hidden = !audio;
    $("attachment-label").textContent = audio
      ? `🎤 ${audio.label} (${audio.seconds.toFixed(1)} s, ${audio.format})` : "";
  }

  async function attachFile(file) {
    const raw = await file.arrayBuffer();
    const name = file.name.toLowerCase();
    const format = name.endsWith(".mp3") || file.type === "audio/mpeg" ? "mp3"
      : name.endsWith(".wav") || file.type.includes("wav") ? "wav" : null;
    const decoded = await decodeToWav(raw.slice(0)); // duration, and a wav for other formats
    if (format) attach({ data: b64(new Uint8Array(raw)), format, seconds: decoded.seconds, label: file.name });
    else attach({ data: b64(decoded.bytes), format: "wav", seconds: decoded.seconds, label: file.name });
  }

  function attachImage(image) {
    attachedImage = image;
    state.image = image ? { label: image.label, bytes: image.bytes, type: image.type } : null;
    $("image-attachment").hidden = !image;
    $("image-label").textContent = image ? `🖼 ${image.label} (${Math.ceil(image.bytes / 1024)} KiB)` : "";
  }

  function readImage(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve({ url: reader.result, label: file.name, bytes: file.size, type: file.type });
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(file);
    });
  }

  async function toggleRecording() {
    if (recorder) { recorder.stop(); return; }
    const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    const pieces = [];
    recorder = new MediaRecorder(stream);
    recorder.ondataavailable = (e) => { if (e.data.size) pieces.push(e.data); };
    recorder.onstop = async () => {
      stream.getTracks().forEach((t) => t.stop());
      recorder = null;
      $("record").textContent = "Record";
      $("record").classList.remove("recording");
      state.recording = false;
      try {
        const { bytes, seconds } = await decodeToWav(await new Blob(pieces).arrayBuffer());
        attach({ data: b64(bytes), format: "wav", seconds, label: "recording" });
      } catch (e) {
        showError(`could not read the recording: ${e.message || e}`);
      }
    };
    recorder.start();
    state.recording = true;
    $("record").textContent = "Stop recording";
    $("record").classList.add("recording");
  }

  // -- one request -----------------------------------------------------------------------------
  async function send(message) {
    const modalities = MODALITIES[document.querySelector("input[name=modalities]:checked").value];
    const wantsAudio = modalities.includes("audio");
    if (wantsAudio) { ensurePlayer(); stopAudio(); } // inside the click: browsers allow audio then
    clearError();
    const reqId = ++state.requests;
    Object.assign(state, {
      status: "connecting", text: "", transcript: "", finishReason: null, usage: null,
      firstTokenMs: null, firstAudioMs: null, doneMs: null, audioChunksScheduled: 0, audioSeconds: 0,
      playbackStarted: false,
    });
    render();
    const audio = attached, image = attachedImage;
    attach(null);
    attachImage(null);
    const content = audio || image
      ? [...(audio ? [{ type: "input_audio", input_audio: { data: audio.data, format: audio.format } }] : []),
         ...(image ? [{ type: "image_url", image_url: { url: image.url } }] : []),
         ...(message ? [{ type: "text", text: message }] : [])]
      : message;
    history.push({ role: "user", content });
    const said = [audio ? `🎤 ${audio.label} (${audio.seconds.toFixed(1)} s)` : "",
                  image ? `🖼 ${image.label}` : "", message].filter(Boolean).join(" ");
    bubble("user", said);
    const out = bubble("assistant", "");
    const t0 = performance.now();
    const since = () => Math.round(performance.now() - t0);
    controller = new AbortController();
    setBusy(true);
    try {
      const model = state.model || (await loadModels());
      const body = {
        model, messages: history.slice(), stream: true,
        stream_options: { include_usage: true }, modalities,
      };
      if (wantsAudio) body.audio = { voice: $("voice").value, format: "pcm16" };
      const maxTokens = parseInt($("max-tokens").value, 10);
      if (maxTokens > 0) body.max_tokens = maxTokens;
      const resp = await fetch(url("v1/chat/completions"), {
        method: "POST", headers: headers(true), body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!resp.ok) throw await httpError("POST /v1/chat/completions", resp);
      state.status = "streaming";
      render();
      await readSSE(resp, (data) => {
        if (data === "[DONE]") { state.doneMs = since(); return "done"; }
        const ev = JSON.parse(data);
        if (ev.error) { // a failure after the stream began: {"error": {...}} as an event
          showError(`stream error: ${ev.error.message || JSON.stringify(ev.error)}`);
          state.status = "error";
        }
        if (ev.usage) state.usage = ev.usage;
        const choice = (ev.choices || [])[0];
        if (choice) {
          const d = choice.delta || {};
          if (d.content) {
            if (state.firstTokenMs === null) state.firstTokenMs = since();
            state.text += d.content;
          }
          if (d.audio) {
            if (d.audio.transcript) {
              state.transcript += d.audio.transcript;
              if (!modalities.includes("text") && state.firstTokenMs === null) state.firstTokenMs = since();
            }
            if (d.audio.data) {
              if (state.firstAudioMs === null) state.firstAudioMs = since();
              scheduleChunk(pcm16ToFloat32(d.audio.data), reqId);
            }
          }
          if (choice.finish_reason) state.finishReason = choice.finish_reason;
        }
        out.textContent = modalities.includes("text") ? state.text : state.transcript;
        out.classList.toggle("transcript", !modalities.includes("text"));
        render();
        return null;
      });
      history.push({ role: "assistant", content: state.text || state.transcript });
      if (state.status !== "error") state.status = "done" + (state.finishReason ? ` (${state.finishReason})` : "");
    } catch (e) {
      history.pop(); // the user turn did not get an answer; leave it out of the next request
      failed(e);
    } finally {
      idle();
    }
  }

  // A request that ended early: stopped by the user, or an error shown.
  function failed(e) {
    if (e.name === "AbortError") {
      state.status = "stopped";
    } else {
      state.status = "error";
      showError(e.message || String(e));
    }
  }

  function idle() {
    controller = null;
    setBusy(false);
    render();
  }

  // -- "speak this text": POST v1/audio/speech, raw pcm played as it arrives ------------------
  async function speak(text) {
    ensurePlayer(); stopAudio(); // inside the click: browsers allow audio then
    clearError();
    const reqId = ++state.requests;
    Object.assign(state, {
      status: "connecting", text: "", transcript: "", finishReason: null, usage: null,
      firstTokenMs: null, firstAudioMs: null, doneMs: null, audioChunksScheduled: 0, audioSeconds: 0,
      playbackStarted: false, speechBytes: 0, speechChecksum: 0,
    });
    render();
    bubble("user", `🔊 ${text}`);
    const out = bubble("assistant", "");
    out.classList.add("transcript");
    const t0 = performance.now();
    const since = () => Math.round(performance.now() - t0);
    controller = new AbortController();
    setBusy(true);
    try {
      const model = state.model || (await loadModels());
      const body = { model, input: text, voice: $("voice").value, response_format: "pcm" };
      const resp = await fetch(url("v1/audio/speech"), {
        method: "POST", headers: headers(true), body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!resp.ok) throw await httpError("POST /v1/audio/speech", resp);
      state.status = "streaming";
      render();
      const reader = resp.body.getReader();
      let carry = null; // an odd byte left over from the previous read
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        let bytes = value;
        if (carry !== null) { bytes = new Uint8Array(value.length + 1); bytes[0] = carry; bytes.set(value, 1); carry = null; }
        if (bytes.length % 2) { carry = bytes[bytes.length - 1]; bytes = bytes.subarray(0, bytes.length - 1); }
        if (!bytes.length) continue;
        if (state.firstAudioMs === null) state.firstAudioMs = since();
        const samples = pcmBytesToFloat32(bytes);
        state.speechBytes += bytes.length;
        const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
        for (let i = 0; i < samples.length; i++) state.speechChecksum = (state.speechChecksum + view.getInt16(2 * i, true)) | 0;
        scheduleChunk(samples, reqId);
        render();
      }
      state.doneMs = since();
      out.textContent = `${text} (spoken: ${state.audioSeconds.toFixed(2)} s)`;
      state.status = "done (speech)";
    } catch (e) {
      failed(e);
    } finally {
      idle();
    }
  }

  // -- wiring ----------------------------------------------------------------------------------
  function init() {
    const keyInput = $("api-key");
    keyInput.value = localStorage.getItem(KEY_STORAGE) || "";
    keyInput.addEventListener("change", () => {
      const key = keyInput.value.trim();
      if (key) localStorage.setItem(KEY_STORAGE, key); else localStorage.removeItem(KEY_STORAGE);
      state.model = null;
      loadModels().then(clearError, (e) => showError(e.message));
      loadVoices().catch((e) => showError(e.message));
    });
    $("model").addEventListener("change", (e) => { state.model = e.target.value; });
    $("composer").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = $("message").value.trim();
      if (controller) return;
      if ($("speak-mode").checked) { // voices the text alone: attachments wait for a chat message
        if (!text) return;
        $("message").value = "";
        speak(text);
        return;
      }
      if (!text && !attached && !attachedImage) return;
      $("message").value = "";
      send(text);
    });
    $("message").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("composer").requestSubmit();
    });
    $("stop").addEventListener("click", () => { if (controller) controller.abort(); stopAudio(); });
    $("audio-file").addEventListener("change", (e) => {
      const file = e.target.files[0];
      e.target.value = "";
      if (file) attachFile(file).catch((err) => showError(`could not read ${file.name}: ${err.message || err}`));
    });
    $("detach").addEventListener("click", () => attach(null));
    $("image-file").addEventListener("change", (e) => {
      const file = e.target.files[0];
      e.target.value = "";
      if (file) readImage(file).then(attachImage, (err) => showError(`could not read ${file.name}: ${err.message || err}`));
    });
    $("detach-image").addEventListener("click", () => attachImage(null));
    if (navigator.mediaDevices && window.MediaRecorder) {
      $("record").addEventListener("click", () => {
        clearError();
        toggleRecording().catch((e) => showError(`microphone: ${e.message || e}`));
      });
    } else {
      $("record").disabled = true;
      $("record").title = "Recording needs a secure page (https or localhost) and MediaRecorder";
    }
    $("clear").addEventListener("click", () => {
      if (controller) controller.abort();
      stopAudio();
      history.length = 0;
      attach(null);
      attachImage(null);
      $("log").replaceChildren();
      clearError();
    });
    render();
    loadModels().catch((e) => showError(e.message));
    loadVoices().catch((e) => showError(e.message));
  }

  init(); // the script is loaded with "defer": the DOM is ready
})();
