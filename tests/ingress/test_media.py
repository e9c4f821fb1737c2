"""omni_ray/ingress/media.py without network: sizes of inline media, the SSRF guard (resolution
injected), the pinned fetch (httpx.MockTransport) and the content-part policy."""

from __future__ import annotations

import asyncio
import base64

import httpx
import pytest

from omni_ray.config.serving import LimitsConfig, SecurityConfig
from omni_ray.ingress import media
from omni_ray.ingress.api_models import ImageURL, ImageURLPart, InputAudio, InputAudioPart
from omni_ray.ingress.errors import APIError

PUBLIC_V4, PUBLIC_V6 = "93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"


def run(coro):
    return asyncio.run(coro)


def resolver(table: dict[str, list[str]], calls: list | None = None):
    async def resolve(host, port):
        if calls is not None:
            calls.append((host, port))
        if host not in table:
            raise OSError("no such host")
        return table[host]
    return resolve


# -- inline sizes --------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 100, 1001])
def test_base64_size_is_the_decoded_size(n):
    data = base64.b64encode(bytes(n)).decode()
    assert media.base64_size(data) == n
    assert media.base64_size(data[:40] + "\n" + data[40:] + "\n") == n
    assert media.data_url_size(f"data:image/png;base64,{data}") == n


@pytest.mark.parametrize("url, remote", [
    ("http://example.com/a.png", True), ("HTTPS://example.com/a.png", True),
    (" https://example.com", True), ("data:image/png;base64,AAAA", False),
    ("file:///etc/passwd", False), ("ftp://example.com/x", False), ("UklGRiQAAABXQVZF", False),
    # were a 500 ("Invalid IPv6 URL"): remote, and refused by the fetch with a 400
    ("http://[::ffff:127.0.0.1]:8000/", True), ("http://[", True), ("http", False),
])
def test_is_remote(url, remote):
    assert media.is_remote(url) is remote


# -- the SSRF guard ------------------------------------------------------------------------------
@pytest.mark.parametrize("addr", [PUBLIC_V4, "8.8.8.8", PUBLIC_V6, "::ffff:8.8.8.8"])
def test_public_addresses_pass(addr):
    media.check_public_address(addr)


@pytest.mark.parametrize("addr", [
    "127.0.0.1", "127.1.2.3", "10.0.0.1", "172.16.5.4", "192.168.1.1",  # loopback, private
    "169.254.169.254", "0.0.0.0", "100.64.0.1", "224.0.0.1", "240.0.0.1",  # metadata, CGNAT...
    "255.255.255.255", "::1", "::", "fe80::1", "fc00::1", "fd12:3456::1", "ff02::1",
    "::ffff:127.0.0.1", "::ffff:169.254.169.254",  # IPv4-mapped
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "fe80::1%eth0", "not-an-ip",
])
def test_non_public_addresses_are_refused(addr):
    with pytest.raises(media.MediaFetchError):
        media.check_public_address(addr)


@pytest.mark.parametrize("host, allowed, ok", [
    ("img.example.com", ["img.example.com"], True),
    ("IMG.Example.COM.", ["img.example.com"], True),
    ("cdn.example.com", ["*.example.com"], True),
    ("a.b.example.com", ["*.example.com"], True),
    ("example.com", ["*.example.com"], False),  # the wildcard is for subdomains only
    ("evilexample.com", ["*.example.com"], False),
    ("example.com.evil.net", ["example.com", "*.example.com"], False),
    ("other.org", [], False),
    ("img.example.com", [], False),  # an empty allow-list allows nothing
])
def test_host_allow_list(host, allowed, ok):
    assert media.host_allowed(host, allowed) is ok


def test_checked_address_resolves_and_checks_every_answer():
    calls = []
    resolve = resolver({"img.example.com": [PUBLIC_V4, PUBLIC_V6],
                        "mixed.example.com": [PUBLIC_V4, "10.0.0.7"],
                        "meta.example.com": ["169.254.169.254"],
                        "empty.example.com": []}, calls)
    allowed = ["*.example.com"]
    assert run(media.checked_address("img.example.com", 443, allowed, resolve)) == PUBLIC_V4
    assert calls == [("img.example.com", 443)]
    for host in ("mixed.example.com", "meta.example.com", "empty.example.com", "gone.example.com"):
        with pytest.raises(media.MediaFetchError):
            run(media.checked_address(host, 443, allowed, resolve))


def test_host_outside_the_allow_list_is_never_resolved():
    calls = []
    with pytest.raises(media.MediaFetchError, match="allowed_media_hosts"):
        run(media.checked_address("evil.net", 80, ["example.com"], resolver({}, calls)))
    assert calls == []


def test_ip_literals_need_the_allow_list_and_a_public_address():
    calls = []
    resolve = resolver({}, calls)
    assert run(media.checked_address(PUBLIC_V4, 80, [PUBLIC_V4], resolve)) == PUBLIC_V4
    with pytest.raises(media.MediaFetchError):
        run(media.checked_address("127.0.0.1", 80, ["127.0.0.1"], resolve))
    with pytest.raises(media.MediaFetchError):
        run(media.checked_address("8.8.8.8", 80, [PUBLIC_V4], resolve))
    assert calls == []


# -- the fetch (MockTransport: no network) -------------------------------------------------------
def streamed(body: bytes) -> httpx.Response:
    """A 200 whose body is read from a stream, as a real transport's is."""
    return httpx.Response(200, stream=httpx.ByteStream(body))


def fetch(url, handler, *, table=None, max_bytes=1000, timeout_s=2.0, allowed=("*.example.com",)):
    table = table if table is not None else {"img.example.com": [PUBLIC_V4]}
    return run(media.fetch_media(url, allowed_hosts=list(allowed), timeout_s=timeout_s,
                                 max_bytes=max_bytes, resolve=resolver(table),
                                 transport=httpx.MockTransport(handler)))


def test_fetch_connects_to_the_checked_address_with_the_original_host():
    seen = []

    def handler(request: httpx.Request):
        seen.append(request)
        return streamed(b"png-bytes")

    assert fetch("https://img.example.com:8443/a.png?x=1", handler) == b"png-bytes"
    req = seen[0]
    assert req.url.host == PUBLIC_V4 and req.url.port == 8443 and req.url.path == "/a.png"
    assert req.headers["host"] == "img.example.com:8443"
    assert req.extensions["sni_hostname"] == "img.example.com"  # TLS checks the real name


def test_fetch_ipv6_address_is_bracketed():
    seen = []

    def handler(request):
        seen.append(request)
        return streamed(b"x")

    fetch("http://img.example.com/a.png", handler, table={"img.example.com": [PUBLIC_V6]})
    assert seen[0].url.host == PUBLIC_V6 and seen[0].headers["host"] == "img.example.com"


def test_fetch_refuses_private_answers_before_connecting():
    def handler(request):
        raise AssertionError("must not connect")

    with pytest.raises(media.MediaFetchError, match="non-public"):
        fetch("http://img.example.com/a.png", handler, table={"img.example.com": ["127.0.0.1"]})
    with pytest.raises(media.MediaFetchError, match="allowed_media_hosts"):
        fetch("http://169.254.169.254/latest/meta-data/", handler)
    with pytest.raises(media.MediaFetchError, match="http"):
        fetch("file:///etc/passwd", handler)


def test_fetch_does_not_follow_redirects():
    def handler(request):
        return httpx.Response(302, headers={"location": "http://127.0.0.1/"})

    with pytest.raises(media.MediaFetchError, match="redirect"):
        fetch("http://img.example.com/a.png", handler)


def test_fetch_caps_the_size_declared_or_streamed():
    with pytest.raises(media.MediaTooLarge):
        fetch("http://img.example.com/a.png", lambda r: httpx.Response(200, content=bytes(1001)))

    async def endless():
        while True:
            yield bytes(300)

    with pytest.raises(media.MediaTooLarge):  # no content-length: counted while reading
        fetch("http://img.example.com/a.png", lambda r: httpx.Response(200, content=endless()))


def test_fetch_errors_and_timeout():
    with pytest.raises(media.MediaFetchError, match="HTTP 404"):
        fetch("http://img.example.com/a.png", lambda r: httpx.Response(404))

    def refused(request):
        raise httpx.ConnectError("refused")

    with pytest.raises(media.MediaFetchError, match="ConnectError"):
        fetch("http://img.example.com/a.png", refused)

    async def slow(request):
        await asyncio.sleep(5)
        return httpx.Response(200)

    with pytest.raises(media.MediaFetchError, match="media_fetch_timeout_s"):
        fetch("http://img.example.com/a.png", slow, timeout_s=0.2)


# -- content parts -------------------------------------------------------------------------------
def image(url):
    return ImageURLPart(type="image_url", image_url=ImageURL(url=url))


def audio(n):
    return InputAudioPart(type="input_audio",
                          input_audio=InputAudio(data=base64.b64encode(bytes(n)).decode(),
                                                 format="wav"))


def check(part, limits=None, security=None, fetch=None):
    kw = {"fetch": fetch} if fetch else {}
    return run(media.read_part(part, "messages.1.content.2", limits or LimitsConfig(),
                                security or SecurityConfig(), **kw))


def test_remote_image_is_refused_by_default_naming_the_url():
    with pytest.raises(APIError) as e:
        check(image("https://example.com/cat.png"))
    assert e.value.status == 400 and e.value.param == "messages.1.content.2.image_url.url"
    assert "remote media fetching is disabled" in e.value.message


@pytest.mark.parametrize("url", ["file:///etc/passwd", "gopher://x", "/relative.png"])
def test_other_url_schemes_are_refused(url):
    with pytest.raises(APIError) as e:
        check(image(url))
    assert e.value.param == "messages.1.content.2.image_url.url"


def test_inline_media_limits_name_the_limit():
    lim = LimitsConfig(max_audio_bytes=100, max_image_bytes=50)
    check(audio(100), lim)
    check(image("data:image/png;base64," + base64.b64encode(bytes(50)).decode()), lim)
    with pytest.raises(APIError) as e:
        check(audio(101), lim)
    assert e.value.param == "messages.1.content.2.input_audio.data"
    assert "limits.max_audio_bytes=100" in e.value.message
    with pytest.raises(APIError) as e:
        check(image("data:image/png;base64," + base64.b64encode(bytes(51)).decode()), lim)
    assert "limits.max_image_bytes=50" in e.value.message


def test_remote_fetch_when_enabled_uses_the_smaller_cap():
    calls = []

    async def fake_fetch(url, **kw):
        calls.append((url, kw))
        return b"img"

    sec = SecurityConfig(allow_remote_media=True, allowed_media_hosts=["img.example.com"],
                         max_media_fetch_bytes=4096, media_fetch_timeout_s=3)
    check(image("https://img.example.com/a.png"), LimitsConfig(max_image_bytes=1000), sec,
          fake_fetch)
    assert calls == [("https://img.example.com/a.png",
                      {"allowed_hosts": ["img.example.com"], "timeout_s": 3, "max_bytes": 1000})]

    async def too_big(url, **kw):
        raise media.MediaTooLarge("5000")

    with pytest.raises(APIError) as e:
        check(image("https://img.example.com/a.png"), LimitsConfig(), sec, too_big)
    assert "security.max_media_fetch_bytes=4096" in e.value.message

    async def refused(url, **kw):
        raise media.MediaFetchError("the host resolves to a non-public address (10.0.0.1)")

    with pytest.raises(APIError) as e:
        check(image("https://img.example.com/a.png"), LimitsConfig(), sec, refused)
    assert e.value.status == 400 and "non-public" in e.value.message
