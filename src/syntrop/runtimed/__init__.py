"""runtimed: Runs GGUF models with persistent sessions."""
