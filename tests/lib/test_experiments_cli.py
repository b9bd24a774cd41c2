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


def test_a_kernel_path_torch_ignores_fails_the_check(capfd):
    # torch ignores an unknown ATEN_CPU_CAPABILITY (warning only): the worker must refuse it
    with pytest.raises(SystemExit, match="a worker failed"):
        cli.main(["--check", "--only", "ch09", "--seeds", "0", "--no-progress",
                  "--capability", "no_such_path_xyz"])
    assert "is not a kernel path" in capfd.readouterr().err


def test_a_failing_worker_fails_the_whole_run():
    with pytest.raises(SystemExit, match="a worker failed"):
        cli._run_parallel([(["ch09.no_such_claim"], [0], "default")], False)
