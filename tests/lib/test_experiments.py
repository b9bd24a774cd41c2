"""attnbook.experiments: rules as data, registry, runner, summaries, where / check_live, the
committed rows, the CLI, and every chapter claim on one seed."""
import json

import numpy as np
import pytest
import torch

from attnbook import experiments
from attnbook.experiments import __main__ as cli
from attnbook.experiments import ch04, ch08, core, store
from attnbook.experiments.rules import (All, Any, ArgmaxVaries, Between, Decreasing, Ge, Gt, Lt,
                                        Median, Near, Rate, Some, clopper_pearson)


def fake_registry(threshold=3.0):
    """Two claims sharing one run function (x = seed), and one with a median rule."""
    calls = []

    def run(seed):
        calls.append(seed)
        return {"x": float(seed), "y": 2.0 * seed}

    reg = {}
    core.register("ch99.small", chapter="99", run=run, claim="x 很小", rule=Lt("x", threshold),
                  quoted=("x",), registry=reg)
    core.register("ch99.double", chapter="99", run=run, claim="y = 2x",
                  rule=All(Lt("y", "x", scale=2, offset=0.5), Gt("y", "x", scale=2, offset=-0.5)),
                  quoted=("y",), fmt=".1f", registry=reg)
    core.register("ch98.median", chapter="98", run=lambda s: {"z": float(s % 2)}, claim="中位数为 1",
                  overall=(Median(Gt("z", 0.5)),), registry=reg)
    return reg, calls


# ---- rules: text, verdict and margin from one object; each would flip

def test_rule_text_verdict_and_margin():
    r = Gt("acc", 0.95)
    assert r.text() == "acc > 0.95" and r.holds({"acc": 1.0}) and not r.holds({"acc": 0.9})
    assert r.margin({"acc": 1.0}) == pytest.approx(0.05)          # 5 % change flips it
    assert r.margin({"acc": 0.9}) < 0
    lt = Lt("loss", "base", scale=0.5, offset=0.1)
    assert lt.text() == "loss < 0.5 x base + 0.1"
    assert lt.holds({"loss": 0.5, "base": 1.0}) and not lt.holds({"loss": 0.7, "base": 1.0})
    both = All(Gt("a", 1), Lt("b", 2))
    assert both.margin({"a": 1.5, "b": 0.2}) == pytest.approx(1 / 3)
    assert both.weakest({"a": 1.5, "b": 0.2}).text() == "a > 1"
    assert Any(Gt("a", 1), Gt("b", 1)).holds({"a": 0, "b": 2})
    assert Any(Gt("a", 1), Gt("b", 1)).weakest({"a": 0, "b": 1.05}).text() == "b > 1"
    assert not Any(Gt("a", 1), Gt("b", 1)).holds({"a": 0, "b": 0})
    assert Between("v", 0, 1).holds({"v": 0.5}) and not Between("v", 0, 1).holds({"v": 1.5})
    assert Near("s", 1, 0.03).text() == "|s - 1| < 0.03" and not Near("s", 1, 0.03).holds({"s": 1.04})
    assert Decreasing("a", "b", "c").holds({"a": 3, "b": 2, "c": 1})
    assert not Decreasing("a", "b", "c").holds({"a": 3, "b": 1, "c": 2})
    assert Ge("n", 1).holds({"n": 1}) and not Gt("n", 1).holds({"n": 1})


def test_rule_errors_name_the_rule_and_the_metric():
    with pytest.raises(ValueError, match="Gt: `metrics` has no 'acc'"):
        Gt("acc", 0.9).holds({"loss": 1.0})
    with pytest.raises(TypeError, match="Gt: metric 'acc' must be a number, got None"):
        Gt("acc", 0.9).holds({"acc": None})
    with pytest.raises(TypeError, match="Gt: `metrics` must be a dict"):
        Gt("acc", 0.9).holds(None)
    with pytest.raises(TypeError, match="bound must be a number or a metric name"):
        Gt("acc", [1])
    with pytest.raises(ValueError, match="Rate: `at_least` must be a fraction"):
        Rate(Gt("a", 0), at_least=3)
    with pytest.raises(TypeError, match="All: every part must be a Rule"):
        All(Gt("a", 0), "b > 0")


def test_rates_medians_and_intervals():
    runs = [{"a": float(i)} for i in range(10)]                   # a > 5 on 4 of 10
    out = Rate(Gt("a", 5), at_least=0.3).evaluate(runs)
    assert (out["k"], out["n"], out["holds"]) == (4, 10, True)
    assert out["lo"] == pytest.approx(0.1216, abs=1e-3) and out["hi"] == pytest.approx(0.7376, abs=1e-3)
    assert not Rate(Gt("a", 5), at_least=0.5).evaluate(runs)["holds"]     # would flip
    assert not Rate(Gt("a", 5), at_most=0.3).evaluate(runs)["holds"]
    assert Median(Gt("a", 4)).evaluate(runs)["holds"] and not Median(Gt("a", 5)).evaluate(runs)["holds"]
    assert Some(Gt("a", 8)).evaluate(runs)["holds"] and not Some(Gt("a", 9)).evaluate(runs)["holds"]
    assert ArgmaxVaries("a", "b").evaluate([{"a": 1, "b": 0}, {"a": 0, "b": 1}])["holds"]
    assert not ArgmaxVaries("a", "b").evaluate([{"a": 1, "b": 0}, {"a": 2, "b": 0}])["holds"]
    assert clopper_pearson(0, 10)[1] == pytest.approx(0.3085, abs=1e-4)
    assert clopper_pearson(10, 10)[0] == pytest.approx(0.6915, abs=1e-4)


# ---- registry (issue 30: clear errors)

def test_register_rejects_bad_entries():
    reg, _ = fake_registry()
    ok = dict(chapter="99", run=lambda s: {}, claim="c", rule=Gt("x", 0), registry=reg)
    with pytest.raises(ValueError, match="register: `name` must be unique"):
        core.register("ch99.small", **ok)
    with pytest.raises(ValueError, match="register: `name` must look like 'ch99.<claim>'"):
        core.register("small", **ok)
    with pytest.raises(TypeError, match="register: `run` must be callable"):
        core.register("ch99.o1", **{**ok, "run": None})
    with pytest.raises(TypeError, match="register: `rule` must be a rules.Rule"):
        core.register("ch99.o2", **{**ok, "rule": lambda m: True})
    with pytest.raises(ValueError, match="register: `fmt` must be a format spec"):
        core.register("ch99.o3", **ok, fmt="%q")
    with pytest.raises(TypeError, match="register: `fmt` must be a format spec"):
        core.register("ch99.o4", **ok, fmt=2)
    with pytest.raises(TypeError, match="register: `quoted` must be a tuple of metric names"):
        core.register("ch99.o5", **ok, quoted="acc")
    with pytest.raises(TypeError, match="register: `overall` must be a tuple"):
        core.register("ch99.o6", **ok, overall=3)
    with pytest.raises(TypeError, match="register: every item of `overall`"):
        core.register("ch99.o7", **ok, overall=(3,))
    assert sorted(reg) == ["ch98.median", "ch99.double", "ch99.small"]


def test_get_of_an_unknown_name_raises_value_error():
    with pytest.raises(ValueError, match="get: `name` must be a registered claim, got 'ch08.nothing'"):
        experiments.get("ch08.nothing")
    with pytest.raises(TypeError, match="get: `name` must be a claim name"):
        experiments.get(None)


def test_select_by_chapter_and_exact_name():
    reg, _ = fake_registry()
    assert [e.name for e in core.select(["ch99"], reg)] == ["ch99.double", "ch99.small"]
    assert [e.name for e in core.select(["ch99.small"], reg)] == ["ch99.small"]
    with pytest.raises(ValueError, match="select: `only` must name a chapter"):
        core.select(["ch07"], reg)
    assert [e.name for e in core.select(["ch08.post_ln_s"])] == ["ch08.post_ln_s"]


# ---- runner and summaries

def test_runner_shares_run_calls_and_summarizes():
    reg, calls = fake_registry()
    rows = core.run_experiments(core.select(["ch99"], reg), [0, 1, 2, 3, 4], progress=False)
    assert sorted(calls) == [0, 1, 2, 3, 4] and len(rows) == 10
    s = core.summarize(reg["ch99.small"], rows)
    assert not s["holds"] and [p["seed"] for p in s["per_run"] if not p["holds"]] == [3, 4]
    assert s["quotes"] == {"x": "0.00–2.00–4.00"} and s["runs"] == 5 and s["envs"] == ["here"]
    assert s["margin"] < 0 and s["worst"]["seed"] == 4
    assert "ch99.small: fails on seed 3 (here), seed 4 (here)" in core.failures([s])[0]
    assert core.summarize(reg["ch99.double"], rows)["holds"]
    good = core.summarize(reg["ch99.small"], [r for r in rows if r["seed"] < 3])
    assert good["holds"] and good["margin"] == pytest.approx(1 / 3)


def test_the_over_the_runs_rule_can_fail_alone():
    reg, _ = fake_registry()
    rows = core.run_experiments([reg["ch98.median"]], [1, 2, 3], progress=False)
    assert core.summarize(reg["ch98.median"], rows)["holds"]                 # median z = 1
    rows = core.run_experiments([reg["ch98.median"]], [0, 1, 2], progress=False)
    s = core.summarize(reg["ch98.median"], rows)                          # median z = 0
    assert not s["holds"] and "fails 'median over the runs: z > 0.5'" in core.failures([s])[0]


def test_worst_margin_names_the_rule_that_is_thinnest():
    reg = {}
    core.register("ch97.rate", chapter="97", run=lambda s: {"x": float(s)}, claim="x",
                  rule=Lt("x", 100.0), overall=(Rate(Gt("x", 1.5), at_least=0.5),), registry=reg)
    rows = core.run_experiments([reg["ch97.rate"]], [0, 1, 2, 3], progress=False)
    s = core.summarize(reg["ch97.rate"], rows)           # x > 1.5 on 2 of 4: the rate's edge
    text = core.markdown([s], {})
    assert s["margin"] == 0 and "Worst margin: 0.0 % (over the runs: `x > 1.5 on at least" in text
    rows = core.run_experiments([reg["ch97.rate"]], [2, 3, 99], progress=False)
    s = core.summarize(reg["ch97.rate"], rows)           # the per-run clause is thinnest now
    assert "Worst margin: 1.0 % (seed 99, here: `x < 100`)" in core.markdown([s], {})


def test_summarize_rejects_runs_with_different_metrics():
    reg, _ = fake_registry()
    rows = [dict(claim="ch99.small", seed=0, env="e", metrics={"x": 0.0, "y": 0.0}, seconds=0),
            dict(claim="ch99.small", seed=1, env="e", metrics={"x": 1.0}, seconds=0)]
    with pytest.raises(ValueError, match="summarize: the runs of ch99.small return different metrics"):
        core.summarize(reg["ch99.small"], rows)
    with pytest.raises(ValueError, match="summarize: `rows` must contain rows of 'ch99.small'"):
        core.summarize(reg["ch99.small"], [])


def test_runner_rejects_bad_seeds_and_metrics():
    reg, _ = fake_registry()
    with pytest.raises(ValueError, match="run_experiments: `seeds` must be distinct"):
        core.run_experiments(core.select(["ch99"], reg), [1, 1], progress=False)
    core.register("ch97.nan", chapter="97", run=lambda s: {"x": float("nan")}, claim="c",
                  rule=Gt("x", 0), registry=reg)
    with pytest.raises(ValueError, match="metric `x` must be finite"):
        core.run_experiments([reg["ch97.nan"]], [0], progress=False)


# ---- the committed rows: one place, read one way, with their environments

def test_committed_rows_ship_in_the_package_with_environments():
    s = experiments.committed()
    assert sorted(s) == experiments.names()                          # every claim has rows
    for name, entry in s.items():
        assert entry["holds"], (name, core.failures([entry]))
        assert len(entry["seeds"]) >= 5 and entry["runs"] >= 5
    ch08_envs = core.environments("08")
    for label, env in ch08_envs.items():
        assert {"cpu", "capability", "blas", "threads", "torch", "python", "os"} <= set(env), label
    assert len(ch08_envs) >= 2                                        # more than one kernel path


def test_environment_records_where_a_run_is_made(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    env = store.environment()
    assert env["requested"] == "default" and env["threads"] >= 1 and env["capability"]
    assert store.env_label(dict(cpu="AMD EPYC 9R14", capability="AVX2")) == "EPYC·AVX2"
    assert store.env_label(dict(cpu="Intel(R) Xeon(R)", capability="")) == "Xeon·native"


def test_merge_replaces_rows_of_the_same_claim_seed_and_environment():
    env = dict(cpu="X", capability="AVX2", blas="mkl", torch="t", python="p", os="o", threads=1)
    row = dict(claim="ch99.small", seed=0, metrics={"x": 1.0}, seconds=1.0)
    data = store.merge(dict(envs={}, rows=[]), [row], env)
    data = store.merge(data, [dict(row, metrics={"x": 2.0})], env)
    assert [r["metrics"]["x"] for r in data["rows"]] == [2.0]
    other = dict(env, torch="t2")                                     # same label, other software
    data = store.merge(data, [row], other)
    assert sorted(data["envs"]) == ["X·AVX2", "X·AVX2#2"] and len(data["rows"]) == 2


def test_store_round_trip(tmp_path):
    env = dict(cpu="X", capability="AVX2", blas="mkl", torch="t", python="p", os="o", threads=1)
    data = store.merge(dict(envs={}, rows=[]),
                       [dict(claim="ch99.small", seed=0, metrics={"x": 1.0}, seconds=1.0)], env)
    store.write("99", data, tmp_path)
    assert store.load("99", tmp_path) == dict(envs=data["envs"], rows=data["rows"])
    assert store.load("98", tmp_path) == dict(envs={}, rows=[])


# ---- where(): a live run beside the committed runs, no verdict

def test_where_prints_same_seed_values_and_returns_no_verdict(capsys):
    name = "ch08.post_ln_s"
    committed0 = experiments.rows(name, seed=0)
    assert len(committed0) >= 2
    m = dict(committed0[0]["metrics"])
    placed = experiments.where(name, m, seed=0)
    out = capsys.readouterr().out
    for r in committed0:
        assert r["env"] in out
    assert placed.outside == () and "舍入" not in out
    with pytest.raises(TypeError, match="not a verdict"):
        placed["holds"]
    far = experiments.where(name, dict(m, net=1e6), seed=0)
    out = capsys.readouterr().out
    assert far.outside == ("net",) and out.count("另一种 CPU 的舍入") == 1 and "False" not in out


def test_where_rejects_bad_metrics():
    with pytest.raises(ValueError, match=r"where: `metrics` must contain \['net'"):
        experiments.where("ch08.post_ln_s", {"res_min": 1.0, "res_max": 2.0})
    with pytest.raises(TypeError, match="where: `metrics` must be the dict"):
        experiments.where("ch08.post_ln_s", None)
    with pytest.raises(ValueError, match="get: `name` must be a registered claim"):
        experiments.where("ch08.nothing", {})


def test_check_live_uses_the_spread_across_environments():
    name = "ch08.last_layer_gap"
    rows0 = experiments.rows(name, seed=0)
    m = dict(rows0[0]["metrics"])
    tol = experiments.live_tolerance(name, "post_pre_12")
    assert 0 < tol < 1e-3 * abs(m["post_pre_12"])
    experiments.check_live(name, m, seed=0)                          # a committed row passes
    with pytest.raises(AssertionError, match="post_pre_12"):
        experiments.check_live(name, dict(m, post_pre_12=m["post_pre_12"] * (1 + 1e-2)), seed=0)


def test_quote_and_rate_text():
    assert experiments.quote("ch08.post_ln_s", "net").count("–") == 2
    with pytest.raises(ValueError, match="quote: `metric` must be one of"):
        experiments.quote("ch08.post_ln_s", "nope")
    text = experiments.rate_text("ch01.gru_T20")
    assert "/" in text and "95 %" in text
    with pytest.raises(ValueError, match="rate_text: `index` must be in"):
        experiments.rate_text("ch01.gru_T20", 5)


# ---- the CLI

def test_cli_parse_defaults():
    assert cli.parse(["--check"]).seeds == [0, 1, 2, 3, 4]
    assert cli.parse([]).seeds == list(range(10))
    with pytest.raises(SystemExit):
        cli.parse(["--jobs", "0"])
    assert "default" in cli.native_paths()


def test_cli_render_writes_the_markdown(tmp_path):
    md = tmp_path / "E.md"
    assert cli.main(["--render", "--md", str(md)]) == 0
    text = md.read_text(encoding="utf-8")
    assert "## Environments" in text and "worst margin" in text and "## ch08.post_ln_s" in text


def test_every_book_claim_names_a_chapter_and_quoted_metrics():
    for n in experiments.names():
        e = experiments.get(n)
        assert e.claim and e.text() and e.quoted, n
        assert set(e.quoted) | e.keys() <= set(experiments.rows(n)[0]["metrics"]), n


# ---- the chapters' run functions on one seed: every claim holds, and a wrong value is rejected

_SLOW = {"ch08.warmup"}     # 4 trainings (~7 s): run once below, with the determinism check
_RUNS = {}


def seed_zero(name):
    """The metrics of claim ``name`` on seed 0, computed once per run function."""
    exp = experiments.get(name)
    if exp.run not in _RUNS:
        torch.set_num_threads(1)
        _RUNS[exp.run] = core._clean(exp.run(0), name)
    return exp, _RUNS[exp.run]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in experiments.names() if n not in _SLOW])
def test_claim_holds_on_seed_zero(name):
    exp, m = seed_zero(name)
    assert set(exp.quoted) <= set(m) and exp.holds(m), (name, m)


@pytest.mark.slow
def test_warmup_claim_holds_and_is_deterministic():
    torch.set_num_threads(1)
    runs = ch08.sort_runs(0, which=("post", "post_low_lr"))
    again = ch08.sort_runs(0, which=("post", "post_low_lr"))
    assert runs["post"][0] == again["post"][0] and runs["post_low_lr"][1] == again["post_low_lr"][1]
    m = ch08.warmup_metrics(runs)
    assert abs(m["post_loss"] - np.log(10)) < 0.2 and m["post_low_lr_loss"] < 1.5


def _constant_gap(m, growth=1.0):
    """The metrics of a gap Post/Pre that does not grow with L (or grows by ``growth``)."""
    g12 = m["post_pre_6"] * growth
    return dict(post_pre_12=g12, gap_growth=growth, post_pre_sqrt_12=g12 / np.sqrt(12))


@pytest.mark.parametrize("name, wrong", [
    ("ch08.last_layer_gap", _constant_gap),                         # the gap no longer grows with L
    ("ch08.last_layer_gap", lambda m: _constant_gap(m, 1.03)),      # ... or hardly (noise)
    ("ch08.layer_profile", dict(post_last_first_12=0.9)),           # Post-LN L = 12 falls
    ("ch08.layer_profile", dict(post_log_slope_12=-0.01)),          # ends up, trend over layers down
    ("ch08.layer_profile", dict(pre_log_slope_6=0.01)),             # Pre-LN L = 6 not falling
    ("ch08.pre_last_shrinks", dict(pre_12_over_6=0.65)),            # shrinks by more than 1/sqrt(2)
    ("ch08.pre_last_shrinks", dict(post_12_over_6=0.8)),            # Post-LN's last layer shrinks too
    ("ch08.post_ln_s", dict(net=0.01)),                             # a 100x decay
    ("ch04.mha_init", dict(score_var=1.0)),                         # the seed's "variance 1"
    ("ch04.diagonal", dict(diag_independent_theory=0.3)),           # trace far beyond its 0.0625 std
    ("ch04.saturation", dict(G64_ratio=1.0)),                       # no larger gradient at 64
    ("ch04.saturation", dict(dead_256=0.1)),                        # not "about a third" dead
    ("ch04.saturation", dict(dead_1024=0.9)),                       # not "about 60 %" dead
    ("ch04.saturation_by_n", dict(dead_32=0.01)),                   # dead rows not growing as n shrinks
    ("ch04.recall", dict(acc=0.3)),                                 # untrained-looking model
    ("ch04.recall", dict(acc_untrained=0.25)),                      # untrained far above 1/16
    ("ch04.mha_saturation", dict(logit_var=64.0)),                  # the unit-variance premise, d_k
    ("ch04.mha_saturation", lambda m: dict(J_unscaled=m["J_scaled"])),  # unscaled no peakier
    ("ch04.scale_training", lambda m: dict(early_unscaled_256=m["early_scaled_256"])),  # no slower
    ("ch04.scale_training", dict(acc_unscaled_256=0.5)),            # unscaled never learns
    ("ch04.scale_training", dict(early_unscaled_16=0.2)),           # small d_k slow too
])
def test_claim_rejects_a_wrong_value(name, wrong):
    exp, m = seed_zero(name)
    change = wrong(m) if callable(wrong) else wrong
    assert set(change) <= set(m), (name, sorted(set(change) - set(m)))
    assert exp.holds(m) and not exp.holds(dict(m, **change))


@pytest.mark.parametrize("fn", [ch04.run_var_general, ch04.run_mha_init, ch08.run_post_ln_path])
def test_run_is_deterministic_per_seed(fn):
    assert fn(1) == fn(1) and fn(1) != fn(2)


def test_profile_metrics_reads_the_profiles():
    grads = {(6, False): np.ones(6), (6, True): np.linspace(1, 0.5, 6) / 3,
             (12, False): np.linspace(1, 2, 12), (12, True): np.linspace(1, 0.4, 12) / 4}
    streams = {k: (np.ones(len(v)) if not k[1] else np.sqrt(1 + np.arange(1, len(v) + 1)))
               for k, v in grads.items()}
    m = ch08.profile_metrics({k: (grads[k], streams[k]) for k in grads})
    assert m["post_pre_6"] == pytest.approx(6.0) and m["pre_last_first_12"] == pytest.approx(0.4)
    assert m["pre_var_slope_12"] == pytest.approx(1.0) and m["pre_var_r2_12"] == pytest.approx(1.0)
    assert m["post_12_over_6"] == pytest.approx(2.0)
    assert m["gap_growth"] == pytest.approx(m["post_pre_12"] / m["post_pre_6"])
    assert m["post_log_slope_12"] > 0 and m["pre_log_slope_12"] < 0 and m["post_log_slope_6"] == pytest.approx(0)


def test_profile_group_rejects_a_bad_group():
    with pytest.raises(ValueError, match="profile_group: `group` must be an int >= 0"):
        ch08.profile_group(-1)


def test_count_metrics_are_quoted_as_whole_numbers():
    """``counts``: heads and positions are quoted 2–2–2, not 2.00–2.00–2.00; a median between two
    counts keeps its half; the other quoted metrics keep ``fmt``."""
    assert core.range_text({"min": 2.0, "median": 2.0, "max": 2.0}, core.COUNT) == "2–2–2"
    assert core.range_text({"min": 38.0, "median": 38.5, "max": 41.0}, core.COUNT) == "38–38.5–41"
    assert core.range_text({"min": 2.0, "median": 2.0, "max": 2.0}, ".2f") == "2.00–2.00–2.00"  # control
    reg = {}
    core.register("ch99.heads", chapter="99", run=lambda s: {"n": 2.0, "acc": 1.0},
                  claim="两个头", rule=Gt("n", 1), quoted=("n", "acc"), counts=("n",), registry=reg)
    with pytest.raises(TypeError, match="`counts` must be a tuple of quoted metric names"):
        core.register("ch99.bad", chapter="99", run=lambda s: {"n": 2.0}, claim="x",
                      rule=Gt("n", 1), quoted=("acc",), counts=("n",), registry=reg)
    with pytest.raises(TypeError, match="`counts` must be a tuple"):
        core.register("ch99.bad2", chapter="99", run=lambda s: {"n": 2.0}, claim="x",
                      rule=Gt("n", 1), quoted=("n",), counts="n", registry=reg)
    assert experiments.quote("ch05.four_heads", "n_prev") == "2–2–2"
    assert experiments.quote("ch05.four_heads", "label") == "1.00–1.00–1.00"
