"""Package data: profiles.yaml (the device profile database)."""
