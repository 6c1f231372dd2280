"""explr.book.judging: chapter 6's registered path from run folders to verdicts -- which runs a plan judges (its
recipe, v4: the resolved precision and device type too), failed and missing runs, the final accuracies and the
decisions.  The rule itself: test_verdicts.py; the plans and their registration: test_registration.py."""
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pytest

from explr.book.judging import (ATTEMPTS, decide, declared_missing, failure, in_grid, open_runs, read_missing,
                                same_recipe, split_runs, summarise)
from explr.book.registration import PLAN_PATH, PLAN_V2_PATH, PLAN_V3_PATH, load_plan
from explr.book.verdicts import holm
from explr.cifar10 import Status

ROOT = Path(__file__).resolve().parents[2]
PILOT = ROOT / "results" / "cifar10-full"
PLAN = load_plan(PLAN_PATH)
PLAN2 = load_plan(PLAN_V2_PATH)
PLAN3 = load_plan(PLAN_V3_PATH)
PLAN4 = load_plan()


def run(schedule, seed, acc, **manifest):
    out = {"schedule": schedule, "seed": seed, "metrics": {"test_acc": np.asarray(acc, dtype=float)}}
    return {**out, "manifest": manifest} if manifest else out


def grid_run(arm="step", seed=None, started=None, status="finished", plan=PLAN4, resolved=None, **config):
    """A run of ``plan``'s grid with its recipe (``config`` changes it), started a second after v4's registration;
    ``resolved``: the manifest's resolved settings (default: bf16 on cuda, as on the pilot's H200)."""
    schedule, corrections = plan.arms[arm]["schedule"], plan.arms[arm]["corrections"]
    when = started or (PLAN4.registration.committed + dt.timedelta(seconds=1)).isoformat()
    manifest = {"config": {**plan.config, "schedule": schedule, "corrections": corrections, "seed": seed, **config},
                "data": {**plan.data}, "started": when, "status": status,
                "resolved": {"device": "cuda", "precision": "bf16", "threads": 1} if resolved is None else resolved}
    return run(schedule if corrections == "all" else arm, plan.seeds[0] if seed is None else seed, [0.8],
               **manifest)


def pilot_runs():
    from explr.cifar10 import load_runs

    return [r for name in ("main", "ablation-none", "paper-scale") for r in load_runs(PILOT / name)]


# ----------------------------------------------------------------------------- which runs a plan judges
def test_split_runs_judges_only_the_grid_started_after_the_registration_second():
    at = PLAN4.registration.committed
    good = [grid_run(arm, k) for arm in PLAN4.arms for k in PLAN4.seeds[:2]]
    bad = [grid_run(started=at.isoformat()),  # in the registration's second: not after it
           grid_run(started=(at + dt.timedelta(seconds=0.5)).isoformat()),  # still inside it
           grid_run(started=(at - dt.timedelta(days=1)).isoformat()), grid_run(epochs=200), grid_run(seed=0),
           grid_run(augment=1),  # 1 is not True
           grid_run(started=(at + dt.timedelta(hours=1)).astimezone(dt.timezone(dt.timedelta(hours=-5))).isoformat(),
                    wd=5e-3)]
    judged, rest = split_runs(PLAN4, good + bad)
    assert judged == good and rest == bad
    late_ok = grid_run(started=(at + dt.timedelta(seconds=1)).astimezone(dt.timezone(dt.timedelta(hours=9)))
                       .isoformat())
    assert split_runs(PLAN4, [late_ok])[0] == [late_ok]  # another UTC offset, one second later
    for plan in (PLAN, PLAN2, PLAN3):  # v1 unregistered, v2 and v3 superseded: they judge nothing
        assert split_runs(plan, good) == ([], good)
    with pytest.raises(ValueError, match="started must be an ISO time"):
        split_runs(PLAN4, [grid_run(started="2026-12-02")])


@pytest.mark.parametrize("resolved, judged", [
    ({"device": "cuda", "precision": "bf16"}, True),
    ({"device": "cuda:3", "precision": "bf16"}, True),  # the device compares by its type
    ({"device": "cpu", "precision": "fp32"}, False),  # a CPU run: what "auto" resolves to there
    ({"device": "cpu", "precision": "bf16"}, False),
    ({"device": "cuda", "precision": "fp32"}, False),
    ({"device": "cuda"}, False),  # a resolved setting absent from the manifest differs
    ({"device": None, "precision": "bf16"}, False),
    ("cuda bf16", False),  # no record of what was resolved
], ids=["cuda", "cuda:3", "cpu fp32", "cpu bf16", "cuda fp32", "no precision", "device null", "not a dict"])
def test_v4_judges_only_runs_resolved_to_bf16_on_a_cuda_device(resolved, judged):
    """v4's recipe pins what its scope says; v3's rule looked at neither, so it judged every one of these."""
    assert PLAN4.resolved == {"precision": "bf16", "device": "cuda"} and PLAN4.config["precision"] == "bf16"
    one = grid_run(resolved=resolved)
    assert same_recipe(PLAN4, one["manifest"]) is judged and in_grid(PLAN4, one) is judged
    assert (split_runs(PLAN4, [one])[0] == [one]) is judged
    assert same_recipe(PLAN3, grid_run(plan=PLAN3, resolved=resolved)["manifest"])  # v3: any precision, device


def test_a_run_launched_with_precision_auto_is_not_v4s_recipe_even_on_a_gpu():
    """The pilot's runs said precision "auto": v4 states "bf16", so a run of the grid must have been started so."""
    assert not same_recipe(PLAN4, grid_run(precision="auto")["manifest"])


def test_the_pilot_is_judged_by_no_plan():
    runs = pilot_runs()
    for plan in (PLAN, PLAN2, PLAN3, PLAN4):
        assert split_runs(plan, runs) == ([], runs)
    assert all(r["manifest"]["resolved"]["precision"] == "bf16" for r in runs)  # what v4 pins, the pilot had
    assert not any(same_recipe(PLAN4, r["manifest"]) for r in runs)  # but it was launched with "auto"


# ----------------------------------------------------------------------------- failed and missing runs
@pytest.mark.parametrize("manifest, reported, locked, status", [
    ({"status": "finished"}, Status.FAILED, False, None),  # finished, whatever its worker's exit code
    ({"status": "running"}, Status.DIVERGED, False, "diverged"),
    ({"status": "running"}, Status.FAILED, False, "failed"),
    ({"status": "interrupted"}, Status.INTERRUPTED, False, None),  # stopped from outside: resumed, not counted
    ({"status": "diverged", "message": "loss nan"}, None, False, "diverged"),
    ({"status": "running", "epochs_done": 3}, None, False, "failed"),  # a crash: nobody holds its lock
    ({"status": "running"}, None, True, None),  # still training elsewhere
    ({"status": "interrupted"}, None, False, None),
    ({}, None, False, None),
])
def test_a_failed_attempt_is_a_divergence_a_failed_worker_or_a_dead_process(manifest, reported, locked, status):
    got = failure(manifest, reported, "why", locked=locked)
    assert (got and got["status"]) == status
    if status == "failed" and reported is None:
        assert "after 3 epochs" in got["message"]


def test_a_run_is_declared_missing_after_its_third_failed_attempt_and_the_grid_closes_then():
    tried = {"status": "diverged", "message": "loss nan"}
    attempts = {("texp", 100): [tried] * ATTEMPTS, ("step", 100): [tried] * (ATTEMPTS - 1), ("cosine", 101): []}
    assert declared_missing(attempts) == [{"arm": "texp", "seed": 100, "attempts": [tried] * ATTEMPTS}]
    judged = [grid_run(arm, k) for arm in PLAN4.arms for k in PLAN4.seeds[:2] if arm != "texp"]
    still = open_runs(PLAN4, judged, [("texp", PLAN4.seeds[0])])
    assert ("texp", PLAN4.seeds[0]) not in still and ("texp", PLAN4.seeds[1]) in still
    assert ("texp", PLAN4.seeds[0]) in open_runs(PLAN4, judged)  # without the declaration, the grid is open
    assert len(open_runs(PLAN4, [])) == len(PLAN4.arms) * len(PLAN4.seeds)


def test_read_missing_reads_the_grids_record_and_names_a_broken_one(tmp_path):
    path = tmp_path / "missing.json"
    assert read_missing(path) == []  # no file: nothing declared missing
    path.write_text(json.dumps({"missing": declared_missing({("texp", 100): [{"status": "failed"}] * ATTEMPTS})}))
    assert read_missing(path) == [("texp", 100)]
    for text in ("{]", "[]", '{"missing": [{"arm": "texp"}]}', '{"missing": [{"arm": 1, "seed": 100}]}'):
        path.write_text(text)
        with pytest.raises(ValueError, match="missing.json") as err:
            read_missing(path)
        assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- final accuracies and decisions
def test_summarise_takes_the_final_epoch_of_each_seed_and_names_arms_by_their_corrections():
    s = summarise([run("step", 1, [0.1, 0.6]), run("step", 0, [0.1, 0.5]), run("texp", 0, [0.2, 0.7])])
    assert s["step"].seeds == (0, 1) and list(s["step"].final) == [0.5, 0.6]
    assert s["step"].mean == pytest.approx(0.55) and s["step"].std == pytest.approx(np.std([0.5, 0.6], ddof=1))
    assert s["texp"].std == 0.0 and s["texp"].epochs == 2
    ablation = run("texp", 0, [0.3], config={"schedule": "texp", "corrections": "none"})
    assert list(summarise([ablation, run("texp", 0, [0.4])])) == ["texp-none", "texp"]


def test_summarise_refuses_mixed_lengths():
    with pytest.raises(ValueError, match="different numbers of epochs"):
        summarise([run("step", 0, [0.1, 0.5]), run("step", 1, [0.1])])


def grid_summaries(shift=None, noise=0.0002, arms=None, seeds=range(100, 106), shared=0.003):
    """Summaries of the plan's arms at 82 % plus ``shift[arm]``, seed-to-seed noise (sd ``shared``) common to every
    arm of a seed plus a per-run part (sd ``noise``)."""
    shift = shift or {}
    rng = np.random.default_rng(1)
    common = rng.normal(0, shared, len(seeds))
    runs = [run(arm, k, [0.1, 0.82 + shift.get(arm, 0.0) + common[i] + rng.normal(0, noise)])
            for arm in (arms or PLAN4.arms) for i, k in enumerate(seeds)]
    for r in runs:
        r["manifest"] = {"config": {"schedule": PLAN4.arms[r["schedule"]]["schedule"],
                                    "corrections": PLAN4.arms[r["schedule"]]["corrections"]}}
    return summarise(runs)


def test_each_claim_is_decided_by_its_own_test_without_cross_vetoes():
    """A gain of 0.2 points, far inside the margin and shown with tight pairs, supports the superiority claim (v2
    called it 'equivalent' and so contradicted it); two equal arms support equivalence."""
    out = {d.claim.id: d for d in decide(PLAN4, grid_summaries({"cosine-texp": 0.002, "cosine": 0.002}))}
    assert out["C4"].supported and out["C1"].supported and out["C2"].supported and out["C3"].supported
    assert abs(out["C4"].difference - 0.002) < 3e-4 and out["C4"].difference < PLAN4.margin
    assert out["C4"].sentence.startswith("supported at α = 0.05: cosine-texp better than step")
    assert "Holm-adjusted" in out["C1"].sentence and "exploratory, unadjusted" in out["C3"].sentence
    worse = {d.claim.id: d for d in decide(PLAN4, grid_summaries({"cosine-texp": -0.01}))}
    assert not worse["C4"].supported and worse["C4"].p > 0.5
    assert not worse["C3"].supported and worse["C1"].supported
    assert [(d.p, d.supported) for d in decide(PLAN3, grid_summaries())] == [
        (d.p, d.supported) for d in decide(PLAN4, grid_summaries())]  # v4 decides as v3 did


def test_the_family_is_fixed_an_untested_claim_counts_as_not_rejected():
    """With texp-none missing, C2 is not tested and enters Holm with p = 1: C1's adjusted p is the one of a family
    of three, not two."""
    full = {d.claim.id: d for d in decide(PLAN4, grid_summaries(noise=0.001))}
    short = {d.claim.id: d for d in decide(PLAN4, grid_summaries(noise=0.001, arms=["step", "texp", "cosine-texp",
                                                                                       "cosine"]))}
    c2 = short["C2"]
    assert not c2.tested and not c2.supported and c2.p is None and c2.p_compared == 1.0 and "not tested" in c2.sentence
    expected = holm([short["C1"].p, 1.0, short["C4"].p])
    assert short["C1"].p_compared == pytest.approx(expected[0]) and short["C4"].p_compared == pytest.approx(expected[2])
    assert short["C1"].p_compared > holm([short["C1"].p, short["C4"].p])[0]  # a family of two would be laxer
    assert short["C1"].p == full["C1"].p
    with pytest.raises(ValueError, match="decide applies a version-3 or -4 plan"):
        decide(PLAN2, grid_summaries())
