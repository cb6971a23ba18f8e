"""HCS injector."""
