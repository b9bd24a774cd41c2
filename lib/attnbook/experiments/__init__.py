"""Every empirical claim of the book, over seeds (CHAPTER.md point 18).

A single run is an illustration; the evidence is ``python3 make.py experiments``, which runs
every registered claim on seeds 0-4 and writes benchmarks/EXPERIMENTS.md (the figures the
chapters quote) and benchmarks/EXPERIMENTS.json (the raw rows). In a chapter::

    from attnbook import experiments
    from attnbook.experiments import ch08
    m = ch08.run_profiles(0)                      # this run (one seed)
    experiments.where("ch08.last_layer_gap", m)   # where it falls among the committed seeds

Modules: ``core`` (registry, runner, writer), one module per chapter (``ch04``, ``ch08``) that
defines and registers its claims, and the generated ``_committed`` (the summaries, so that
``where`` and ``quote`` also work without a repository checkout, e.g. in Colab).
"""
from .core import (
    DEFAULT_SEEDS,
    Experiment,
    committed,
    failures,
    get,
    names,
    quote,
    range_text,
    register,
    run_experiments,
    select,
    summarize,
    where,
    write_outputs,
)

__all__ = ["DEFAULT_SEEDS", "Experiment", "committed", "failures", "get", "names", "quote",
           "range_text", "register", "run_experiments", "select", "summarize", "where",
           "write_outputs"]
