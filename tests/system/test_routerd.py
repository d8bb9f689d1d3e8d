"""routerd through its installed units: the HTTP ingress of routerd.socket
(127.0.0.1:32768, [::1]:32768, /run/syntrop/router.sock) activates routerd,
which serves HTTP on the sockets systemd passed and Varlink beside them;
the time from a cold activation to the first 200 is measured."""

import json

import pytest

from tests.system.instance import Instance, wait_until

#: Seconds from connecting to a cold routerd.socket to the first 200 (issue
#: 10: 150 ms on its reference machine; this host is shared and slower).
COLD_START_LIMIT = 1.5


def _curl(instance: Instance, *args: str) -> tuple[str, str]:
    result = instance.run(["curl", "-sS", "--max-time", "20", "-w", "\n%{http_code} %{time_total}",
                           *args], check=False)
    assert result.returncode == 0, result.stderr
    body, _, tail = result.stdout.rpartition("\n")
    return body, tail


@pytest.fixture
def cold(instance: Instance) -> Instance:
    if instance.run(["sh", "-c", "command -v curl"], check=False).returncode:
        pytest.skip("curl is not installed")
    instance.systemctl("stop", "routerd.service")
    instance.systemctl("restart", "routerd.socket")
    instance.wait_for_unit("routerd.service", ActiveState="inactive")
    return instance


def test_http_ingress_is_socket_activated(cold: Instance) -> None:
    body, tail = _curl(cold, "http://127.0.0.1:32768/health")
    code, seconds = tail.split()
    assert code == "200", body
    assert json.loads(body)["status"] == "ok"
    print(f"routerd cold start to first 200 (installed unit): {float(seconds) * 1000:.0f} ms")
    assert float(seconds) < COLD_START_LIMIT
    cold.wait_for_unit("routerd.service", ActiveState="active")
    main_pid = cold.show("routerd.service", "MainPID")["MainPID"]
    for url in ("http://[::1]:32768/v1/models", "--unix-socket"):
        args = ["--unix-socket", "/run/syntrop/router.sock", "http://x/v1/models"] if (
            url == "--unix-socket") else [url]
        body, tail = _curl(cold, *args)
        assert tail.split()[0] == "200", body
        assert {m["id"] for m in json.loads(body)["data"]} >= {"router:fast"}
    # One process serves all of them, and Varlink beside them.
    assert cold.show("routerd.service", "MainPID")["MainPID"] == main_pid
    status = cold.call("io.syntrop.Router1", "GetStatus")
    assert set(status["ingress"]) == {"127.0.0.1:32768", "[::1]:32768",
                                      "unix:/run/syntrop/router.sock"}
    rss = status["rss_bytes"] / (1 << 20)
    print(f"routerd VmRSS under the installed unit: {rss:.1f} MiB")
    assert rss < 24, "over MemoryHigh=24M"
    wait_until("routerd's journal", lambda: "HTTP on" in cold.journal("routerd.service"), 10)
