"""ops/precompile.py on the CPU, with stand-ins for Triton's hooks: what a dry pass launches is compiled
once per specialization on the pool, an autotune the dry pass would time stops it (counted), and the
hooks are put back (what the dry pass itself leaves behind: tests/test_trainer.py). On CUDA with real
Triton: tests/gpu/test_precompile.py.
The held-out walk's shapes, which the eval's dry forwards take: by hand against `heldout_windows`."""

import sys
from types import SimpleNamespace

import pytest

from dormouse import ledger
from dormouse.data.sampler import heldout_shapes, heldout_windows
from dormouse.data.shards import load_corpus
from dormouse.ops import precompile


class FakeKernel:
    """A JITFunction as the dry pass meets it: a launch asks the cache hook first, as Triton's
    `_do_compile` does, and compiles and runs only when the hook does not skip it."""

    def __init__(self, name, knobs):
        self.name, self.knobs, self.compiled, self.preloaded = name, knobs, [], []

    def launch(self, spec):
        hook = self.knobs.runtime.jit_cache_hook
        info = SimpleNamespace(jit_function=self)
        if hook is None or not hook(key=spec, repr=self.name, fn=info, compile={"specialization_data": spec}):
            self.compiled.append(spec)

    def preload(self, data):
        self.preloaded.append(data)


class FakeAutotuner:
    base_fn = SimpleNamespace(__name__="chunk_kda_fwd")

    def _bench(self, *args, **kwargs):
        return [1.0]

    def run(self, kernel, spec, pinned):
        if not pinned:  # no stored choice for the key: Triton times every config
            self._bench(config=None)
        kernel.launch(spec)


class FakeAsyncMode:
    """Triton's AsyncCompileMode: compiles submitted while it is active run on the executor."""

    entered = []

    def __init__(self, executor):
        self.executor = executor

    def __enter__(self):
        FakeAsyncMode.entered.append(self.executor._max_workers)
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def triton(monkeypatch):
    knobs = SimpleNamespace(runtime=SimpleNamespace(jit_cache_hook=None))
    fake = SimpleNamespace(knobs=knobs)
    monkeypatch.setitem(sys.modules, "triton", fake)
    monkeypatch.setitem(sys.modules, "triton.runtime", SimpleNamespace())
    monkeypatch.setitem(sys.modules, "triton.runtime.autotuner", SimpleNamespace(Autotuner=FakeAutotuner))
    monkeypatch.setitem(sys.modules, "triton.runtime._async_compile", SimpleNamespace(AsyncCompileMode=FakeAsyncMode))
    monkeypatch.setattr(FakeAsyncMode, "entered", [])
    monkeypatch.setattr(ledger, "COUNTS", ledger.COUNTS.copy())
    return knobs


def test_a_dry_pass_is_compiled_once_per_specialization_on_the_pool(triton):
    fwd, bwd = FakeKernel("fwd", triton), FakeKernel("bwd", triton)

    def dry_pass():
        for spec in ("a", "b", "a"):  # the forward launches `a` twice (two layers), compiled once
            fwd.launch(spec)
        FakeAutotuner().run(bwd, "c", pinned=True)

    line = precompile.compile_ahead(dry_pass, threads=8)
    assert line.startswith("precompile: 3 Triton kernels compiled on 3 threads in ")
    assert (fwd.compiled, bwd.compiled) == ([], [])  # nothing compiled or run during the pass
    assert (fwd.preloaded, bwd.preloaded) == (["a", "b"], ["c"])
    assert FakeAsyncMode.entered == [3]  # one thread per kernel, at most `threads`
    assert triton.runtime.jit_cache_hook is None and FakeAutotuner._bench.__name__ == "_bench"
    fwd.launch("d")  # after it, launches compile as before
    assert fwd.compiled == ["d"]


def test_an_untimed_autotune_stops_the_dry_pass_and_is_counted(triton):
    kernel = FakeKernel("fwd", triton)

    def dry_pass():
        kernel.launch("a")
        FakeAutotuner().run(kernel, "b", pinned=False)
        kernel.launch("never reached")

    line = precompile.compile_ahead(dry_pass)
    assert line == (
        "precompile: skipped, chunk_kda_fwd has no stored kernel choice for its key: the first step compiles "
        "and times its kernels one by one [ledger: precompile.skipped]"
    )
    assert kernel.preloaded == [] and FakeAsyncMode.entered == []
    assert ledger.COUNTS[precompile.SKIPPED] == 1
    assert triton.runtime.jit_cache_hook is None and FakeAutotuner._bench.__name__ == "_bench"
    assert FakeAutotuner()._bench() == [1.0]  # the real timing again


def test_a_triton_without_the_hook_is_counted(triton):
    del triton.runtime.jit_cache_hook
    ran = []
    line = precompile.compile_ahead(lambda: ran.append(1))
    assert line.startswith("precompile: skipped, this Triton has no jit_cache_hook") and ran == []
    assert ledger.COUNTS[precompile.SKIPPED] == 1


# (letters, of which the last 10 % are held out; max_bytes) -> the walk's shapes at seq_len 10, batch 4, by hand:
# held-out targets n = min(held-out bytes - 1, max_bytes), full windows n // 10 in batches of 4, the rest n % 10.
SHAPES = [
    (1010, None, [(4, 10), (2, 10)]),  # 100 targets: 10 windows, batches of 4, 4, 2
    (1610, None, [(4, 10)]),  # 160: 16 windows, 4 full batches
    (1220, None, [(4, 10), (1, 1)]),  # 121: 12 windows and a last byte
    (310, None, [(3, 10)]),  # 30: one batch of 3
    (90, None, [(1, 8)]),  # 8: no full window
    (5000, 85, [(4, 10), (1, 5)]),  # 85 of 499: 8 windows and 5 bytes
]


@pytest.mark.parametrize(("letters", "max_bytes", "shapes"), SHAPES)
def test_heldout_shapes_are_the_walks(random_corpus, letters, max_bytes, shapes):
    corpus = load_corpus(random_corpus(letters))
    assert corpus.split_size("heldout") == letters // 10
    assert heldout_shapes(corpus, 10, 4, max_bytes) == shapes
    walk = [tuple(x.shape) for x, _ in heldout_windows(corpus, 10, 4, max_bytes)]
    assert list(dict.fromkeys(walk)) == shapes
