"""The ops with a fast path, one package each: `reference.py` the plain torch definition, the fast
implementations beside it (`triton.py` with `fused.py`, or `fla.py`), the entry function in the
package's `__init__.py`; `registry.py` chooses which backend runs (docs/architecture.md)."""
