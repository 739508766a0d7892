"""Command-line helpers behind the Makefile targets."""
