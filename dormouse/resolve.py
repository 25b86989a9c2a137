"""A config made concrete: `config.resolve_values`, then the kernel backend of each op for the device.

The backend policies live beside their ops in dormouse/model/; this module applies them to a config so that
config.py stays data (it imports nothing from the model).
"""

from dormouse.config import Config, resolve_values
from dormouse.model.kda import resolve_kda_backend
from dormouse.model.norm import resolve_norm_backend
from dormouse.model.short_conv import check_fused_width, resolve_conv_backend
from dormouse.model.swiglu import resolve_swiglu_backend


def resolve(cfg: Config, *, cuda_available: bool | None = None) -> Config:
    """One concrete config: derived sizes filled in, `auto` choices decided, contradictions refused. A backend
    that cannot run is refused through its ledger site."""
    out = resolve_values(cfg, cuda_available=cuda_available)
    m, device = out.model, out.train.device
    if m.mixer == "kda":
        m.kda_backend = resolve_kda_backend(m.kda_backend, device)
        if m.short_conv:
            m.conv_backend = resolve_conv_backend(m.conv_backend, device)
            check_fused_width(m.conv_backend, m.conv_size)
    m.norm_backend = resolve_norm_backend(m.norm_backend, device)
    m.swiglu_backend = resolve_swiglu_backend(m.swiglu_backend, device)
    return out
