"""Inspection: what the compiler really did (collectives, memory, FLOPs, layouts)."""
