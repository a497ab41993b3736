"""App-server runs: ``run/start`` and ``run/interrupt`` (filled in below)."""
