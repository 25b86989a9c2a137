"""fla's kernels, imported in one place (`kernels.py`), and their pinned configurations (`pin.py`,
`configs/`)."""
