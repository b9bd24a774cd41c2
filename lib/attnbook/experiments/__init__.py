"""Every empirical claim of the book, over seeds and CPU kernel paths (CHAPTER.md point 18).

A single run is an illustration; the evidence is ``python3 make.py experiments``, which runs every
registered claim on seeds 0-9 under two or more CPU kernel paths (``ATEN_CPU_CAPABILITY``) and
writes the rows, with where each was made, to ``data/chNN.json`` inside this package (so Colab and
a pip install read the same rows) and renders benchmarks/EXPERIMENTS.md from them. In a chapter::

    from attnbook import experiments
    from attnbook.experiments import ch08
    m = ch08.run_profiles(0)                      # this run (one seed): an illustration
    experiments.where("ch08.last_layer_gap", m)   # beside the committed runs of seed 0 and all runs
    experiments.committed()["ch08.last_layer_gap"]["holds"]   # the claim, over the committed runs

Modules: ``rules`` (a claim's rule as data: its text, check and margin), ``registry``
(``register``), ``core`` (runner, summaries, ``where``, ``check_live``, EXPERIMENTS.md), ``store``
(the committed rows and their environments), one module per chapter (``ch04``, ``ch08``) that
defines and registers its claims. The chapter modules hold chapter code (models, run functions)
that the notebooks import; they are not a stable API.
"""
from . import rules
from .core import (
    DEFAULT_SEEDS,
    SWEEP_SEEDS,
    Experiment,
    Placement,
    check_live,
    committed,
    committed_rows,
    failures,
    get,
    live_tolerance,
    names,
    quote,
    range_text,
    rate_text,
    register,
    rows,
    run_experiments,
    select,
    summarize,
    where,
)

__all__ = ["DEFAULT_SEEDS", "SWEEP_SEEDS", "Experiment", "Placement", "check_live", "committed",
           "committed_rows", "failures", "get", "live_tolerance", "names", "quote", "range_text",
           "rate_text", "register", "rows", "rules", "run_experiments", "select", "summarize",
           "where"]
