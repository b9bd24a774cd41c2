"""``python -m attnbook.experiments --check --jobs N``: the chapters checked in N processes."""
import pytest

from attnbook.experiments import __main__ as cli


def test_jobs_needs_check():
    with pytest.raises(SystemExit):
        cli.parse(["--jobs", "2", "--only", "ch09"])
    with pytest.raises(SystemExit):
        cli.parse(["--check", "--jobs", "0"])


@pytest.mark.slow
def test_check_in_two_processes_reports_each_group(capsys):
    assert cli.main(["--check", "--jobs", "2", "--only", "ch09", "ch05.one_head", "--seeds", "0"]) == 0
    out = capsys.readouterr().out
    assert "--- ch05.one_head ---" in out and "--- ch09 ---" in out
    assert "holds ch09.performer" in out and "holds ch05.one_head" in out
    assert "in 2 processes" in out


@pytest.mark.slow
def test_a_failing_group_fails_the_whole_check(monkeypatch, tmp_path, capsys):
    # a group whose claim is unknown to the child process exits non-zero: so must the parent
    real = cli.core.select
    monkeypatch.setattr(cli.core, "select", lambda only, registry=None: real(["ch09"], registry))
    assert cli.main(["--check", "--jobs", "2", "--only", "ch09.no_such_claim", "--seeds", "0"]) == 1
