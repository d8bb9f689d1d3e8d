"""Admission of requests to providers: triage traffic (sentry) and user
traffic wait in separate queues; a freed slot goes to triage first, and
`reserved` slots are triage's alone, so a flood of user requests never
delays triage."""

import asyncio
from collections import deque

TRIAGE, USER = "triage", "user"


class Admission:
    def __init__(self, limit: int, reserved: int) -> None:
        self.limit = max(1, limit)
        self.reserved = min(reserved, self.limit - 1)
        self.busy = {TRIAGE: 0, USER: 0}
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {TRIAGE: deque(), USER: deque()}

    def _fits(self, kind: str) -> bool:
        total = self.busy[TRIAGE] + self.busy[USER]
        if kind == TRIAGE:
            return total < self.limit
        return total < self.limit - self.reserved and not self.waiting[TRIAGE]

    def try_enter(self, kind: str) -> bool:
        """Take a slot now if one is free for `kind` and nobody waits."""
        if not self.waiting[kind] and self._fits(kind):
            self.busy[kind] += 1
            return True
        return False

    async def enter(self, kind: str) -> None:
        """Wait for a slot of `kind`'s queue (cancellable)."""
        if self.try_enter(kind):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[kind].append(future)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.leave(kind)  # granted as we were cancelled: give it back
            else:
                self.waiting[kind].remove(future)
            raise

    def leave(self, kind: str) -> None:
        self.busy[kind] -= 1
        self._wake()

    def _wake(self) -> None:
        for kind in (TRIAGE, USER):
            queue = self.waiting[kind]
            while queue and self._fits(kind):
                future = queue.popleft()
                if not future.done():
                    self.busy[kind] += 1
                    future.set_result(None)
