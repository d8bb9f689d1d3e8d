"""routerd lives in 32 MiB (MemoryHigh=24M): what it imports to start and to
route must not map OpenSSL's libcrypto (about 3-4 MiB), which hashlib and
hmac do. The system tier measures the RSS; this catches the import early."""

import subprocess
import sys

ROUTE = """
import sys
from syntrop.config import Paths
from syntrop.routerd.config import Config, ProviderConfig
from syntrop.routerd.gateway import Gateway
import syntrop.routerd.service
from syntrop.prefix import chain
local = ProviderConfig(id="local", kind="runtimed", models=("m",))
gateway = Gateway(Config(listen=(), providers=(local,)), Paths.from_environment())
gateway.registry.affinity.report("local", "m", [], 0, 2)
turns = chain([("system", "rules " * 200), ("user", "hi")])
assert gateway.router.route("m", chain=turns)[0].provider == "local"
print("_hashlib" in sys.modules)
"""


def test_starting_and_routing_do_not_load_libcrypto() -> None:
    result = subprocess.run([sys.executable, "-c", ROUTE], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "False", result.stdout + result.stderr
