"""Circuit breakers, pressure-aware offload and the triage/user queues:
pure logic, with injected clocks and PSI readings."""

import asyncio

import pytest

from syntrop.routerd.config import ProviderConfig
from syntrop.routerd.pressure import Pressure, read_memory_some
from syntrop.routerd.queues import TRIAGE, USER, Admission
from syntrop.routerd.scoring import Breaker, candidates

LOCAL = ProviderConfig(id="local", kind="runtimed", tier="local", models=("m",), capability=40)
LAN = ProviderConfig(id="lan", kind="openai", endpoint="http://h/v1", tier="lan",
                     models=("m",), capability=40)
REMOTE = ProviderConfig(id="remote", kind="openai", endpoint="http://r/v1", tier="remote",
                        models=("m",), cost=3, capability=95)
PROVIDERS = (LOCAL, LAN, REMOTE)


def test_breaker_opens_doubles_and_probes_half_open_one_at_a_time() -> None:
    breaker = Breaker()
    assert breaker.state(0) == "closed" and breaker.acquire(0)
    breaker.failure(now=100.0)
    assert breaker.state(104.9) == "open" and not breaker.admits(104.9)
    assert breaker.state(105.0) == "half-open"
    assert breaker.acquire(105.0)          # the probe
    assert not breaker.acquire(105.1)      # a second request waits for its verdict
    breaker.failure(now=106.0)             # the probe failed: open again, longer
    assert breaker.open_until == 116.0
    assert breaker.acquire(116.0)
    breaker.success()
    assert breaker.state(116.0) == "closed" and breaker.acquire(116.0) and breaker.acquire(116.0)
    for _ in range(10):
        breaker.failure(now=0.0)
    assert breaker.open_until == 60.0      # at most 60 s


def test_breaker_release_without_verdict_lets_the_next_probe_in() -> None:
    breaker = Breaker()
    breaker.failure(now=0.0)
    assert breaker.acquire(10.0)
    breaker.release()
    assert breaker.acquire(10.0)


def test_breakers_are_per_provider_and_model() -> None:
    twin = ProviderConfig(id="local", kind="runtimed", tier="local", models=("m", "n"))
    breakers = {("local", "m"): Breaker()}
    breakers[("local", "m")].failure(now=0.0)
    got = {c.model: c.cooling for c in candidates("router:fast", (twin,), {}, now=1.0,
                                                  breakers=breakers)}
    assert got == {"m": True, "n": False}


def test_cooling_candidates_go_last_with_their_retry_time() -> None:
    breakers = {("local", "m"): Breaker()}
    breakers[("local", "m")].failure(now=0.0)
    order = candidates("m", PROVIDERS, {}, now=1.0, breakers=breakers)
    assert [c.provider for c in order][-1] == "local"
    assert order[-1].cooling and order[-1].retry_at == 5.0


def test_throttled_local_goes_after_lan_and_remote_but_stays() -> None:
    calm = candidates("m", PROVIDERS, {}, now=0.0, breakers={})
    assert calm[0].provider == "local"
    pressed = candidates("m", PROVIDERS, {}, now=0.0, breakers={}, throttle_local=True)
    assert [c.provider for c in pressed] == ["lan", "remote", "local"]
    assert pressed[-1].throttled
    alone = candidates("m", (LOCAL,), {}, now=0.0, breakers={}, throttle_local=True)
    assert [c.provider for c in alone] == ["local"]


def test_pressure_threshold_with_injected_readings() -> None:
    readings = iter([10.0, 40.0, 40.0, 5.0])
    clock = [0.0]
    pressure = Pressure(25.0, read=lambda: next(readings), interval=1.0,
                        clock=lambda: clock[0])
    assert not pressure.high()
    clock[0] = 0.5
    assert not pressure.high()             # cached for a second
    clock[0] = 1.0
    assert pressure.high() and pressure.memory_some() == 40.0
    clock[0] = 2.0
    assert pressure.high()
    clock[0] = 3.0
    assert not pressure.high()             # pressure fell: back to local


def test_psi_file_is_parsed_and_a_missing_one_is_zero(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "memory"  # type: ignore[operator]
    path.write_text("some avg10=31.50 avg60=2.00 avg300=0.50 total=123\n"
                    "full avg10=1.00 avg60=0.00 avg300=0.00 total=4\n")
    assert read_memory_some(str(path)) == 31.5
    assert read_memory_some(str(path) + ".absent") == 0.0


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_triage_goes_first_and_has_reserved_slots() -> None:
    async def main() -> dict[str, int]:
        admission = Admission(limit=3, reserved=1)
        await admission.enter(USER)
        await admission.enter(USER)
        # The third slot is triage's alone: a user request waits.
        user = asyncio.create_task(admission.enter(USER))
        await _settle()
        assert not user.done()
        await admission.enter(TRIAGE)          # straight in, users waiting or not
        triage = asyncio.create_task(admission.enter(TRIAGE))
        await _settle()
        assert not triage.done()
        admission.leave(USER)                  # one slot frees: triage's waiter first
        await _settle()
        assert triage.done() and not user.done()
        admission.leave(TRIAGE)
        await _settle()
        assert not user.done()                 # the free slot is the reserved one
        admission.leave(TRIAGE)
        await _settle()
        assert user.done()
        return admission.busy

    assert asyncio.run(main()) == {TRIAGE: 0, USER: 2}


def test_a_cancelled_waiter_gives_nothing_away() -> None:
    async def main() -> dict[str, int]:
        admission = Admission(limit=1, reserved=0)
        await admission.enter(USER)
        waiter = asyncio.create_task(admission.enter(USER))
        await asyncio.sleep(0)
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        admission.leave(USER)
        await admission.enter(USER)
        return admission.busy

    assert asyncio.run(main()) == {TRIAGE: 0, USER: 1}
