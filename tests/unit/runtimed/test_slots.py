"""Slot accounting and the bounded queue."""

import asyncio

import pytest

from syntrop.runtimed.slots import Slots, SlotsBusy


def test_slots_queue_then_busy() -> None:
    async def main() -> None:
        slots = Slots(1, 1)
        await slots.acquire()
        assert slots.free == 0
        waiter = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        assert slots.queue_depth == 1
        with pytest.raises(SlotsBusy) as caught:
            await slots.acquire()
        assert caught.value.queue_depth == 1
        slots.release()
        await waiter
        assert slots.free == 0 and slots.queue_depth == 0
        slots.release()
        assert slots.free == 1

    asyncio.run(main())


def test_slots_cancelled_waiter_leaves_queue() -> None:
    async def main() -> None:
        slots = Slots(1, 4)
        await slots.acquire()
        waiter = asyncio.create_task(slots.acquire())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert slots.queue_depth == 0
        slots.release()
        assert slots.free == 1

    asyncio.run(main())


def test_slots_release_without_acquire_fails() -> None:
    with pytest.raises(RuntimeError):
        Slots(2, 0).release()
