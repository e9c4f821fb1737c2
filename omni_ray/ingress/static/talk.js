// omni_ray playground, "talk" mode: speech to speech over WS v1/realtime (OpenAI's Realtime
// protocol). The microphone is captured at 24 kHz and sent as pcm16 input_audio_buffer.append
// packets (~43 ms); the answer's response.output_audio.delta pieces are played back to back.
// Turn taking: "vad" lets the server's voice activity detection end each turn, and speech while
// the answer plays interrupts it (playback stops at once; the server cancels the answer);
// "hold" sends audio only while the button is held and commits the turn on release.
// The API key travels as OpenAI's browser subprotocol (a browser cannot set socket headers).
"use strict";

(() => {
  const RATE = 24000;
  const LEAD_S = 0.05;
  const $ = (id) => document.getElementById(id);

  // Tests read this as window.__talk.
  const talk = (window.__talk = {
    open: false, mode: "vad", holding: false, speaking: false, error: null,
    events: [], packetsSent: 0, audioDeltas: 0, audioSeconds: 0, transcript: "",
    responses: 0, cancelled: 0, playbackInterrupted: 0, playing: false, lastStatus: null,
  });
  let ws = null;
  let mic = null; // {stream, ctx, src, proc}
  let out = null; // {ctx, nextTime, sources}
  let responding = false;

  function socketUrl() {
    const u = new URL("v1/realtime", document.baseURI); // keeps any route prefix
    u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    u.searchParams.set("model", $("model").value || "qwen3-omni");
    return u.toString();
  }

  function send(event) {
    if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(event));
  }

  function b64(int16) {
    const bytes = new Uint8Array(int16.buffer, int16.byteOffset, int16.byteLength);
    let s = "";
    for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    return btoa(s);
  }

  function toFloat32(b64data) {
    const bin = atob(b64data);
    const f = new Float32Array(bin.length >> 1);
    for (let i = 0; i < f.length; i++) {
      const v = bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8);
      f[i] = (v >= 0x8000 ? v - 0x10000 : v) / 32768;
    }
    return f;
  }

  // -- playback --------------------------------------------------------------------------------
  function play(samples) {
    if (!samples.length) return;
    if (!out) out = { ctx: new AudioContext({ sampleRate: RATE }), nextTime: 0, sources: new Set() };
    if (out.ctx.state === "suspended") out.ctx.resume();
    const buf = out.ctx.createBuffer(1, samples.length, RATE);
    buf.copyToChannel(samples, 0);
    const src = out.ctx.createBufferSource();
    src.buffer = buf;
    src.connect(out.ctx.destination);
    const at = Math.max(out.nextTime, out.ctx.currentTime + LEAD_S);
    src.start(at);
    src.onended = () => { out.sources.delete(src); talk.playing = out.sources.size > 0; render(); };
    out.sources.add(src);
    out.nextTime = at + buf.duration;
    talk.playing = true;
    talk.audioSeconds += buf.duration;
  }

  function stopPlayback() {
    if (!out || !out.sources.size) return false;
    for (const src of out.sources) { try { src.stop(); } catch (_) { /* not started */ } }
    out.sources.clear();
    out.nextTime = 0;
    talk.playing = false;
    return true;
  }

  // -- microphone ------------------------------------------------------------------------------
  async function startMic() {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
    const ctx = new AudioContext({ sampleRate: RATE });
    const src = ctx.createMediaStreamSource(stream);
    const proc = ctx.createScriptProcessor(1024, 1, 1); // 1024 samples: ~43 ms packets
    proc.onaudioprocess = (e) => {
      if (!talk.open || (talk.mode === "hold" && !talk.holding)) return;
      const f = e.inputBuffer.getChannelData(0);
      const pcm = new Int16Array(f.length);
      for (let i = 0; i < f.length; i++) pcm[i] = Math.max(-32768, Math.min(32767, Math.round(f[i] * 32767)));
      send({ type: "input_audio_buffer.append", audio: b64(pcm) });
      talk.packetsSent += 1;
    };
    src.connect(proc);
    proc.connect(ctx.destination); // a ScriptProcessor runs only when connected; its output is silence
    mic = { stream, ctx, src, proc };
  }

  function stopMic() {
    if (!mic) return;
    mic.proc.disconnect();
    mic.src.disconnect();
    mic.stream.getTracks().forEach((t) => t.stop());
    mic.ctx.close();
    mic = null;
  }

  // -- the socket ------------------------------------------------------------------------------
  function onEvent(ev) {
    talk.events.push(ev.type);
    switch (ev.type) {
      case "input_audio_buffer.speech_started":
        talk.speaking = true;
        if (stopPlayback()) talk.playbackInterrupted += 1; // barge-in: silence the answer now
        break;
      case "input_audio_buffer.speech_stopped":
        talk.speaking = false;
        break;
      case "response.created":
        responding = true;
        talk.transcript = "";
        break;
      case "response.output_audio.delta":
        talk.audioDeltas += 1;
        play(toFloat32(ev.delta));
        break;
      case "response.output_audio_transcript.delta":
        talk.transcript += ev.delta;
        break;
      case "response.done":
        responding = false;
        talk.responses += 1;
        talk.lastStatus = ev.response.status;
        if (ev.response.status === "cancelled") talk.cancelled += 1;
        break;
      case "error":
        talk.error = ev.error.message;
        break;
      default:
        break;
    }
    render();
  }

  async function start() {
    const key = $("api-key").value.trim();
    const protocols = ["realtime"];
    if (key) protocols.push("openai-insecure-api-key." + key);
    talk.mode = $("talk-mode").value;
    talk.error = null;
    ws = new WebSocket(socketUrl(), protocols);
    ws.onmessage = (m) => onEvent(JSON.parse(m.data));
    ws.onclose = () => { talk.open = false; stopMic(); render(); };
    await new Promise((resolve, reject) => {
      ws.onopen = resolve;
      ws.onerror = () => reject(new Error("could not open the realtime socket"));
    });
    talk.open = true;
    const vad = talk.mode === "vad" ? { type: "server_vad", silence_duration_ms: 500 } : null;
    send({ type: "session.update", session: {
      type: "realtime", output_modalities: ["audio"],
      max_output_tokens: Number($("max-tokens").value) || 64,
      audio: { input: { turn_detection: vad }, output: { voice: $("voice").value } } } });
    await startMic();
    render();
  }

  function stop() {
    stopMic();
    stopPlayback();
    if (ws) ws.close();
    ws = null;
    talk.open = false;
    render();
  }

  function holdDown() {
    if (!talk.open || talk.mode !== "hold") return;
    if (responding) send({ type: "response.cancel" }); // interrupt the answer
    if (stopPlayback()) talk.playbackInterrupted += 1;
    send({ type: "input_audio_buffer.clear" });
    talk.holding = true;
    render();
  }

  function holdUp() {
    if (!talk.holding) return;
    talk.holding = false;
    send({ type: "input_audio_buffer.commit" });
    send({ type: "response.create" });
    render();
  }

  function render() {
    $("talk").textContent = talk.open ? "Stop talking" : "Talk";
    $("talk-hold").disabled = !talk.open || talk.mode !== "hold";
    $("talk-mode").disabled = talk.open;
    const what = !talk.open ? "closed"
      : talk.holding ? "listening (held)"
      : talk.speaking ? "hearing you"
      : talk.playing ? "answering" : "listening";
    $("talk-status").textContent = talk.error ? `error: ${talk.error}` : what;
    $("talk-transcript").textContent = talk.transcript;
  }

  $("talk").addEventListener("click", () => {
    if (talk.open) { stop(); return; }
    start().catch((e) => { talk.error = e.message || String(e); stop(); render(); });
  });
  const hold = $("talk-hold");
  hold.addEventListener("pointerdown", holdDown);
  hold.addEventListener("pointerup", holdUp);
  hold.addEventListener("pointerleave", holdUp);
  render();
})();
