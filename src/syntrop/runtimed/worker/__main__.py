"""`python -m syntrop.runtimed.worker`: one engine worker (loop.py)."""

import sys

from syntrop.runtimed.worker.loop import main

if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
