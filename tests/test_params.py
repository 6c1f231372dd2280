"""explr.params: the rules and check_parameters' one-line errors."""
import math

import numpy as np
import pytest

from explr.params import FLOAT64_MAX, Choice, Flag, Float, Folder, Int, Numbers, Text, check_parameters, is_real


@pytest.mark.parametrize("rule, good, bad", [
    (Int(1), [1, 7, np.int64(3)], [0, 1.0, True, "2"]),
    (Int(8, (6, 2)), [8, 14, 20, 32], [15, 2]),
    (Int(0, maximum=5), [0, 5], [6, -1]),
    (Float(0), [1e-9, 3, np.float32(0.5)], [0, -1, math.inf, math.nan, False, "1"]),
    (Float(0, 1, lo_open=False), [0.0, 0.99], [1.0, -0.1]),
    (Choice(("a", "b")), ["a"], ["c", None]),
    (Flag(), [True, np.bool_(False)], [1, "True"]),
    (Text("a name"), ["x"], ["", 3]),
    (Numbers(Int(1), min_len=2, increasing=True), [[1, 2], (3, 9)], [[2, 1], [1], [1, 1], [0, 1], "12"]),
    (Numbers(Float(0), distinct=True, none_ok=True), [None, [0.1, 0.2]], [[0.1, 0.1], []]),
])
def test_rules_accept_and_refuse(rule, good, bad):
    assert all(rule.ok(v) for v in good), [v for v in good if not rule.ok(v)]
    assert not any(rule.ok(v) for v in bad), [v for v in bad if rule.ok(v)]
    assert isinstance(rule.rule(), str) and rule.rule()


def test_check_parameters_names_the_first_bad_value_and_its_rule():
    params = {"steps": 3, "lr": 0.1, "momentum": 0.9, "wd": 0.1}
    with pytest.raises(ValueError, match=r"^steps = 3: must be an integer >= 20$"):
        check_parameters(params, {"steps": Int(20), "lr": Float(0)})
    rules = {"lr": Float(0), "momentum": Float(0, 1, lo_open=False),
             "wd": lambda: Float(0, (1 - math.sqrt(params["momentum"])) ** 2 / params["lr"], hi_open=False)}
    with pytest.raises(ValueError, match=r"^wd = 0.1: must be a finite number in \(0, 0.0263"):
        check_parameters(params, rules)
    check_parameters({**params, "wd": 5e-4}, rules)  # passes
    # a lazy rule is built only after the parameters before it passed: lr = 0 is named, no ZeroDivisionError
    with pytest.raises(ValueError, match=r"^lr = 0: "):
        check_parameters({**params, "lr": 0}, rules)
    with pytest.raises(ValueError, match="no such parameter"):
        check_parameters(params, {"epochs": Int(1)})


def test_folder_accepts_an_existing_folder_or_a_fetchable_name_and_nothing_else(tmp_path):
    rule = Folder("a folder of CIFAR-10 runs", fetchable=("../results/cifar10-full",))
    assert rule.ok(str(tmp_path)) and rule.ok("../results/cifar10-full")
    (tmp_path / "file").write_text("")
    for bad in [str(tmp_path / "nope"), str(tmp_path / "file"), "../results/nope", "", None, 3]:
        assert not rule.ok(bad), bad
    with pytest.raises(ValueError, match=r"^results = '/nonexistent': must be a folder of CIFAR-10 runs: an existing "
                                         r"folder \(or one of \.\./results/cifar10-full, fetched when absent\)$"):
        check_parameters({"results": "/nonexistent"}, {"results": rule})


def test_a_choice_says_why_with_its_note():
    rule = Choice((False,), note=' (add "texp" to schedules)')
    assert rule.ok(False) and not rule.ok(True)
    assert rule.rule() == 'one of False (add "texp" to schedules)'


def test_an_int_beyond_float64_is_refused_as_a_float_in_one_line_not_an_overflow_error():
    assert not is_real(10**400) and not is_real(-(10**400)) and is_real(10**300) and is_real(2**1023)
    assert not Float(0).ok(10**400) and not Numbers(Float(0)).ok([0.5, 10**400])
    assert Float(0).ok(FLOAT64_MAX) and Float(0).rule() == "a finite number in (0, 1.79769e+308]"
    for value, shown in [(10**400, "1" + "0" * 29 + "…" + "0" * 10 + r" \(401 characters\)"),
                         (10**5000, "<a int too large to print>"),  # past the 4,300 digits str() converts
                         ([10**5000], "<a list too large to print>")]:
        with pytest.raises(ValueError, match=rf"^lr = {shown}: must be a finite number in \(0, 1.79769e\+308\]$"):
            check_parameters({"lr": value}, {"lr": Float(0)})
    with pytest.raises(ValueError, match=r"^delta = 1000.*: must be a finite number in \(0, 1\)$"):
        check_parameters({"delta": 10**400}, {"delta": Float(0, 1)})
    # a short value is shown whole
    with pytest.raises(ValueError, match=r"^steps = \[1, 2, 3\]: "):
        check_parameters({"steps": [1, 2, 3]}, {"steps": Int(1)})
