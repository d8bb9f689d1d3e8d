"""contextd: Knows what changed on the host."""
