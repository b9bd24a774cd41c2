"""``python -m attnbook.experiments --check``: fresh runs under another kernel path, in processes."""
import pytest

from attnbook.experiments import __main__ as cli
from attnbook.experiments import core
from attnbook.experiments.rules import ArgmaxVaries, Gt


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


def test_the_printed_margin_is_the_one_that_decides():
    reg = {}
    core.register("ch96.vary", chapter="96", run=lambda s: {"a": 2.0 + s % 2, "b": 2.5},
                  claim="x", rule=Gt("a", 1.0), overall=(ArgmaxVaries("a", "b"),), registry=reg)
    exp = reg["ch96.vary"]
    rows = core.run_experiments([exp], [0, 1, 2, 3], progress=False)    # argmax b, a, b, a
    fresh = [r for r in rows if r["seed"] % 2]                        # a wins on both
    here, both = core.summarize(exp, fresh), core.summarize(exp, rows)
    assert here["margin"] < 0                          # varies? not on the fresh runs alone
    ok, margin = cli._verdict(here, both)
    assert ok and margin == pytest.approx(2 / 3)       # fresh a = 3 against 1; varies: 1.0
    bad = core.summarize(exp, [dict(r, metrics={"a": 0.5, "b": 2.5}) for r in fresh])
    assert cli._verdict(bad, both)[0] is False         # a fresh run below the per-run rule
