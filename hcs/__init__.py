"""HCS hcs."""
