"""Bridges: families of environments generated from installed packages (reasoning-gym, TextArena)."""
