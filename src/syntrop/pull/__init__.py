"""syn pull's client side: registries (Hugging Face-style, ollama-style, plain
https) and the transfer with in-flight hashing and resume. It runs in the
syn command, not in modeld: modeld receives the bytes over a pipe (Pull), so
the daemon holds no HTTP client (httpx never inside a daemon package)."""
