"""Backends chosen by a test: ops/registry.py made to resolve the named ops as the test says, so the CPU
tests run an op's fused path on stand-in kernels."""

from dormouse.ops import registry


def force(monkeypatch, chosen: dict[str, str | None]) -> None:
    """Resolve each op named in `chosen` to its backend there (None: to the value asked for); every other
    op as the registry does."""
    real = registry.resolve

    def resolve(name, requested, device):
        if name in chosen:
            return requested if chosen[name] is None else chosen[name]
        return real(name, requested, device)

    monkeypatch.setattr(registry, "resolve", resolve)
