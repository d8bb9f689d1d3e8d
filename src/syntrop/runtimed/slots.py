"""Slot accounting: a fixed number of concurrent engine contexts and a
bounded queue of waiters. A request beyond capacity waits; beyond the queue,
it is refused at once (`SlotsBusy`) rather than piling up.

An open session holds one slot for its lifetime (its KV cache is resident);
a completion or chat stream holds one while it runs.
"""

import asyncio
import collections


class SlotsBusy(Exception):
    """Every slot is taken and the queue is full."""

    def __init__(self, queue_depth: int) -> None:
        super().__init__(f"busy: {queue_depth} waiting")
        self.queue_depth = queue_depth


class Slots:
    def __init__(self, total: int, queue_limit: int) -> None:
        if total < 1 or queue_limit < 0:
            raise ValueError("need at least one slot and a non-negative queue")
        self.total = total
        self.queue_limit = queue_limit
        self._used = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def free(self) -> int:
        return self.total - self._used

    @property
    def queue_depth(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        """Take a slot, waiting in the queue if none is free."""
        if self._used < self.total and not self._waiters:
            self._used += 1
            return
        if len(self._waiters) >= self.queue_limit:
            raise SlotsBusy(len(self._waiters))
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                # Handed a slot just as we were cancelled: pass it on.
                self.release()
            else:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a slot back: to the first waiter, else to the pool. Must run
        on the event loop's thread."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        if self._used <= 0:
            raise RuntimeError("release without acquire")
        self._used -= 1
