"""``python -m attnbook.experiments --check``: fresh runs under another kernel path, in processes."""
import pytest

from attnbook.experiments import __main__ as cli


def test_groups_split_chapters_over_jobs():
    names = ["ch09.performer", "ch05.one_head", "ch05.two_heads"]
    groups = cli._groups(names, 2)
    assert sorted(map(sorted, groups)) == [["ch05.one_head", "ch05.two_heads"], ["ch09.performer"]]
    assert len(cli._groups(names, 1)) == 1 and sorted(cli._groups(names, 1)[0]) == sorted(names)


@pytest.mark.slow
def test_check_under_the_default_path_reports_each_claim(capsys):
    assert cli.main(["--check", "--jobs", "2", "--only", "ch09", "ch05.one_head", "--seeds", "0",
                     "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "holds ch09.performer" in out and "holds ch05.one_head" in out
    assert "in 2 processes" in out


@pytest.mark.slow
def test_a_failing_worker_fails_the_whole_check():
    with pytest.raises(SystemExit, match="a worker failed"):
        cli.main(["--check", "--only", "ch09", "--seeds", "0", "--no-progress",
                  "--capability", "no_such_path_xyz"])
