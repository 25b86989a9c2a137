"""JEPA: from the context before a masked span, predict the teacher's latent of the span.

Byte-level pre-training has no paired views, so the views are a span and what precedes it (a latent
multi-byte prediction). A span of w = jepa_span bytes starting at s is masked from the context by
causality: the context is the trunk's hidden state h[s − 1], which has read x[0..s − 1] only. The
teacher latent is the mean of the final-normed hidden states over the span, h[s..s + w − 1], under a
stop-gradient (no EMA copy): the term trains the predictor and, through h[s − 1], the trunk; never
the teacher side. Term: 1 − cos(prediction, teacher), mean over spans (LLM-JEPA's default distance).

Span starts are a pure function of (seed, step): `jepa_spans` distinct starts in [1, T − w] per row,
from the `jepa_mask` stream; the held-out eval draws from the `jepa_eval` stream with seed 0, so
every run is scored on the same spans.
"""

import torch
import torch.nn.functional as F
from torch import nn

from dormouse import rng
from dormouse.errors import DormouseError
from dormouse.model.init import linear, normal_init_
from dormouse.model.norm import RMSNorm


def fits(length: int, span: int, spans: int) -> bool:
    """Whether `spans` distinct span starts fit in [1, length − span]."""
    return length - span >= spans


def span_starts(
    seed: int, step: int, batch: int, length: int, span: int, spans: int, purpose: str = "jepa_mask"
) -> torch.Tensor:
    """[batch, spans] sorted distinct starts in [1, length − span], drawn from the (seed, step, purpose) stream."""
    if not fits(length, span, spans):
        raise DormouseError(f"{spans} JEPA spans of {span} bytes need sequences of at least {span + spans} bytes")
    keys = torch.rand(batch, length - span, generator=rng.generator(seed, step, purpose))
    return keys.argsort(-1)[:, :spans].sort(-1).values + 1


class Predictor(nn.Module):
    """RMSNorm → Linear → SiLU → Linear: the context's hidden state to a predicted span latent."""

    def __init__(self, d_model: int, *, eps: float, generator: torch.Generator):
        super().__init__()
        self.norm = RMSNorm(d_model, eps)
        self.up = linear(d_model, d_model)
        self.down = linear(d_model, d_model)
        for weight in (self.up.weight, self.down.weight):
            normal_init_(weight, generator)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(self.norm(h))))


def _rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x [B, T, d] at index [B, ...] (positions per row) -> [B, ..., d]."""
    flat = index.reshape(index.shape[0], -1)
    picked = x.gather(1, flat[..., None].expand(-1, -1, x.shape[-1]))
    return picked.reshape(*index.shape, x.shape[-1])


def teacher_latents(normed: torch.Tensor, starts: torch.Tensor, span: int) -> torch.Tensor:
    """The stop-gradient teacher latent of each span: mean of normed [B, T, d] over it -> [B, spans, d]."""
    positions = starts[..., None] + torch.arange(span, device=starts.device)
    return _rows(normed.detach(), positions).mean(-2)


def jepa_term(
    predictor: nn.Module, hidden: torch.Tensor, normed: torch.Tensor, starts: torch.Tensor | None, span: int
) -> torch.Tensor:
    """hidden [B, T, d] (the trunk's output), normed (its final-normed form), starts [B, spans] -> the term."""
    if starts is None:
        raise DormouseError("JEPA is on but this forward got no span starts, so no teacher latent: pass jepa_starts")
    starts = starts.to(hidden.device)
    prediction = predictor(_rows(hidden, starts - 1))
    teacher = teacher_latents(normed, starts, span)
    return (1 - F.cosine_similarity(prediction.float(), teacher.float(), dim=-1)).mean()
