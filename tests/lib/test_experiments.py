"""attnbook.experiments: registry, runner, writer, --check, where/quote, and every chapter claim on one seed."""
import json

import numpy as np
import pytest
import torch

from attnbook import experiments
from attnbook.experiments import __main__ as cli
from attnbook.experiments import ch04, ch08, core


def fake_registry(threshold=3.0):
    """Two claims sharing one run function (x = seed), and one with its own run."""
    calls = []

    def run(seed):
        calls.append(seed)
        return {"x": float(seed), "y": 2.0 * seed}

    reg = {}
    core.register("ch99.small", chapter="99", run=run, claim="x 很小", rule=f"x < {threshold}",
                  holds=lambda m: m["x"] < threshold, quoted=("x",), registry=reg)
    core.register("ch99.double", chapter="99", run=run, claim="y = 2x", rule="y == 2 x",
                  holds=lambda m: m["y"] == 2 * m["x"], quoted=("y",), fmt=".1f", registry=reg)
    core.register("ch98.median", chapter="98", run=lambda s: {"z": s % 2}, claim="中位数为 1",
                  rule="median z == 1", holds=lambda m: True, registry=reg,
                  overall=lambda rows: float(np.median([r["z"] for r in rows])) == 1)
    return reg, calls


def test_register_rejects_bad_entries():
    reg, _ = fake_registry()
    with pytest.raises(ValueError, match="register: `name` must be unique"):
        core.register("ch99.small", chapter="99", run=lambda s: {}, claim="", rule="",
                      holds=lambda m: True, registry=reg)
    with pytest.raises(ValueError, match="register: `name` must look like 'ch99.<claim>'"):
        core.register("small", chapter="99", run=lambda s: {}, claim="", rule="", holds=lambda m: True,
                      registry=reg)
    with pytest.raises(TypeError, match="register: `holds` must be callable"):
        core.register("ch99.other", chapter="99", run=lambda s: {}, claim="", rule="", holds=None,
                      registry=reg)


def test_select_by_chapter_and_exact_name():
    reg, _ = fake_registry()
    assert [e.name for e in core.select(["ch99"], reg)] == ["ch99.double", "ch99.small"]
    assert [e.name for e in core.select(["ch99.small"], reg)] == ["ch99.small"]
    assert len(core.select(None, reg)) == 3
    with pytest.raises(ValueError, match="select: `only` must name a chapter"):
        core.select(["ch07"], reg)
    book = core.select(["ch08.post_ln_s"])        # the book's registry: exact, not a prefix
    assert [e.name for e in book] == ["ch08.post_ln_s"]


def test_runner_shares_run_calls_and_summarizes():
    reg, calls = fake_registry()
    rows = core.run_experiments(core.select(["ch99"], reg), [0, 1, 2, 3, 4], progress=False)
    assert sorted(calls) == [0, 1, 2, 3, 4]            # one call per seed for the two claims
    assert len(rows) == 10
    small = core.summarize(reg["ch99.small"], rows)
    assert small["metrics"]["x"] == dict(values=[0, 1, 2, 3, 4], min=0, median=2, max=4)
    assert small["holds_per_seed"] == [True, True, True, False, False] and not small["holds"]
    assert small["quotes"] == {"x": "0.00–2.00–4.00"}
    assert core.summarize(reg["ch99.double"], rows)["holds"]
    (line,) = core.failures([small, core.summarize(reg["ch99.double"], rows)])
    assert line.startswith("ch99.small: fails on seed(s) [3, 4]")


def test_the_all_seeds_condition_can_fail_alone():
    reg, _ = fake_registry()
    rows = core.run_experiments([reg["ch98.median"]], [0, 1, 2], progress=False)   # z = 0, 1, 0
    s = core.summarize(reg["ch98.median"], rows)
    assert all(s["holds_per_seed"]) and not s["overall"] and not s["holds"]
    assert "all-seeds condition" in core.failures([s])[0]


def test_runner_rejects_bad_seeds_and_metrics():
    reg, _ = fake_registry()
    with pytest.raises(ValueError, match="run_experiments: `seeds` must be distinct"):
        core.run_experiments([reg["ch99.small"]], [1, 1], progress=False)
    bad = core.Experiment("ch97.nan", "97", lambda s: {"a": float("nan")}, "", "", lambda m: True)
    with pytest.raises(ValueError, match="ch97.nan: metric `a` must be finite"):
        core.run_experiments([bad], [0], progress=False)


def _cli(tmp_path, reg, *extra):
    paths = ["--md", str(tmp_path / "E.md"), "--json", str(tmp_path / "E.json"),
             "--module", str(tmp_path / "c.py"), "--no-progress"]
    return cli.main([*extra, *paths], registry=reg)


def test_cli_writes_files_and_check_fails_naming_the_false_claim(tmp_path, capsys):
    reg, _ = fake_registry(threshold=10.0)         # every claim true
    assert _cli(tmp_path, reg, "--only", "ch99") == 0
    md = (tmp_path / "E.md").read_text(encoding="utf-8")
    assert "## ch99.small" in md and "| `x` (quoted) | 0 | 1 | 2 | 3 | 4 | 0 | 2 | 4 |" in md
    assert "Command: `python3 make.py experiments --only ch99`" in md
    raw = json.loads((tmp_path / "E.json").read_text(encoding="utf-8"))
    assert len(raw["rows"]) == 10 and raw["meta"]["seeds"] == [0, 1, 2, 3, 4]
    namespace = {}
    exec((tmp_path / "c.py").read_text(encoding="utf-8"), namespace)
    assert namespace["SUMMARIES"]["ch99.double"]["quotes"] == {"y": "0.0–4.0–8.0"}
    assert _cli(tmp_path, reg, "--only", "ch99", "--check") == 0
    false_reg, _ = fake_registry(threshold=3.0)    # the same claim, now false on seeds 3, 4
    capsys.readouterr()
    assert _cli(tmp_path, false_reg, "--only", "ch99", "--check") == 1
    err = capsys.readouterr().err
    assert "ch99.small: fails on seed(s) [3, 4]" in err and "ch99.double" not in err
    assert json.loads((tmp_path / "E.json").read_text())["rows"] == raw["rows"]   # --check wrote nothing


def test_check_strict_fails_on_drift_from_the_committed_json(tmp_path, capsys):
    reg, _ = fake_registry(threshold=10.0)
    assert _cli(tmp_path, reg, "--only", "ch99") == 0
    assert _cli(tmp_path, reg, "--only", "ch99", "--check", "--strict") == 0
    raw = json.loads((tmp_path / "E.json").read_text())
    raw["rows"][0]["metrics"]["x"] += 0.5
    (tmp_path / "E.json").write_text(json.dumps(raw))
    capsys.readouterr()
    assert _cli(tmp_path, reg, "--only", "ch99", "--check") == 0         # predicates still hold
    assert _cli(tmp_path, reg, "--only", "ch99", "--check", "--strict") == 1
    assert "drift: ch99.double seed 0 x" in capsys.readouterr().err


def test_cli_only_merges_into_the_other_claims_rows(tmp_path):
    reg, _ = fake_registry(threshold=10.0)
    assert _cli(tmp_path, reg) == 1                 # ch98.median fails its all-seeds condition
    assert _cli(tmp_path, reg, "--only", "ch99.small") == 1
    claims = {r["claim"] for r in json.loads((tmp_path / "E.json").read_text())["rows"]}
    assert claims == {"ch98.median", "ch99.double", "ch99.small"}


def test_cli_needs_five_seeds_to_write(tmp_path):
    reg, _ = fake_registry()
    with pytest.raises(SystemExit):
        _cli(tmp_path, reg, "--seeds", "0", "1")


def test_where_and_quote_against_given_summaries(capsys):
    name = "ch08.post_ln_s"
    st = {k: dict(values=[0.5, 0.9, 1.0], min=0.5, median=0.9, max=1.0) for k in ("net", "res_min", "res_max")}
    summaries = {name: dict(seeds=[0, 1, 2], metrics=st, quotes={"net": "0.50–0.90–1.00"})}
    good = dict(s_min=1.1, ln_vs_inv_s=0.02, ln_product=0.005, res_min=1.05, res_max=1.4,
                res_product=90.0, net=0.6)
    out = experiments.where(name, good, summaries=summaries)
    assert out == {"net": True, "res_min": False, "res_max": False, "holds": True}
    printed = capsys.readouterr().out.split("\n")
    assert printed[0].endswith("本次 (seed 0)  3 个种子：最小 · 中位 · 最大")
    assert printed[1].split() == ["net", "0.60", "0.50", "·", "0.90", "·", "1.00"]
    assert not experiments.where(name, dict(good, net=0.01), summaries=summaries, display=False)["holds"]
    assert experiments.quote(name, "net", summaries) == "0.50–0.90–1.00"
    with pytest.raises(KeyError, match="quote: `metric` must be one of"):
        experiments.quote(name, "res_min", summaries)
    with pytest.raises(KeyError, match="where: `metrics` must contain 'net'"):
        experiments.where(name, {"s_min": 1.0}, summaries=summaries)


def test_every_book_claim_names_a_chapter_and_quoted_metrics():
    names = experiments.names()
    assert {n.split(".")[0] for n in names} >= {"ch04", "ch08"}
    for n in names:
        e = experiments.get(n)
        assert e.claim and e.rule and e.quoted, n
    with pytest.raises(KeyError, match="get: `name` must be a registered claim"):
        experiments.get("ch08.nothing")


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
