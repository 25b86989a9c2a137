from pathlib import Path

import pytest

from dormouse import ledger

ROOT = Path(__file__).resolve().parents[1]


def test_the_modules_all_sites_skips_register_nothing():
    # They import only where Triton is; a site registered there would be missing from the ledger on a CPU.
    for name in ledger.TRITON_ONLY:
        source = (ROOT / (name.replace(".", "/") + ".py")).read_text()
        assert "ledger" not in source and "register(" not in source, name


def test_every_site_has_a_kind_and_a_reason():
    sites = ledger.all_sites()
    assert sites, "the ledger is empty"
    for s in sites:
        assert s.kind in (ledger.Kind.LOUD, ledger.Kind.COUNTED)
        assert s.reason.strip() and "\n" not in s.reason


def test_misuse_is_refused():
    with pytest.raises(KeyError, match="not registered"):
        ledger.count("no.such.site")
    name = ledger.all_sites()[0].name
    wrong = ledger.Kind.COUNTED if ledger.SITES[name].kind is ledger.Kind.LOUD else ledger.Kind.LOUD
    with pytest.raises(ValueError, match="used as"):
        if wrong is ledger.Kind.COUNTED:
            ledger.count(name)
        else:
            ledger.refuse(name, "x")


def test_counted_summary_format():
    ledger.COUNTS.clear()
    assert ledger.counted_summary() == "0"
    ledger.SITES["test.counted"] = ledger.Site("test.counted", ledger.Kind.COUNTED, "test", __name__)
    try:
        ledger.count("test.counted")
        ledger.count("test.counted")
        assert ledger.counted_summary() == "2(test.counted:2)"
    finally:
        del ledger.SITES["test.counted"]
        ledger.COUNTS.clear()
