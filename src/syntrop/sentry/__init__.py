"""systemd-sentry: Watches systemd and drives the triage loop."""
