"""HCS healer."""
