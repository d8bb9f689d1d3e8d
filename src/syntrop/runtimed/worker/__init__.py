"""What runs only in an engine worker process: its loop (loop.py), one
model's llama.cpp state (host.py, engine.py, pool.py) and the decoding
modules they drive. Nothing here imports runtimed's face; the two sides
share only their messages (syntrop.runtimed.protocol) and a few pure
leaf modules (cpu, layout, sampling, sessions, constrain)."""
