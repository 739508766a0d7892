"""Stacks compose constructs; they hold no logic of their own."""
