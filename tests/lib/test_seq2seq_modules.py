"""attnbook.seq2seq is a package of one-concept modules; every old import path still works (issue 30)."""
import importlib
from pathlib import Path

import pytest

import attnbook.seq2seq as seq2seq
from attnbook.display import source_of

SUBMODULES = {
    "score": {"AttentionScore", "SCORES"},
    "encoder": {"GRUEncoder", "EncoderOutput"},
    "base": {"Seq2SeqOutput"},
    "without_attention": {"Seq2Seq", "CONTEXTS"},
    "with_attention": {"AttentionSeq2Seq", "FLOWS"},
}


def test_every_name_of_the_package_face_is_its_submodules_object():
    exported = set()
    for sub, names in SUBMODULES.items():
        mod = importlib.import_module(f"attnbook.seq2seq.{sub}")
        assert names <= set(mod.__all__), (sub, names - set(mod.__all__))
        for name in mod.__all__:
            assert getattr(seq2seq, name) is getattr(mod, name), name   # one object, two paths
            exported.add(name)
    assert set(seq2seq.__all__) <= exported and set(seq2seq.__all__) >= exported - {"CONTEXTS"}
    # both models share one base (teacher forcing, step_fn) and one encoder class
    assert seq2seq.Seq2Seq.step_fn is seq2seq.AttentionSeq2Seq.step_fn


@pytest.mark.parametrize("sub", sorted(SUBMODULES))
def test_each_submodule_is_small(sub):
    path = Path(importlib.import_module(f"attnbook.seq2seq.{sub}").__file__)
    assert len(path.read_text(encoding="utf-8").splitlines()) <= 300


def test_shown_source_names_the_new_files():
    # chapter 03 shows AttentionScore, AttentionSeq2Seq.attend and .decode
    for obj, file in ((seq2seq.AttentionScore, "score.py"),
                      (seq2seq.AttentionSeq2Seq.attend, "with_attention.py"),
                      (seq2seq.AttentionSeq2Seq.decode, "with_attention.py")):
        _, path, _ = source_of(obj)
        assert str(path).replace("\\", "/").endswith(f"attnbook/seq2seq/{file}"), (obj, path)
