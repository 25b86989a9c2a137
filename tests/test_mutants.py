"""The mutation check (benches/mutants.py): in CI, that every mutant still applies to the code; under
`pytest -m slow`, that the tests catch every one."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benches"))
import mutants  # noqa: E402


def test_every_mutant_applies_once_and_names_tests_that_exist():
    assert len({m.name for m in mutants.MUTANTS}) == len(mutants.MUTANTS), "two mutants share a name"
    for m in mutants.MUTANTS:
        text = (ROOT / m.path).read_text()
        assert text.count(m.old) == 1 and m.old != m.new, f"{m.name}: its text is not in {m.path} exactly once"
        for test in m.tests:
            file, _, name = test.partition("::")
            assert (ROOT / file).is_file(), f"{m.name}: {file} does not exist"
            assert not name or f"def {name}(" in (ROOT / file).read_text(), f"{m.name}: no test {test}"


def test_a_mutant_is_written_into_the_copy_it_is_given(tmp_path):
    m = mutants.MUTANTS[0]
    (tmp_path / m.path).parent.mkdir(parents=True)
    (tmp_path / m.path).write_text((ROOT / m.path).read_text())
    mutants.apply(m, tmp_path)
    assert (tmp_path / m.path).read_text() == (ROOT / m.path).read_text().replace(m.old, m.new)
    with pytest.raises(SystemExit, match="0 times, not once"):
        mutants.apply(m, tmp_path)


@pytest.mark.slow
def test_every_mutant_is_caught():
    done = subprocess.run([sys.executable, str(ROOT / "benches" / "mutants.py")], capture_output=True, text=True)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
