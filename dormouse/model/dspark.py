"""DSpark draft head: at an anchor position p it drafts the next k bytes x[p+1..p+k] from h[p].

Anchors are p = 0, s, 2s, … (s = dspark_stride), n = floor((T − k − 1) / s) of them in a sequence of
T bytes (docs/glossary.md derives the count); a sequence with T < k + 1 + s has none and a term of
exactly zero. The window (the bytes fed to the head and the bytes it is scored on) is built from
input_ids, the teacher's input, never from the label sequence: fed labels, slot 0 would read the very
byte it predicts and learn to copy it. The term reads (input_ids, hidden, logits) and nothing else.

The head is semi-autoregressive, as DSpark's Markov head: slot j reads the state slot j − 1 left and
the byte before its target, x[p+j] (the anchor byte, then the teacher's bytes in training, the drafted
bytes at decode), and leaves the state slot j + 1 reads.
"""

import torch
import torch.nn.functional as F
from torch import nn

from dormouse.model.init import linear, normal_init_
from dormouse.model.norm import RMSNorm

VOCAB = 256
CE_WEIGHT, L1_WEIGHT = 0.1, 0.9  # DeepSpec's ce_loss_alpha and l1_loss_alpha


def anchors(length: int, k: int, stride: int, device=None) -> torch.Tensor:
    """The anchor positions of a sequence of `length` bytes: 0, stride, …, (n − 1)·stride. Made on the
    model's device: a CUDA graph's capture refuses a copy from unpinned host memory."""
    return torch.arange(max(0, (length - k - 1) // stride), device=device) * stride


def slots(positions: torch.Tensor, k: int) -> torch.Tensor:
    """[n, k]: p + j for anchor p and slot j, the position whose byte slot j is fed (on positions' device)."""
    return positions[:, None] + torch.arange(k, device=positions.device)


def window(input_ids: torch.Tensor, positions: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fed, target), each [B, n, k]: slot j of anchor p is fed x[p + j] and scored on x[p + j + 1]."""
    index = slots(positions, k)
    return input_ids[:, index], input_ids[:, index + 1]


class DraftHead(nn.Module):
    """Slot by slot: state ← state + W_out·SiLU(W_in·[RMSNorm(state); E[fed byte]]), logits = head(RMSNorm(state)).
    The first state is RMSNorm(h) of the trunk's hidden state at the anchor: the residual stream's scale
    grows with training, and an update added to it unnormed would vanish in the next norm."""

    def __init__(self, d_model: int, k: int, *, eps: float, generator: torch.Generator):
        super().__init__()
        self.k = k
        self.anchor_norm = RMSNorm(d_model, eps)
        self.byte = nn.Embedding(VOCAB, d_model, _weight=torch.empty(VOCAB, d_model))
        self.state_norm = RMSNorm(d_model, eps)
        self.w_in = linear(2 * d_model, d_model)
        self.w_out = linear(d_model, d_model)
        self.out_norm = RMSNorm(d_model, eps)
        self.head = linear(d_model, VOCAB)
        self.head._dormouse_route = "adamw_decay"  # an output head, not a hidden matrix (routing.py)
        for weight in (self.byte.weight, self.w_in.weight, self.w_out.weight, self.head.weight):
            normal_init_(weight, generator)

    def slot(self, state: torch.Tensor, fed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """state [..., d] and the fed byte [...] -> (logits [..., 256], the next slot's state)."""
        mixed = torch.cat([self.state_norm(state), self.byte(fed).to(state.dtype)], -1)
        state = state + self.w_out(F.silu(self.w_in(mixed)))
        return self.head(self.out_norm(state)), state

    def forward(self, h: torch.Tensor, fed: torch.Tensor) -> torch.Tensor:
        """h [B, n, d] at the anchors, fed [B, n, k] -> logits [B, n, k, 256] (teacher-forced slots)."""
        state, logits = self.anchor_norm(h), []
        for j in range(fed.shape[-1]):
            slot_logits, state = self.slot(state, fed[..., j])
            logits.append(slot_logits)
        return torch.stack(logits, -2)

    @torch.no_grad()
    def draft(self, h: torch.Tensor, anchor: torch.Tensor, first: torch.Tensor, count: int, choose=None):
        """(drafts [B, count], each slot's logits [B, count, 256]) of the bytes after `first`, at an anchor
        with hidden state h [B, d] and byte `anchor` [B]. Slot 0 would draft `first`, which decode already
        has from the LM head (exact): the head is fed it instead, and each later slot the byte drafted
        before it. `choose(logits, j)` picks slot j's byte (default: the argmax)."""
        _, state = self.slot(self.anchor_norm(h), anchor)
        fed, drafts, slot_logits = first, [], []
        for j in range(count):
            logits, state = self.slot(state, fed)
            fed = logits.argmax(-1) if choose is None else choose(logits, j)
            drafts.append(fed)
            slot_logits.append(logits)
        return torch.stack(drafts, -1), torch.stack(slot_logits, -2)


def dspark_term(
    head: DraftHead, input_ids: torch.Tensor, hidden: torch.Tensor, logits: torch.Tensor, *, stride: int, detach: bool
) -> torch.Tensor:
    """The DSpark term, mean over anchors and slots: 0.1 · CE(draft, x[p+j+1]) + 0.9 · ‖p_draft − p_teacher‖₁
    (DeepSpec's weights), the teacher being the model's own next-byte distribution at p + j, logits
    row p + j, detached. Exactly 0 when no window fits. `detach`: the term does not train the trunk."""
    positions = anchors(input_ids.shape[1], head.k, stride, hidden.device)
    if not len(positions):
        return torch.zeros((), device=hidden.device)
    fed, target = window(input_ids, positions, head.k)
    h = hidden[:, positions]
    draft = head(h.detach() if detach else h, fed).float()
    teacher = logits[:, slots(positions, head.k)]  # row p + j predicts x[p + j + 1]
    ce = F.cross_entropy(draft.reshape(-1, VOCAB), target.reshape(-1))
    l1 = (draft.softmax(-1) - teacher.detach().float().softmax(-1)).abs().sum(-1).mean()
    return CE_WEIGHT * ce + L1_WEIGHT * l1
