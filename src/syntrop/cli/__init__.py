"""Command-line tools: syn and routerctl."""
