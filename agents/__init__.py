"""HCS agents."""
