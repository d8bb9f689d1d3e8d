"""routerd: Routes OpenAI-style requests between providers."""
