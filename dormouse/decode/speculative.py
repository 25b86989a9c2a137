"""Self-speculative decoding with the DSpark draft head (`dormouse generate --speculative`).

After each step the model has the distribution p of the next byte (its own head) and the hidden state
of the byte it stepped, the anchor. A round starts there: the model's byte b is drawn from p as plain
decoding draws it, and the draft head, fed the anchor byte and then b, drafts the k − 1 bytes after b
(`DraftHead.draft`), each from its own distribution q (the same temperature and top-k as p), fed the
one before. Verification steps the model over b and the drafts in order, as plain decoding steps
them; at each step the round's next draft d is accepted with probability min(1, p(d) / q(d)), else
the byte is drawn from max(0, p − q) renormalised (speculative sampling's rule: the byte is
distributed as p) and the round ends; a new round drafts from that step. Greedy (temperature 0) makes
p and q one-hot: a draft is accepted exactly when it is the model's argmax, so the output is plain
greedy decoding's, byte for byte. Sampling gives plain decoding's distribution, not its bytes.

Draws: a position's acceptance test and residual come from its `decode` stream, a drafted byte from
the `draft` stream of its position, so a decode is a pure function of (seed, settings).

Verification is one step per byte, not one forward over the k bytes: it saves no model compute (the
drafts cost extra). A one-forward verifier needs the cache rolled back to the last accepted byte and
logits equal to the steps' bit for bit, or greedy could flip on a near-tie (docs/known-issues.md).
"""

from dataclasses import dataclass

import torch

from dormouse import rng
from dormouse.decode.generate import Decoder, probabilities, sample
from dormouse.errors import DormouseError


@dataclass
class Acceptance:
    k: int  # the draft head's bytes per anchor: each round drafts k − 1 after the model's own byte
    rounds: int = 0  # rounds whose first draft was verified
    drafted: int = 0  # drafts verified
    accepted: int = 0  # drafts the rule accepted

    @property
    def rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_length(self) -> float:
        """Accepted drafts per round."""
        return self.accepted / self.rounds if self.rounds else 0.0

    def __str__(self) -> str:
        return (
            f"speculative: k={self.k}, {self.rounds} rounds, accepted {self.accepted} of {self.drafted} drafted "
            f"bytes (rate {self.rate:.2f}), mean accepted length {self.mean_length:.2f} per round"
        )


def verify(p: torch.Tensor, q: torch.Tensor, drafted: int, gen: torch.Generator) -> tuple[int, bool]:
    """Speculative sampling's rule for one drafted byte: p, q [256] the model's and the draft's distributions.
    Accepts with probability min(1, p(d) / q(d)), else draws from max(0, p − q) renormalised: the byte
    returned is distributed as p. Returns (byte, accepted)."""
    if torch.rand((), generator=gen) < p[drafted] / q[drafted]:  # q(d) > 0: d was drawn from q
        return drafted, True
    residual = (p - q).clamp_min(0)  # not all zero: p(d) < q(d) makes p ≠ q
    return int(torch.multinomial(residual.cpu(), 1, generator=gen)), False


class SpeculativeDecoder(Decoder):
    """A decode that drafts with the model's DSpark head and verifies every draft; greedy, its bytes and
    iterations are plain greedy decoding's."""

    def __init__(self, model, prompt: bytes, **settings):
        if model.draft is None:
            raise DormouseError("--speculative needs a DSpark draft head: this model was trained with dspark_weight 0")
        if model.draft.k < 2:
            raise DormouseError("--speculative needs dspark_k >= 2: with k = 1 the head drafts only the LM's own byte")
        super().__init__(model, prompt, **settings)
        self.acceptance = Acceptance(model.draft.k)
        self.pending: list[tuple[int, torch.Tensor]] = []  # the round's drafts not yet verified, with their q

    @torch.no_grad()
    def extend(self, n: int) -> tuple[bytes, list[int]]:
        produced, iterations = [], []
        for _ in range(n):
            anchor = self.last
            logits, self.cache = self.model.step(anchor, self.cache, **self.exit)
            iterations.append(self.cache.iterations)
            gen = rng.generator(self.seed, self.cache.position, "decode")
            if self.pending:  # this step verifies the round's next draft
                a = self.acceptance
                a.rounds += len(self.pending) == a.k - 1
                drafted, q = self.pending.pop(0)
                byte, agreed = verify(self._p(logits)[0], q, drafted, gen)
                a.drafted += 1
                a.accepted += agreed
                self.last = torch.tensor([byte], device=anchor.device)
            else:
                self.last, agreed = sample(logits, self.temperature, self.top_k, gen), False
            produced.append(int(self.last.item()))
            if not (agreed and self.pending):
                self.pending = self._draft(anchor)
        return bytes(produced), iterations

    def _p(self, logits: torch.Tensor) -> torch.Tensor:
        return probabilities(logits, self.temperature, self.top_k)

    def _draft(self, anchor: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """The k − 1 drafts after the model's byte (self.last), each drawn from its q, with q [256]."""
        position = self.cache.position  # the drafts take positions position + 1, position + 2, …

        def choose(logits, j):
            return sample(logits, self.temperature, self.top_k, rng.generator(self.seed, position + 1 + j, "draft"))

        head = self.model.draft
        drafts, logits = head.draft(self.cache.hidden, anchor, self.last, head.k - 1, choose)
        return [(int(d), self._p(logits[:, j])[0]) for j, d in enumerate(drafts[0])]
