"""inferenced: Discovers compute planes and leases them by priority."""
