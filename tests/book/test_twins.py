"""explr.book.twins: the exact-twin test on a PreResNet (depth 8 here, on generated 16×16 images, a quarter of
CIFAR's convolutions; the experiment runs PreResNet-32 on real CIFAR-10, experiments/exact_twins.py).

Each claim is checked against the round-off estimate B_k derived in the module (an estimate under stated
assumptions, not a bound): an exact twin stays within B_k, the float64 round-off of the same iterates amplified as
the control run measures, also through PerStepLR's rescalings; the twin without corrections departs as
:func:`departure_estimate` predicts, orders of magnitude above B_k; a twin built for the wrong weight decay, and
the near twin built for (1 + ε)λ, exceed B_k."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from explr.book.twins import (PAIRS, RUNS, TwinSettings, departure_estimate, near_estimate, pair_schedules,
                              roundoff_estimate, run_unit, summarise, unit_roundoff)
from explr.models import PreResNet
from explr.schedules import alpha

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

#: 4 epochs of 3 steps, decays after epochs 2 and 3: two decays in 12 steps.
SETTINGS = TwinSettings(epochs=4, steps_per_epoch=3, milestones=(2, 3), batch_size=8)


def build(eps):
    return PreResNet(8, eps=eps, seed=0)


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    images = torch.randn(SETTINGS.steps * SETTINGS.batch_size, 3, 16, 16, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 10, (len(images),), generator=g)
    return images, labels, torch.randn(16, 3, 16, 16, generator=g, dtype=torch.float64)


@pytest.fixture(scope="module")
def step64(data):
    return run_unit(build, *data, SETTINGS, "step", "float64")


def test_the_exact_twin_agrees_to_float64_round_off(step64):
    """D_k ≤ B_k at every recorded step, B_k = e_f + (k+1)(4u + e_g)G_k (module docstring): of order 1e-14 here,
    where a twin off by anything the construction controls is ≥ 1e-6 (the tests below)."""
    dev, bound = np.array(step64["deviation"]["exact"]), unit_roundoff(step64)
    assert np.all(dev <= bound), f"exact twin / bound up to {(dev / bound).max():.3g}"
    assert bound.max() < 1e-10  # the bound is a round-off level: float64's u = 2.2e-16 times a modest count
    assert min(step64["agreement"]["exact"]) == 1.0
    assert step64["norm_error"] <= bound.max()  # ‖θ̃_k‖ = P_k‖θ_k‖: θ's own discrepancy is at most (k+1)ρ ≤ B_k


def test_the_twin_without_corrections_departs_as_predicted(step64):
    """The omitted start push δ = −η̃₀c₀ (4.8e-3) makes D_k ≈ 2s_kF_k, s_k the shortfall on its way to
    δ/(1 − γα*⁻²) (docs/maths-notes.md).  The estimate
    is a scale, not a bound (it leaves out the phase corrections also missing, and takes the path's speed as
    uniform): asserted within a factor 3.  With F_k from 0.04 to 0.3 that is ~1e-3 to 4e-2, and B_k < 1e-12: from
    the first epoch's end on the margin is asserted > 1e6."""
    dev, bound = np.array(step64["deviation"]["uncorrected"]), unit_roundoff(step64)
    s = SETTINGS
    ratio = dev[-1] / departure_estimate(step64["steps"], step64["function_change"], step64["nudge"], s.lr, s.wd,
                                         s.momentum)[-1]
    assert 1 / 3 < ratio < 3, f"uncorrected twin / its estimate = {ratio:.3g}"
    later = np.array(step64["steps"]) >= SETTINGS.steps_per_epoch
    assert (dev[later] / bound[later]).min() > 1e6


def test_a_twin_built_for_the_wrong_weight_decay_fails_the_bound(data, step64):
    """TEXP for 1.1λ is the exact twin of SGD with 1.1λ, not of the original: its norm falls behind by a further
    0.1·ηλ/(1 − γ) = 5e-4 each step, so by the argument of the uncorrected twin D_k ~ 2·(5e-4·k/2)·F_k ~ 1e-3
    at the end, ~1e10 times B_k; asserted to fail B_k by more than a factor 1e3."""
    wrong = run_unit(build, *data, SETTINGS, "step", "float64", runs=("exact",), twin_wd=1.1 * SETTINGS.wd)
    dev, bound = np.array(wrong["deviation"]["exact"]), unit_roundoff(step64)
    assert (dev / bound).max() > 1e3


#: ηλ = 2.5e-3: TEXP's lr grows 8.5 % a step in phase 0 (40 steps); rescaled at 1.01·lr[0], the twins halve θ after
#: steps 0, 17 and 34 (each rescaling leaves the lr in (lr[0]/4, lr[0]], so the next needs 4× growth).
RESCALED = TwinSettings(epochs=4, steps_per_epoch=20, milestones=(2, 3), wd=0.025, batch_size=8, record_every=5,
                        rescale_at=1.01, near=1e-4)


@pytest.fixture(scope="module")
def rescaled(data):
    g = torch.Generator().manual_seed(1)
    images = torch.randn(RESCALED.steps * RESCALED.batch_size, 3, 16, 16, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 10, (len(images),), generator=g)
    return run_unit(build, images, labels, data[2], RESCALED, "step", "float64", runs=("exact", "control", "near"))


def test_the_exact_twin_stays_within_round_off_through_three_rescalings(rescaled):
    """PerStepLR rescales every twin three times (θ/2, lr/4: exact in binary); the exact twin's D_k stays ≤ B_k and
    ‖θ̃_k‖ = P_k‖θ_k‖ in the schedule's units (the optimizer's norm times 2^(−log2 R/2))."""
    assert rescaled["rescalings"]["exact"] >= 3 and rescaled["rescale_steps"]["exact"] == [0, 17, 34]
    assert rescaled["rescalings"]["original"] == rescaled["rescalings"]["control"] == 0
    dev, roundoff = np.array(rescaled["deviation"]["exact"]), unit_roundoff(rescaled)
    assert np.all(dev <= roundoff), f"exact twin / estimate up to {(dev / roundoff).max():.3g}"
    assert rescaled["norm_error"] <= roundoff.max()
    assert min(rescaled["agreement"]["exact"]) == 1.0


def test_the_near_twin_departs_far_above_the_round_off_estimate(rescaled):
    """TEXP for (1 + 1e-4)λ: the near twin is the run with that weight decay; :func:`near_estimate` gives the scale
    of its departure without amplification (~ε/2·F_k), already far above B_k; the dynamics amplify it further.
    D_k/B_k at the end is asserted > 100, while the exact twin stays below 1."""
    row = summarise({"settings": vars(RESCALED), "units": {"step/float64": rescaled}})["step"]
    assert row["rescalings"] >= 3 and row["exact_over_roundoff"] <= 1
    assert row["near_over_roundoff"] > 100 and row["near_departs_at"] is not None
    assert row["near_estimate_ratio"] > 0.3, row["near_estimate_ratio"]
    estimate = near_estimate(rescaled["steps"], rescaled["function_change"], RESCALED.near, RESCALED.lr, RESCALED.wd,
                             RESCALED.momentum)
    assert estimate[-1] > 100 * unit_roundoff(rescaled)[-1]  # the a-priori scale separates too


def test_the_hybrid_is_exact_with_its_per_epoch_corrections_and_departs_without(data):
    """The per-epoch cosine is one phase per epoch: its twin corrects at every epoch's start, and without the
    corrections departs as the step pair's does (same δ at the start); the same bounds, and summarise's row."""
    unit = run_unit(build, *data, SETTINGS, "cosine", "float64")
    exact, uncorrected = (np.array(unit["deviation"][k]) for k in ("exact", "uncorrected"))
    bound = unit_roundoff(unit)
    assert np.all(exact <= bound)
    later = np.array(unit["steps"]) >= SETTINGS.steps_per_epoch
    assert (uncorrected[later] / bound[later]).min() > 1e6
    assert np.count_nonzero(pair_schedules("cosine", SETTINGS)["exact"].lr_wd) == SETTINGS.epochs  # one per phase
    row = summarise({"settings": vars(SETTINGS), "units": {"cosine/float64": unit}})
    assert row["cosine"]["exact_over_roundoff"] <= 1 and row["cosine"]["uncorrected_over_roundoff"] > 1e6


def test_lower_precisions_run_and_report_a_departure_curve(data):
    """float32 and bf16 (CPU autocast): the exact pair's departure is reported, never asserted (chaotic)."""
    small = TwinSettings(epochs=3, steps_per_epoch=1, milestones=(1, 2), batch_size=8)
    units = {f"step/{p}": run_unit(build, *data, small, "step", p) for p in ("float32", "bf16")}
    for unit in units.values():
        assert set(unit["deviation"]) == {"exact"} and len(unit["deviation"]["exact"]) == small.steps + 1
        assert np.all(np.isfinite(unit["deviation"]["exact"])) and "roundoff" not in unit
    summary = summarise({"settings": {"steps_per_epoch": 1}, "units": units})
    assert set(summary["step"]) == {"float32", "bf16"}


def test_the_estimates_are_the_formulas():
    """B_k = e_f + (k+1)(4u + e_g)·max(1, max_{i≤k} D^ctl_i/δ) and 2δ(1 − r^k)/(1 − r)·F_k, on numbers."""
    u = np.finfo(np.float64).eps
    b = roundoff_estimate([0, 1, 2], [5e-9, 3e-8, 1e-8], forward=1e-15, gradient=2e-15, delta=1e-8)
    np.testing.assert_allclose(b, 1e-15 + np.array([1, 2, 3]) * (4 * u + 2e-15) * np.array([1, 3, 3]), rtol=1e-12)
    r = 0.9 / alpha(0.1, 5e-3, 0.9) ** 2  # 0.9095
    np.testing.assert_allclose(departure_estimate([0, 1, 3], [0.0, 0.1, 0.2], -4.8e-3, 0.1, 5e-3, 0.9),
                               [0.0, 2 * 4.8e-3 * 0.1, 2 * 4.8e-3 * (1 + r + r**2) * 0.2], rtol=1e-12)
    per_step = np.log(alpha(0.1, 0.02, 0.9) / alpha(0.1, 0.02 * (1 + 1e-6), 0.9))
    assert per_step > 0
    np.testing.assert_allclose(near_estimate([0, 1, 100], [0.0, 0.1, 0.5], 1e-6, 0.1, 0.02, 0.9),
                               [0.0, 2 * per_step * 0.1, 1e-6 / 2 * 0.5], rtol=1e-12)


@pytest.mark.parametrize("kwargs, name", [
    ({"epochs": 2, "steps_per_epoch": 6, "milestones": (1,)}, "milestones"),  # 12 steps but one decay
    ({"epochs": 4, "steps_per_epoch": 3, "milestones": (2, 4)}, "milestones"),  # a decay after the end
    ({"epochs": 4, "steps_per_epoch": 3, "milestones": (2, 3), "record_every": 2}, "record_every"),
    ({"epochs": 4, "steps_per_epoch": 0, "milestones": (2, 3)}, "steps_per_epoch"),
    ({"epochs": 4, "steps_per_epoch": 3, "milestones": (2, 3), "wd": 0.0}, "wd"),
    ({"epochs": 4, "steps_per_epoch": 3, "milestones": (2, 3), "wd": 0.1}, "lr\\*wd"),  # no exponential twin
    ({"epochs": 4, "steps_per_epoch": 3, "milestones": (2, 3), "rescale_at": 1.0}, "rescale_at"),
    ({"epochs": 4, "steps_per_epoch": 3, "milestones": (2, 3), "rescale_at": float("nan")}, "rescale_at"),
    ({"epochs": 4, "steps_per_epoch": 3, "milestones": (2, 3), "near": 0.0}, "near"),
    ({"epochs": 4, "steps_per_epoch": 3, "milestones": (2, 3), "near": 1e3}, "lr\\*wd"),  # (1 + ε)λ: no twin
])
def test_bad_settings_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TwinSettings(**kwargs)


def test_bad_arguments_name_the_parameter(data):
    with pytest.raises(ValueError, match="precision must be one of"):
        run_unit(build, *data, SETTINGS, "step", "float16")
    with pytest.raises(ValueError, match="pair must be one of"):
        run_unit(build, *data, SETTINGS, "linear", "float64")
    with pytest.raises(ValueError, match="runs must be"):
        run_unit(build, *data, SETTINGS, "step", "float32", runs=("control",))
    with pytest.raises(ValueError, match="build_model must return the same initial weights"):
        run_unit(lambda eps: PreResNet(8, eps=eps), *data, SETTINGS, "step", "float64")
    images, labels, probe = data
    with pytest.raises(ValueError, match="labels must be"):
        run_unit(build, images, labels[:-1], probe, SETTINGS, "step", "float64")
    assert set(PAIRS) == {"step", "cosine"} and RUNS == ("exact", "uncorrected", "control", "near")
    with pytest.raises(ValueError, match="settings.near"):
        run_unit(build, *data, SETTINGS, "step", "float64", runs=("near",))


RESULTS = Path(__file__).resolve().parents[2] / "results" / "exact-twins"


def test_the_committed_rescaling_experiment_holds_its_claims():
    """results/exact-twins/rescaling.json (PreResNet-32, real images, from a clean commit): the exact twin is rescaled
    at least three times and stays within B_k; the near twin and the uncorrected twin exceed it by > 100 at every
    step the summary covers; the stored summary is what summarise computes from the units."""
    metrics = json.loads((RESULTS / "rescaling.json").read_text())
    assert metrics["machine"]["git"]["dirty"] is False and len(metrics["machine"]["git"]["commit"]) == 40
    row = summarise(metrics)["step"]
    assert {k: metrics["summary"]["step"][k] for k in row} == row  # the stored summary also has the old names
    assert row["rescalings"] >= 3 and metrics["units"]["step/float64"]["rescalings"]["near"] >= 3
    assert row["exact_over_roundoff"] <= 1 and row["agree"]
    assert row["near_over_roundoff"] > 100 and row["near_departs_at"] is not None
    assert row["uncorrected_over_roundoff"] > 100
    assert metrics["settings"]["near"] == 1e-6 and "PreResNet-32" in metrics["settings"]["model"]


def test_the_committed_48_step_results_come_from_a_clean_commit_and_hold_their_claims():
    """results/exact-twins/metrics.json (both pairs, 48 steps, from a clean commit): each exact twin within B_k, each
    uncorrected twin > 1e6 B_k, no rescaling; the stored summary is what summarise computes from the units."""
    metrics = json.loads((RESULTS / "metrics.json").read_text())
    assert metrics["machine"]["git"]["dirty"] is False and len(metrics["machine"]["git"]["commit"]) == 40
    summary = summarise(metrics)
    assert set(summary) == {"step", "cosine"}
    for pair, row in summary.items():
        assert {k: metrics["summary"][pair][k] for k in row} == row, pair
        assert row["exact_over_roundoff"] <= 1 and row["agree"] and row["rescalings"] == 0, pair
        assert row["uncorrected_over_roundoff"] > 1e6, pair
