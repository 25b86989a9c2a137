"""dormouse: a byte-level language-model research trainer on PyTorch."""

__version__ = "0.1.0"
