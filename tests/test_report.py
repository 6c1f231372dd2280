"""explr.report: grouping runs by schedule and the two-standard-error verdicts."""
import numpy as np
import pytest

from explr.report import compare, summarise


def run(schedule, seed, acc):
    return {"schedule": schedule, "seed": seed, "metrics": {"test_acc": np.asarray(acc, dtype=float)}}


def test_summarise_takes_the_final_epoch_of_each_seed():
    s = summarise([run("step", 1, [0.1, 0.6]), run("step", 0, [0.1, 0.5]), run("texp", 0, [0.2, 0.7])])
    assert s["step"].seeds == (0, 1) and list(s["step"].final) == [0.5, 0.6]
    assert s["step"].mean == pytest.approx(0.55) and s["step"].std == pytest.approx(np.std([0.5, 0.6], ddof=1))
    assert s["texp"].std == 0.0 and s["texp"].epochs == 2


def test_summarise_refuses_mixed_lengths():
    with pytest.raises(ValueError, match="different numbers of epochs"):
        summarise([run("step", 0, [0.1, 0.5]), run("step", 1, [0.1])])


def test_verdicts():
    s = summarise([run("a", 0, [0.80]), run("a", 1, [0.82]), run("b", 0, [0.70]), run("b", 1, [0.72]),
                   run("c", 0, [0.805]), run("c", 1, [0.815])])
    same = compare(s["a"], s["c"], "same")
    assert same.decided and same.verdict.startswith("consistent")
    assert compare(s["a"], s["b"], "same").verdict.startswith("differs")
    assert compare(s["a"], s["b"], "at-least").verdict.startswith("a better")
    assert compare(s["b"], s["a"], "at-least").verdict.startswith("contradicted")
    undecided = compare(s["c"], s["a"], "at-least")
    assert not undecided.decided and "cannot decide" in undecided.verdict
    assert undecided.difference == pytest.approx(0.0) and undecided.standard_error > 0
    with pytest.raises(ValueError, match="kind"):
        compare(s["a"], s["b"], "better")
    one = summarise([run("d", 0, [0.5])])
    with pytest.raises(ValueError, match=">= 2 seeds"):
        compare(one["d"], s["a"], "same")
