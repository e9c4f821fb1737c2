"""Media in content parts: size limits on inline data, and the guarded fetch of remote URLs.

Inline media (base64 ``input_audio.data``, ``data:`` image URLs) is measured without decoding.
Remote ``http(s)`` URLs are refused unless ``security.allow_remote_media``. When allowed, a URL is
fetched only if its host is in ``security.allowed_media_hosts`` and every address the host
resolves to is public (no private, loopback, link-local, multicast or reserved address: the SSRF
guard); the connection goes to the address that was checked, so a second DNS answer cannot
differ (DNS rebinding). No redirects, no proxies from the environment, a time limit on the whole
fetch and a cap on the bytes read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable

import httpx

from omni_ray.config.serving import LimitsConfig, SecurityConfig
from omni_ray.ingress.api_models import ImageURLPart, InputAudioPart
from omni_ray.ingress.errors import bad_request

Resolver = Callable[[str, int], Awaitable[list[str]]]  # (host, port) -> IP address strings
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class MediaFetchError(Exception):
    """A remote media URL that is refused or could not be fetched (answered with a 400)."""


class MediaTooLarge(MediaFetchError):
    """The remote body is over the byte cap."""


# -- inline data ---------------------------------------------------------------------------------
def base64_size(data: str) -> int:
    """Decoded size of base64 ``data`` (whitespace ignored), without decoding it."""
    n = len(data) - sum(data.count(c) for c in " \t\r\n")
    pad = len(data.rstrip()) - len(data.rstrip().rstrip("="))
    return max(0, n * 3 // 4 - pad)


def data_url_size(url: str) -> int:
    """Decoded size of a ``data:[<type>][;base64],<data>`` URL's payload (percent-escapes: upper
    bound)."""
    header, _, payload = url.partition(",")
    return base64_size(payload) if header.lower().endswith(";base64") else len(payload)


def is_remote(url: str) -> bool:
    """An http(s) URL? Only the scheme is read: parsing the rest can raise (``http://[``), and
    a malformed remote URL is the fetch's to refuse, with a 400."""
    scheme, sep, _ = url.strip()[:16].partition(":")
    return bool(sep) and scheme.lower() in ("http", "https")


# -- the SSRF guard ------------------------------------------------------------------------------
def host_allowed(host: str, allowed: list[str]) -> bool:
    """``host`` equals an allowed name, or is a subdomain of a ``*.example.com`` entry."""
    host = host.lower().rstrip(".")
    for entry in allowed:
        if entry.startswith("*.") and host.endswith(entry[1:]) and host != entry[2:]:
            return True
        if host == entry:
            return True
    return False


def check_public_address(addr: str) -> None:
    """Raise ``MediaFetchError`` unless ``addr`` is a public unicast address.

    Addresses that embed an IPv4 one (IPv4-mapped, NAT64, 6to4, Teredo) are judged by it.
    """
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        raise MediaFetchError(f"not an IP address: {addr!r}") from None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif ip in _NAT64:
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        elif ip.sixtofour is not None:
            ip = ip.sixtofour
        elif ip.teredo is not None:
            ip = ip.teredo[1]
    blocked = (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast
               or ip.is_reserved or ip.is_unspecified or not ip.is_global)
    if blocked:
        raise MediaFetchError(f"the host resolves to a non-public address ({ip})")


async def system_resolve(host: str, port: int) -> list[str]:
    """The host's addresses from the system resolver, in its order."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


async def checked_address(host: str, port: int, allowed_hosts: list[str],
                          resolve: Resolver = system_resolve) -> str:
    """The address to connect to for ``host``: allowed host, every resolved address public."""
    if not host_allowed(host, allowed_hosts):
        raise MediaFetchError(f"host {host!r} is not in security.allowed_media_hosts")
    try:
        ipaddress.ip_address(host)
        addrs = [host]  # an IP literal needs no resolution
    except ValueError:
        try:
            addrs = await resolve(host, port)
        except OSError as e:
            raise MediaFetchError(f"cannot resolve {host!r}: {e}") from None
    if not addrs:
        raise MediaFetchError(f"cannot resolve {host!r}")
    for a in addrs:  # all of them: a mixed answer is refused as a whole
        check_public_address(a)
    return addrs[0]


# -- the fetch -----------------------------------------------------------------------------------
async def fetch_media(url: str, *, allowed_hosts: list[str], timeout_s: float, max_bytes: int,
                      resolve: Resolver = system_resolve,
                      transport: httpx.AsyncBaseTransport | None = None) -> bytes:
    """GET ``url`` through the SSRF guard; at most ``max_bytes`` bytes within ``timeout_s``."""
    try:
        target = httpx.URL(url)
    except httpx.InvalidURL as e:
        raise MediaFetchError(f"invalid URL: {e}") from None
    if target.scheme not in ("http", "https") or not target.host:
        raise MediaFetchError("only http(s) URLs with a host are fetched")
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        return await asyncio.wait_for(
            _download(target, port, allowed_hosts, max_bytes, resolve, transport, timeout_s),
            timeout_s)
    except asyncio.TimeoutError:
        raise MediaFetchError(f"timed out after security.media_fetch_timeout_s={timeout_s}") \
            from None
    except httpx.HTTPError as e:
        raise MediaFetchError(f"could not fetch: {type(e).__name__}") from None


async def _download(target: httpx.URL, port: int, allowed_hosts: list[str], max_bytes: int,
                    resolve: Resolver, transport, timeout_s: float) -> bytes:
    # 1) Check the host and pin the connection to the checked address.
    addr = await checked_address(target.host, port, allowed_hosts, resolve)
    pinned = target.copy_with(host=addr)
    headers = {"host": target.netloc.decode("ascii"), "accept-encoding": "identity"}
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    # 2) Read at most max_bytes; no redirects (their target would skip the guard).
    async with httpx.AsyncClient(transport=transport, trust_env=False, follow_redirects=False,
                                 timeout=timeout_s) as client:
        request = client.build_request("GET", pinned, headers=headers, extensions=extensions)
        response = await client.send(request, stream=True)
        try:
            if response.is_redirect:
                raise MediaFetchError("redirects are not followed")
            if response.status_code != 200:
                raise MediaFetchError(f"the server answered HTTP {response.status_code}")
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                raise MediaTooLarge(declared)
            data = bytearray()
            async for piece in response.aiter_raw():
                data += piece
                if len(data) > max_bytes:
                    raise MediaTooLarge(str(len(data)))
            return bytes(data)
        finally:
            await response.aclose()


# -- content parts -------------------------------------------------------------------------------
async def read_part(part, param: str, limits: LimitsConfig, security: SecurityConfig, *,
                    fetch=fetch_media) -> bytes:
    """The media bytes of one content part (``param`` names it, ``messages.N.content.M``):
    inline data decoded, a remote image fetched. Enforces the size limits and the remote-URL
    policy; raises a 400 ``APIError`` naming the limit, the policy or the malformed field."""
    from omni_ray.inputs.audio import decode_base64
    from omni_ray.inputs.errors import InputError
    from omni_ray.inputs.image import data_url_bytes

    try:
        if isinstance(part, InputAudioPart):
            p = f"{param}.input_audio.data"
            data = part.input_audio.data
            if is_remote(data):
                raise bad_request(f"{p}: must be base64 audio; URLs are not fetched", p,
                                  code="invalid_audio")
            n = base64_size(data)
            if n > limits.max_audio_bytes:
                raise bad_request(f"{p}: decoded audio is {n} bytes, over limits.max_audio_bytes="
                                  f"{limits.max_audio_bytes}", p, code="audio_too_large")
            return decode_base64(data)
        if not isinstance(part, ImageURLPart):
            raise TypeError(f"not a media part: {type(part).__name__}")
        p = f"{param}.image_url.url"
        url = part.image_url.url.strip()
        if url[:5].lower() == "data:":
            n = data_url_size(url)
            if n > limits.max_image_bytes:
                raise bad_request(f"{p}: decoded image is {n} bytes, over limits.max_image_bytes="
                                  f"{limits.max_image_bytes}", p, code="image_too_large")
            return data_url_bytes(url)
        if not is_remote(url):
            raise bad_request(f"{p}: only data: URLs (and http(s) URLs when "
                              "security.allow_remote_media is on) are accepted", p,
                              code="invalid_url")
        if not security.allow_remote_media:
            raise bad_request(f"{p}: remote media fetching is disabled "
                              "(security.allow_remote_media)", p, code="remote_media_disabled")
        cap, cap_name = min((limits.max_image_bytes, "limits.max_image_bytes"),
                            (security.max_media_fetch_bytes, "security.max_media_fetch_bytes"))
        try:
            return await fetch(url, allowed_hosts=security.allowed_media_hosts,
                               timeout_s=security.media_fetch_timeout_s, max_bytes=cap)
        except MediaTooLarge:
            raise bad_request(f"{p}: the image is over {cap_name}={cap}", p,
                              code="image_too_large") from None
        except MediaFetchError as e:
            raise bad_request(f"{p}: {e}", p, code="media_fetch_failed") from None
    except InputError as e:
        raise bad_request(f"{param}.{e.field}: {e.message}", f"{param}.{e.field}",
                          code=e.code) from None
