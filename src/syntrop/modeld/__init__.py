"""modeld: The content-addressed model store."""
