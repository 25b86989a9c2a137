"""Mutation check: seed a known fault into a copy of the checkout, run the tests that hold the guarantee it
breaks, and say whether they caught it. A mutant the tests survive is a guarantee no test holds.

Each mutant is one source text replacement (MUTANTS below): the RNG's keys and the global streams, the
checkpoint's verification, the ledger's kinds, CALM-lite's exit rule, the eval's finiteness checks, the resume
rules, the one-expert MoE, the bounded KDA's written-out backward. The working tree is never touched: every
mutant runs in its own scratch copy.

    python benches/mutants.py                      # every mutant; exit status 1 when one is not caught
    python benches/mutants.py --list               # names, files and tests, nothing run
    python benches/mutants.py --only exit_rule_flipped rng_global_torch --jobs 2

tests/test_mutants.py runs it under `pytest -m slow`, and checks in CI that every mutant still applies.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What a scratch copy leaves out: git, environments, caches, run outputs (.gitignore's).
SKIP = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", ".*_cache", "runs", "build", ".whl")
TRAINER = "tests/test_trainer.py"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # the file, relative to the checkout
    old: str  # text found exactly once in it
    new: str
    tests: tuple[str, ...]  # pytest arguments that must fail on the mutant


MUTANTS = (
    Mutant(
        "rng_seed_derivation",
        "dormouse/rng.py",
        "int.from_bytes(digest[:8]",
        "int.from_bytes(digest[1:9]",
        ("tests/test_rng.py",),
    ),
    Mutant(
        "rng_purpose_unchecked",
        "dormouse/rng.py",
        "if purpose not in PURPOSES:",
        "if False:",
        ("tests/test_rng.py",),
    ),
    Mutant(
        "rng_global_torch",
        "dormouse/train/step_runner.py",
        "            x, y, starts = self.batch(step)\n",
        "            x, y, starts = self.batch(step)\n            torch.rand(1)\n",
        (f"{TRAINER}::test_a_run_with_every_random_arm_draws_nothing_from_the_global_rngs",),
    ),
    Mutant(
        "rng_global_numpy",
        "dormouse/model/dropout.py",
        "    keep = torch.rand(shape,",
        "    __import__('numpy').random.rand()\n    keep = torch.rand(shape,",
        (f"{TRAINER}::test_a_run_with_every_random_arm_draws_nothing_from_the_global_rngs",),
    ),
    Mutant(
        "rng_global_python",
        "dormouse/evaluation.py",
        "    ce = total / scored\n",
        "    ce = total / scored\n    __import__('random').random()\n",
        (f"{TRAINER}::test_a_run_with_every_random_arm_draws_nothing_from_the_global_rngs",),
    ),
    Mutant(
        "checkpoint_hash_unchecked",
        "dormouse/checkpoint_files.py",
        'if digest != entry.get("sha256"):',
        "if False:",
        ("tests/test_checkpoint.py",),
    ),
    Mutant(
        "checkpoint_step_stamp_unchecked",
        "dormouse/checkpoint_files.py",
        'if entry.get("step") != step:',
        "if False:",
        ("tests/test_checkpoint.py",),
    ),
    Mutant(
        "checkpoint_unlisted_file_accepted",
        "dormouse/checkpoint_files.py",
        "if name != STATE and name not in files:",
        "if False:",
        ("tests/test_checkpoint.py",),
    ),
    Mutant(
        "checkpoint_state_seal_unchecked",
        "dormouse/checkpoint_files.py",
        '        raise _edited(path.parent, meta.get("state"))\n',
        "        pass\n",
        ("tests/test_checkpoint.py", "tests/reliability/test_state_seal.py"),
    ),
    Mutant(
        "ledger_kind_unchecked",
        "dormouse/ledger.py",
        "if site.kind is not kind:",
        "if False:",
        ("tests/test_ledger.py",),
    ),
    Mutant(
        "ledger_site_registered_wrong_kind",
        "dormouse/model/memory.py",
        '    "memory.skipped",\n    ledger.Kind.COUNTED,',
        '    "memory.skipped",\n    ledger.Kind.LOUD,',
        ("tests/test_ledger.py",),
    ),
    Mutant(
        "ledger_refused_at_a_counted_site",
        "dormouse/checkpoint.py",
        'raise ledger.refuse(FILE_MISSING, f"{e.filename} vanished',
        'raise ledger.refuse(ORPHAN_REMOVED, f"{e.filename} vanished',
        ("tests/test_ledger.py",),
    ),
    Mutant(
        "exit_rule_flipped",
        "dormouse/model/model.py",
        ">= threshold).all())",
        "< threshold).all())",
        ("tests/test_generate.py",),
    ),
    Mutant(
        "exit_rule_any_row",
        "dormouse/model/model.py",
        ">= threshold).all())",
        ">= threshold).any())",
        ("tests/test_generate.py",),
    ),
    Mutant(
        "eval_ce_finiteness_unchecked",
        "dormouse/evaluation.py",
        "if not math.isfinite(ce):",
        "if False:",
        ("tests/reliability/test_eval_terms.py", f"{TRAINER}::test_nonfinite_loss_stops_loudly_and_saves_nothing"),
    ),
    Mutant(
        "eval_aux_finiteness_unchecked",
        "dormouse/evaluation.py",
        "if isinstance(aux[name], float) and not math.isfinite(aux[name]):",
        "if False:",
        ("tests/reliability/test_eval_terms.py",),
    ),
    Mutant(
        "eval_record_finiteness_unchecked",
        "dormouse/evaluation.py",
        "if isinstance(value, float) and not math.isfinite(value):",
        "if False:",
        ("tests/reliability/test_eval_terms.py", f"{TRAINER}::test_nonfinite_loss_stops_loudly_and_saves_nothing"),
    ),
    Mutant(
        "resume_flag_unchecked",
        "dormouse/config_flags.py",
        "        if dest not in RESUMABLE:\n",
        "        if False:\n",
        ("tests/reliability/test_resume_rules.py",),
    ),
    Mutant(
        "resume_checkpoint_config_unchecked",
        "dormouse/runs.py",
        "        if name not in RESUMABLE:\n",
        "        if False:\n",
        ("tests/reliability/test_resume_rules.py",),
    ),
    Mutant(
        "moe_top1_weight_perturbed",
        "dormouse/model/ffn.py",
        "weights = top_p if self.top_k == 1 else",
        "weights = top_p * (1 + 1e-6) if self.top_k == 1 else",
        ("tests/test_ffn.py",),
    ),
    Mutant(
        "kda_bounded_beta_grad_through_inverse_dropped",
        "dormouse/ops/kda/bounded.py",
        "d_beta = (d_T * X_inv).sum(-2) + (d_X * L).sum(-1)",
        "d_beta = (d_T * X_inv).sum(-2)",
        ("tests/test_kda_bounded.py",),
    ),
    Mutant(
        "kda_bounded_state_grad_into_pseudo_values_dropped",
        "dormouse/ops/kda/bounded.py",
        "        d_E_n.baddbmm_(k_n, d_states[n + 1])\n",
        "",
        ("tests/test_kda_bounded.py",),
    ),
)


def apply(mutant: Mutant, root: Path) -> None:
    """Write `mutant` into the checkout at `root`; refuses one whose text is not there exactly once."""
    path = root / mutant.path
    text = path.read_text()
    if text.count(mutant.old) != 1:
        raise SystemExit(f"mutant {mutant.name}: {mutant.path} holds its text {text.count(mutant.old)} times, not once")
    path.write_text(text.replace(mutant.old, mutant.new))


def run(mutant: Mutant | None, tests: tuple[str, ...], timeout: float) -> tuple[str, float, str]:
    """(verdict, seconds, the first failed test or pytest's last line) of `tests` in a scratch copy with `mutant`
    applied (None: as is).
    Verdicts: killed (a test failed), survived (all passed), error (pytest could not run them: a broken mutant
    or test list, not a catch), timeout."""
    with tempfile.TemporaryDirectory(prefix="dormouse-mutant-") as scratch:
        copy = Path(scratch) / "tree"
        shutil.copytree(ROOT, copy, ignore=SKIP)
        if mutant is not None:
            apply(mutant, copy)
        env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
        start = time.monotonic()
        try:
            done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "timeout", time.monotonic() - start, ""
        seconds = time.monotonic() - start
        lines = (done.stdout + done.stderr).strip().splitlines()
        failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]
        verdict = {0: "survived", 1: "killed"}.get(done.returncode, "error")
        return verdict, seconds, (failed or lines or [""])[0 if failed else -1][:160]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants (default: all)")
    parser.add_argument("--list", action="store_true", help="print the mutants and their tests; run nothing")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (each in its own copy)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant's tests")
    parser.add_argument("--no-baseline", action="store_true", help="skip running the tests on the unmutated tree")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    unknown = set(args.only or ()) - {m.name for m in MUTANTS}
    if unknown:
        parser.error(f"no such mutant: {sorted(unknown)}; --list names them")
    if args.list:
        for m in chosen:
            print(f"{m.name}\t{m.path}\t{' '.join(m.tests)}")
        return 0
    if not args.no_baseline:  # a test that fails on the unmutated tree would count every mutant as caught
        tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
        verdict, seconds, last = run(None, tests, args.timeout * len(chosen))
        print(f"baseline\t{'passes' if verdict == 'survived' else verdict}\t{seconds:.0f} s\t{last}", flush=True)
        if verdict != "survived":
            return 2
    uncaught = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for m, verdict, seconds, last in pool.map(lambda m: (m, *run(m, m.tests, args.timeout)), chosen):
            print(f"{m.name}\t{verdict}\t{seconds:.0f} s\t{last}", flush=True)
            if verdict != "killed":
                uncaught.append(f"{m.name} ({verdict})")
    print(f"{len(chosen) - len(uncaught)} of {len(chosen)} mutants caught; not caught: {uncaught or 'none'}")
    return 1 if uncaught else 0


if __name__ == "__main__":
    sys.exit(main())
