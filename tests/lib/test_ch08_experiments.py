"""Chapter 08's new claims: the no-skip control, why Pre-LN's gradient falls with the layer
index, and ``group_rows`` (the committed per-seed rows of one environment, from the package data)."""
import json

import numpy as np
import pytest
import torch

from attnbook import experiments
from attnbook.experiments import ch08


@pytest.fixture(scope="module")
def skip0():
    torch.set_num_threads(1)
    return ch08.skip_control(0)


def test_skip_control_measures_both_stacks(skip0):
    m = skip0
    assert experiments.get("ch08.skip_control").holds(m)
    assert 0.5 < m["skip_gx0"] < 3 and m["noskip_gx0"] < 1e-6          # the skip carries it
    assert m["skip_out_std"] > 1.0 > 0.1 > m["noskip_out_std"]          # no skip: the signal fades
    assert ch08.skip_control(0) == m and ch08.skip_control(1) != m      # seeded, not constant


@pytest.mark.parametrize("wrong", [dict(noskip_gx0=0.5), dict(noskip_first_last=0.9),
                                   dict(skip_gx0=1e-3), dict(skip_first_last=1e-3)])
def test_skip_claim_rejects_a_wrong_value(skip0, wrong):
    exp = experiments.get("ch08.skip_control")
    assert exp.holds(skip0) and not exp.holds(dict(skip0, **wrong))


def test_skip_control_he_init_no_vanishing_without_skip(skip0):
    torch.set_num_threads(1)
    m = ch08.skip_control(0, init="he")                                  # variance-preserving
    exp = experiments.get("ch08.skip_control_he")
    assert exp.holds(m) and not exp.holds(skip0)                         # default init fails it
    assert m["noskip_gx0"] > 1e6 * skip0["noskip_gx0"]                  # the init, not the skip
    assert m["skip_gx0"] > 10 * skip0["skip_gx0"]                        # the skip now amplifies
    for wrong in (dict(noskip_gx0=1e-5), dict(noskip_first_last=1e-3), dict(skip_gx0=1.4)):
        assert not exp.holds(dict(m, **wrong)), wrong
    with pytest.raises(ValueError, match=r"skip_control: `init` must be one of \('default', 'he'\)"):
        ch08.skip_control(0, init="xavier")


def test_pre_ln_cause_profiles_and_claim():
    torch.set_num_threads(1)
    p = ch08.pre_ln_cause(0)
    assert set(p) == {"stream", "hidden", "w2"} and all(len(v) == 12 for v in p.values())
    assert all(v[0] == pytest.approx(1.0) for v in p.values())           # normalised to layer 1
    m = ch08.pre_ln_cause_metrics(p)
    exp = experiments.get("ch08.pre_ln_cause")
    assert exp.holds(m)
    for wrong in (dict(stream_last=0.9), dict(hidden_dev=0.5), dict(w2_over_stream_dev=0.6)):
        assert not exp.holds(dict(m, **wrong)), wrong
    with pytest.raises(ValueError, match="pre_ln_cause: `group` must be an int >= 0"):
        ch08.pre_ln_cause(-1)
    with pytest.raises(ValueError, match="skip_control: `seed` must be an int >= 0"):
        ch08.skip_control(-2)


def test_group_rows_reads_one_environment_of_the_package_rows():
    from attnbook import experiments
    rows = experiments.rows("ch08.post_ln_s")
    env = sorted({r["env"] for r in rows})[-1]
    got = ch08.group_rows("ch08.post_ln_s", ["net"], env=env)
    want = [r["metrics"]["net"] for r in sorted(rows, key=lambda r: r["seed"]) if r["env"] == env]
    assert got == {"net": want} and len(want) >= 5
    with pytest.raises(ValueError, match="group_rows: `env` must be one of"):
        ch08.group_rows("ch08.post_ln_s", ["net"], env="nowhere")
