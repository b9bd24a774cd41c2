"""attnbook.data is a package of one-concept modules; every old import path still works (issue 30)."""
import importlib
from pathlib import Path

import pytest

import attnbook.data as data
from attnbook.display import source_of

SUBMODULES = {
    "vocab": {"Vocab", "Batch", "make_batch", "PAD_ID", "BOS_ID", "EOS_ID", "UNK_ID"},
    "task": {"Task", "split_of", "SPLITS"},
    "strings": {"copy_task", "reversal_task", "sorting_task", "digit_word_task", "DIGITS"},
    "dates": {"date_task", "format_date", "parse_date", "DATE_FORMATS", "TWO_DIGIT_YEAR_PIVOT"},
    "recall": {"first_token_recall", "adding_problem", "ADDING_BASELINE_MSE"},
    "poem_corpus": {"PoemCorpus", "load_poems", "read_poems", "shared_line_pairs"},
}


def test_every_name_of_the_package_face_is_its_submodules_object():
    homes = {}
    for sub, names in SUBMODULES.items():
        mod = importlib.import_module(f"attnbook.data.{sub}")
        assert names <= set(mod.__all__), (sub, names - set(mod.__all__))
        for name in mod.__all__:
            assert getattr(data, name) is getattr(mod, name), name   # one object, two paths
            homes[name] = sub
    assert set(data.__all__) == set(homes)          # nothing lost, nothing unexported
    assert len(data.__all__) == len(set(data.__all__))


@pytest.mark.parametrize("sub", sorted(SUBMODULES))
def test_each_submodule_is_small(sub):
    path = Path(importlib.import_module(f"attnbook.data.{sub}").__file__)
    assert len(path.read_text(encoding="utf-8").splitlines()) <= 300


def test_shown_source_names_the_new_file():
    _, path, _ = source_of(data.date_task)
    assert str(path).replace("\\", "/").endswith("attnbook/data/dates.py")


def test_the_experiments_still_import():
    for ch in ("ch01", "ch02", "ch03", "ch10", "ch11"):
        importlib.import_module(f"attnbook.experiments.{ch}")
