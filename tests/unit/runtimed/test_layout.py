"""The slot layout's thread arithmetic and turns (pure: no engine)."""

import threading
import time

import pytest

from syntrop.runtimed.layout import Pace


def test_auto_divides_the_cpus_among_active_generations() -> None:
    pace = Pace("auto", cpus=4)
    assert pace.threads() == 4  # nothing running: a newcomer gets them all
    with pace.running():
        assert pace.threads() == 4
        with pace.running():
            assert pace.threads() == 2
            with pace.running(), pace.running(), pace.running():
                assert pace.threads() == 1  # never less than one
    assert pace.active == 0
    assert Pace("auto", cpus=4).threads(limit=1) == 1  # a context's own cap


def test_instances_and_threads_are_fixed() -> None:
    assert Pace("instances", cpus=4).threads() == 1
    assert Pace("instances", cpus=4, instances=2).threads() == 2
    assert Pace("instances", cpus=2, instances=8).threads() == 1
    threads = Pace("threads", cpus=2)
    with threads.running(), threads.running():
        assert threads.threads() == 2


def test_threads_layout_lets_one_step_run_at_a_time() -> None:
    pace = Pace("threads", cpus=2)
    inside = 0
    most = 0
    lock = threading.Lock()

    def step() -> None:
        nonlocal inside, most
        for _ in range(20):
            with pace.turn():
                with lock:
                    inside += 1
                    most = max(most, inside)
                time.sleep(0.001)
                with lock:
                    inside -= 1

    workers = [threading.Thread(target=step) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert most == 1
    auto = Pace("auto", cpus=2)
    with auto.turn(), auto.turn():  # no gate: turns never wait
        pass


@pytest.mark.parametrize("layout, cpus, instances", [("batches", 2, 0), ("auto", -1, 0),
                                                     ("instances", 2, -1)])
def test_bad_layouts_are_refused(layout: str, cpus: int, instances: int) -> None:
    with pytest.raises(ValueError):
        Pace(layout, cpus=cpus, instances=instances)
