"""HCS scheduler."""
