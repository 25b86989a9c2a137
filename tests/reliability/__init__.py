"""Fault injection and bad inputs: what a user can do to a run directory, and what each is answered with."""
