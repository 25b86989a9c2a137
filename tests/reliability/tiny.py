"""Tiny runs through the CLI, and how a refused command must answer."""


def tiny_flags(corpus_root) -> list[str]:
    """A model of a few thousand parameters on the test corpus: a step takes milliseconds."""
    return [
        *("--data", str(corpus_root), "--preset", "nano", "--d-model", "32", "--n-heads", "2"),
        *("--ffn-hidden", "64", "--kda-chunk-size", "16", "--seq-len", "32", "--batch-size", "4"),
        *("--warmup-steps", "2", "--eval-every", "3", "--ckpt-every", "3"),
    ]


def one_error_line(err: str) -> str:
    """The `error:` line of a refused command: exactly one, and no traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]
