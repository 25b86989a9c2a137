"""A tiny run trained once through the CLI; each test gets its own copy to damage."""

import shutil

import pytest

from dormouse.cli import main
from dormouse.data.shards import load_corpus
from reliability.tiny import tiny_flags


@pytest.fixture(scope="session")
def corpus(random_corpus):
    return load_corpus(random_corpus(6000, repeats=2))


@pytest.fixture(scope="session")
def trained(corpus, tmp_path_factory):
    """A run directory after `train --steps 3`: checkpoint and eval at step 3."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert main(["train", *tiny_flags(corpus.root), "--out", str(run), "--steps", "3"]) == 0
    return run


@pytest.fixture
def run(trained, tmp_path):
    """This test's own copy of the trained run."""
    return shutil.copytree(trained, tmp_path / "run")
