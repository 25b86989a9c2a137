"""Self-speculative decoding with the DSpark draft head (`dormouse generate --speculative`).

The decode keeps the model's cache over every byte so far, the distribution p of the next byte (the
head's logits at the last byte) and the hidden state there, the anchor. A round: the model's byte b is
drawn from p as plain decoding draws it; the draft head, fed the anchor byte and then b, drafts the
k − 1 bytes after b (`DraftHead.draft`), each from its own distribution q (the same temperature and
top-k as p), fed the one before. One forward of the model from the cache over [b, drafts] gives p at
every one of them; in order, draft d is accepted with probability min(1, p(d) / q(d)), else the byte
is drawn from max(0, p − q) renormalised (speculative sampling's rule: the byte is distributed as p)
and the round ends. When every draft is accepted the forward's cache is the new one; otherwise a
second forward from the round's start over the accepted bytes and the correction makes it (the cache
of the rejected drafts is dropped, never patched). Greedy (temperature 0) makes p and q one-hot: a
draft is accepted exactly when it is the forward's argmax.

Equal to plain decoding: plain decoding reads p from `step()`, one byte at a time; the verifier from a
forward over several bytes, which sums in another order (the chunked KDA form, attention over the
block). The logits agree to float rounding (~1e-6 relative in fp32), so greedy output is plain greedy
output unless two bytes tie that closely (tests/test_speculative.py checks equality on a model whose
choices are not near-ties); sampling gives plain decoding's distribution, not its bytes. The forwards
run the full loop depth: `--gen-max-iter` and `--exit-threshold` (a per-byte choice) are refused with
`--speculative`.

Draws: a position's acceptance test and residual come from its `decode` stream, a drafted byte from
the `draft` stream of its position, so a decode is a pure function of (seed, settings).
"""

from dataclasses import dataclass

import torch

from dormouse import rng
from dormouse.decode.decoder import Decoder, probabilities, sample
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
    """A decode that drafts with the model's DSpark head and verifies each round's drafts with one forward
    (module docstring); greedy, its bytes are plain greedy decoding's."""

    def __init__(self, model, prompt: bytes, **settings):
        if model.draft is None:
            raise DormouseError("--speculative needs a DSpark draft head: this model was trained with dspark_weight 0")
        if model.draft.k < 2:
            raise DormouseError("--speculative needs dspark_k >= 2: with k = 1 the head drafts only the LM's own byte")
        if settings.get("max_iter") not in (None, model.cfg.depth) or settings.get("exit_threshold", 1.0) < 1:
            raise DormouseError(
                "--speculative verifies drafts with full-depth forwards over several bytes: --gen-max-iter "
                "and --exit-threshold (a depth chosen per byte) do not apply to it"
            )
        super().__init__(model, prompt, **settings)
        self.acceptance = Acceptance(model.draft.k)
        self._feed(self.cache, [int(self.last)])  # from here on the cache holds every byte so far

    @torch.no_grad()
    def extend(self, n: int) -> tuple[bytes, list[int]]:
        produced = []
        while len(produced) < n:
            produced += self._round(n - len(produced))
        return bytes(produced), [self.model.cfg.depth] * n

    def _round(self, budget: int) -> list[int]:
        """One round: the model's byte and the drafts it accepts (at most `budget` bytes in all)."""
        start, position = self.cache, self.cache.position  # the round's first byte takes sequence index `position`
        b = int(sample(self.logits, self.temperature, self.top_k, rng.generator(self.seed, position, "decode")))
        drafts = self._draft(b, position)[: budget - 1] if budget > 1 else []
        if not drafts:
            self._feed(start, [b])
            return [b]
        out = self.model(
            torch.tensor([[b, *(d for d, _ in drafts)]], device=self.last.device), cache=start, return_cache=True
        )
        a = self.acceptance
        a.rounds += 1
        kept = [b]
        for j, (drafted, q) in enumerate(drafts):  # the forward's row j is p of the byte after input j
            byte, agreed = verify(
                self._p(out.logits[:, j])[0], q, drafted, rng.generator(self.seed, position + 1 + j, "decode")
            )
            a.drafted += 1
            a.accepted += agreed
            kept.append(byte)
            if not agreed:  # a correction: the cache is rebuilt from the round's start
                self._feed(start, kept)
                return kept
        self.cache, self.logits, self.last = (
            out.cache,
            out.logits[:, -1],
            torch.tensor([kept[-1]], device=self.last.device),
        )
        return kept

    def _feed(self, cache, data: list[int]) -> None:
        """Run `data` through the model from `cache`: the new cache, the next byte's logits, the last byte."""
        out = self.model(torch.tensor([data], device=self.last.device), cache=cache, return_cache=True)
        self.cache, self.logits, self.last = (
            out.cache,
            out.logits[:, -1],
            torch.tensor([data[-1]], device=self.last.device),
        )

    def _p(self, logits: torch.Tensor) -> torch.Tensor:
        return probabilities(logits, self.temperature, self.top_k)

    def _draft(self, b: int, position: int) -> list[tuple[int, torch.Tensor]]:
        """The k − 1 drafts after the model's byte b (at sequence index `position`), each with its q [256]."""

        def choose(logits, j):
            return sample(logits, self.temperature, self.top_k, rng.generator(self.seed, position + 1 + j, "draft"))

        head = self.model.draft
        first = torch.tensor([b], device=self.last.device)
        drafts, logits = head.draft(self.cache.hidden, self.last, first, head.k - 1, choose)
        return [(int(d), self._p(logits[:, j])[0]) for j, d in enumerate(drafts[0])]
