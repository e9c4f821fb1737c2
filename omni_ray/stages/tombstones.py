"""Ids of requests aborted before their engine knew them, so that a late ``add`` is refused.

An abort can reach an engine before the request it aborts: the replica fires ``abort`` when it is
cancelled while its ``add_request`` call is still on its way (Ray does not order an async actor's
calls), or the ingress gives up between two stages. Without a record, the late ``add_request``
created a request nobody would ever read or abort (issue 18, item 10). Entries live ``ttl_s``
and at most ``max_size`` are kept (oldest dropped first): cost stays bounded under any traffic.
Ray-free and torch-free.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class Tombstones:
    def __init__(self, ttl_s: float = 120.0, max_size: int = 10_000,
                 clock: Callable[[], float] = time.monotonic):
        self.ttl_s, self.max_size, self._clock = ttl_s, max_size, clock
        self._ids: OrderedDict[str, float] = OrderedDict()  # request id -> time of the abort

    def add(self, request_id: str) -> None:
        self._expire()
        self._ids[request_id] = self._clock()
        self._ids.move_to_end(request_id)
        while len(self._ids) > self.max_size:
            self._ids.popitem(last=False)

    def take(self, request_id: str) -> bool:
        """Whether ``request_id`` was aborted before it was added (and forget it)."""
        self._expire()
        return self._ids.pop(request_id, None) is not None

    def __len__(self) -> int:
        self._expire()
        return len(self._ids)

    def _expire(self) -> None:
        limit = self._clock() - self.ttl_s
        while self._ids and next(iter(self._ids.values())) < limit:
            self._ids.popitem(last=False)
