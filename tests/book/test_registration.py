"""explr.book.registration: chapter 6's analysis plans (v1, v2 superseded; v3; v4) and their registration -- the
plan files, the record of their sha256 and commit, the hashes of the code that judges, and the check against git."""
import dataclasses
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import explr.book.registration as reg
from explr.book.registration import (CODE_DIR, JUDGING_CODE, PLAN_PATH, PLAN_V2_PATH, PLAN_V3_PATH, PLAN_V4_PATH,
                                     REGISTRATIONS_PATH, PlanError, load_plan, parse_utc)
from explr.cifar10.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
PLAN = load_plan(PLAN_PATH)
PLAN2 = load_plan(PLAN_V2_PATH)
PLAN3 = load_plan(PLAN_V3_PATH)
PLAN4 = load_plan()


# ----------------------------------------------------------------------------- plans v1 and v2 (superseded)
SCHEDULES = {"step", "texp", "texp--", "cosine", "cosine-texp", "texp-none"}


def test_the_v1_plan_is_complete_and_names_known_schedules():
    raw = json.loads(PLAN_PATH.read_text())
    assert PLAN.min_seeds >= 5 and PLAN.alpha == 0.05 and 0 < PLAN.margin <= 0.01 and PLAN.version == 1
    for reason in ("margin_criterion", "min_seeds_reason", "test_reason", "multiplicity_family", "scope"):
        assert len(raw[reason]) > 40, reason
    assert {c.a for c in PLAN.claims} | {c.b for c in PLAN.claims} <= SCHEDULES
    assert len({c.id for c in PLAN.claims}) == len(PLAN.claims) and PLAN.family == PLAN.claims
    assert PLAN.registration is None  # superseded: it judges no run


def test_a_plan_with_a_bad_field_is_refused(tmp_path):
    for source in (PLAN_PATH, PLAN_V2_PATH):
        raw = json.loads(source.read_text())
        for key, value, match in [("min_seeds", 1, "min_seeds"), ("alpha", 0, "alpha"), ("test", "paired", "welch")]:
            (tmp_path / "p.json").write_text(json.dumps({**raw, key: value}))
            with pytest.raises(ValueError, match=match):
                load_plan(tmp_path / "p.json")
        broken = {**raw, "claims": [{**raw["claims"][0], "hypothesis": "a worse"}]}
        (tmp_path / "p.json").write_text(json.dumps(broken))
        with pytest.raises(ValueError, match="hypothesis"):
            load_plan(tmp_path / "p.json")
    raw = json.loads(PLAN_V2_PATH.read_text())
    for changes, match in [({"seeds": raw["seeds"][:2]}, "seeds must be at least"), ({"config": {}}, "epochs"),
                           ({"arms": {**raw["arms"], "texp-none": {"schedule": "texp", "corrections": "all"}}},
                            "must be named 'texp'"),
                           ({"claims": [{**raw["claims"][0], "role": "secondary"}]}, "role"),
                           ({"claims": [{**raw["claims"][0], "a": "sgd"}]}, "not in 'arms'")]:
        (tmp_path / "p.json").write_text(json.dumps({**raw, **changes}))
        with pytest.raises(ValueError, match=match):
            load_plan(tmp_path / "p.json")
    (tmp_path / "p.json").write_text(json.dumps({k: v for k, v in raw.items() if k != "power"}))
    with pytest.raises(ValueError, match="no 'power'"):
        load_plan(tmp_path / "p.json")


def test_the_v2_plan_is_kept_and_superseded_so_it_judges_nothing():
    assert PLAN2.version == 2 and PLAN2.margin == 0.005 and PLAN2.registration is None
    assert [c.id for c in PLAN2.family] == ["C1", "C3", "C4", "C5"] and len(PLAN2.seeds) == 17
    record = json.loads(REGISTRATIONS_PATH.read_text())["plans"][PLAN_V2_PATH.name]
    assert record["superseded_by"] == PLAN_V3_PATH.name and record["commit"].startswith("4652fb3")


# ----------------------------------------------------------------------------- plan v3
SEED_SENTENCES = {  # Li & Arora's own words, as /work/shared/seeds gives them
    "C1": "previously we have only verified our equivalence theorem in Step Decay LR schedules",
    "C2": "We empirically find on CIFAR10 that ignoring the correction term does not change performance much.",
    "C4": "Our experiments show this hybrid schedule with Cosine LR performs better on CIFAR10 than Step Decay",
    "C3": "it’s not sure how would the Exponential LR schedule behave on more rapid time-varying LR schedules",
}


def test_the_v3_plan_follows_the_paper_and_needs_only_its_arms():
    raw = json.loads(PLAN_V3_PATH.read_text())
    assert PLAN3.version == 3 and PLAN3.alpha == 0.05 and PLAN3.registration is None  # superseded by v4
    assert [c.id for c in PLAN3.family] == ["C1", "C2", "C4"]
    assert {c.id: c.hypothesis for c in PLAN3.family} == {"C1": "equivalent", "C2": "equivalent", "C4": "a better"}
    assert [c.id for c in PLAN3.claims if c.role == "exploratory"] == ["C3", "C5"]
    for c in PLAN3.claims:
        assert "16 epochs" in c.question, c.id  # the scope in the claim's own words
        if c.id in SEED_SENTENCES:
            assert SEED_SENTENCES[c.id].replace("’", "'") in c.source.replace("’", "'"), c.id
    assert all("bf16" in c.question for c in PLAN3.claims if c.id in ("C1", "C3"))
    assert "not a claim of the paper" in next(c.source for c in PLAN3.claims if c.id == "C5")
    assert set(PLAN3.arms) == {c.a for c in PLAN3.claims} | {c.b for c in PLAN3.claims}  # no arm without a claim
    assert PLAN3.seeds == tuple(range(100, 100 + raw["power"]["n"]))  # none of the pilot's seeds 0-4
    for reason in ("supersedes", "scope", "arms_reason", "config_reason", "seeds_reason", "margin_criterion",
                   "test_reason", "tests_reason", "multiplicity_family", "missing_runs"):
        assert len(raw[reason]) > 150, reason
    assert PLAN3.missing_runs == raw["missing_runs"] and "3 attempts" in PLAN3.missing_runs


def test_the_v3_margin_is_the_test_sets_resolution_at_the_recipes_accuracy_and_below_the_effect():
    """δ = sqrt(p (1 − p) / 10,000) at p = 0.82 (v1/v2's 0.5 points is the same formula at p = 0.5), and smaller
    than the superiority effect the power analysis assumes."""
    assert PLAN3.margin == round(np.sqrt(0.82 * 0.18 / PLAN3.data["n_test"]), 5) == 0.00384
    assert PLAN2.margin == round(np.sqrt(0.5 * 0.5 / PLAN3.data["n_test"]), 5) != PLAN3.margin
    effect = PLAN3.power["means"]["cosine-texp"] - PLAN3.power["means"]["step"]
    assert PLAN3.margin < effect and f"{100 * PLAN3.margin / effect:.0f} %" in json.loads(
        PLAN_V3_PATH.read_text())["margin_criterion"]


# ----------------------------------------------------------------------------- registration
def _git(*args, cwd=ROOT, **env):
    import os

    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          env={**os.environ, **env}).stdout.strip()


def test_an_edited_plan_is_refused_and_an_unchanged_copy_loads(tmp_path):
    for source in (PLAN_V3_PATH, PLAN_V2_PATH, PLAN_PATH):
        copy = tmp_path / source.name
        shutil.copyfile(source, copy)
        assert load_plan(copy, registrations=REGISTRATIONS_PATH).registration == load_plan(source).registration
        copy.write_bytes(source.read_bytes().replace(b'"alpha": 0.05', b'"alpha": 0.049'))
        with pytest.raises(PlanError, match="never edited"):
            load_plan(copy, registrations=REGISTRATIONS_PATH)
    assert load_plan(copy, registrations=tmp_path / "none.json").registration is None  # unregistered: judges none


def test_a_changed_decision_rule_is_refused(tmp_path, monkeypatch):
    """v3's registration holds the sha256 of verdicts.py: one changed character of the rule (α's comparison made
    <=) and the plan no longer loads."""
    code = (CODE_DIR / "verdicts.py").read_bytes()
    assert code.count(b"c < alpha") == 1
    (tmp_path / "verdicts.py").write_bytes(code.replace(b"c < alpha", b"c <= alpha"))
    monkeypatch.setattr(reg, "CODE_DIR", tmp_path)
    with pytest.raises(PlanError, match="verdicts.py: sha256 .* registered with analysis_plan_v3.json"):
        load_plan(PLAN_V3_PATH)
    (tmp_path / "verdicts.py").unlink()
    with pytest.raises(PlanError, match="cannot read"):
        load_plan(PLAN_V3_PATH)
    assert load_plan(PLAN_V2_PATH).version == 2  # v2 registered no code


def _v4_record(code_dir=CODE_DIR, files=JUDGING_CODE):
    """A registration of v4 as its record will hold it: the plan's and each judging file's sha256."""
    sha = lambda path: hashlib.sha256(path.read_bytes()).hexdigest()  # noqa: E731
    return {"plans": {PLAN_V4_PATH.name: {
        "sha256": sha(PLAN_V4_PATH), "commit": "4" * 40, "committed": "2026-12-04T21:00:00+00:00",
        "judging_code": [{"file": name, "sha256": sha(code_dir / name)} for name in files]}}}


@pytest.mark.parametrize("name", JUDGING_CODE)
def test_v4_refuses_an_edit_to_any_file_on_the_judging_path(name, tmp_path, monkeypatch):
    """v4's record hashes verdicts.py, judging.py and registration.py: one character added to any of them (an
    edited copy, read where load_plan reads the code) and v4 no longer loads; the unedited copies load."""
    registry = tmp_path / "registrations.json"
    registry.write_text(json.dumps(_v4_record()))
    copies = tmp_path / "book"
    copies.mkdir()
    for each in JUDGING_CODE:
        shutil.copyfile(CODE_DIR / each, copies / each)
    monkeypatch.setattr(reg, "CODE_DIR", copies)
    plan = load_plan(PLAN_V4_PATH, registry, check_git=False)
    assert dict(plan.registration.code) == {e["file"]: e["sha256"]
                                            for e in _v4_record()["plans"][PLAN_V4_PATH.name]["judging_code"]}
    (copies / name).write_bytes((copies / name).read_bytes() + b"\n")
    with pytest.raises(PlanError, match=f"{name}: sha256 .* registered with {PLAN_V4_PATH.name}; registered code"):
        load_plan(PLAN_V4_PATH, registry, check_git=False)


def test_a_v4_record_must_hash_the_whole_judging_path(tmp_path):
    registry = tmp_path / "registrations.json"
    registry.write_text(json.dumps(_v4_record(files=("verdicts.py",))))  # v3's protection only
    with pytest.raises(PlanError, match="hashes \\['verdicts.py'\\], not the judging path"):
        load_plan(PLAN_V4_PATH, registry, check_git=False)


def test_the_v4_plan_is_v3_with_its_recipe_pinned_and_its_reasons_fixed():
    """The same claims, hypotheses, roles, arms, seeds, α, δ and power table as v3; precision "bf16" (no "auto")
    in config and resolved, on a CUDA device; no epoch count of the paper's, δ as a chosen effect of interest."""
    raw = json.loads(PLAN_V4_PATH.read_text())
    assert PLAN4.version == 4 and PLAN4.path == PLAN_V4_PATH and PLAN4.registration is not None
    same = ("claims", "arms", "seeds", "alpha", "margin", "data", "missing_runs")
    assert all(getattr(PLAN4, k) != getattr(PLAN3, k) for k in ("claims", "missing_runs"))  # questions, rule's home
    assert [(c.id, c.a, c.b, c.hypothesis, c.role, c.source) for c in PLAN4.claims] == [
        (c.id, c.a, c.b, c.hypothesis, c.role, c.source) for c in PLAN3.claims]
    assert all(getattr(PLAN4, k) == getattr(PLAN3, k) for k in same if k not in ("claims", "missing_runs"))
    assert PLAN4.missing_runs.startswith(PLAN3.missing_runs)
    assert PLAN4.config == {**PLAN3.config, "precision": "bf16"} and PLAN3.config["precision"] == "auto"
    assert PLAN4.resolved == {"precision": "bf16", "device": "cuda"}
    text = json.dumps(raw)
    assert "200" not in " ".join(c.question for c in PLAN4.claims) and "roughly 200" not in raw["scope"]
    assert "resolution" not in raw["margin_criterion"] and "smallest effect of interest" in raw["margin_criterion"]
    assert "judging.py" in raw["registered"] and "seeds_needed" not in text
    for reason in ("supersedes", "scope", "config_reason", "resolved_reason", "margin_criterion"):
        assert len(raw[reason]) > 150, reason


@pytest.mark.parametrize("change, match", [
    ({"resolved": {"precision": "auto", "device": "cuda"}}, "not 'auto'"),
    ({"resolved": {"precision": "fp32", "device": "cuda"}}, "as config states it"),
    ({"resolved": {"precision": "bf16"}}, "'resolved' has no 'device'"),
    ({"resolved": {"precision": "bf16", "device": "cuda", "threads": 1}}, "nothing else"),
    ({"resolved": "bf16"}, "'resolved' must be a JSON object"),
])
def test_a_v4_plan_must_pin_its_resolved_recipe(change, match, tmp_path):
    path = _malformed(tmp_path, {**json.loads(PLAN_V4_PATH.read_text()), **change})
    with pytest.raises(PlanError, match=match):
        load_plan(path, registrations=tmp_path / "none.json")


def test_the_registration_record_matches_the_plan_files():
    record = json.loads(REGISTRATIONS_PATH.read_text())["plans"]
    assert record.keys() == {PLAN_PATH.name, PLAN_V2_PATH.name, PLAN_V3_PATH.name, PLAN_V4_PATH.name}
    for path in (PLAN_PATH, PLAN_V2_PATH, PLAN_V3_PATH, PLAN_V4_PATH):
        assert record[path.name]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert record[PLAN_PATH.name]["commit"] is None and PLAN.registration is None
    verdicts = hashlib.sha256((CODE_DIR / "verdicts.py").read_bytes()).hexdigest()
    assert record[PLAN_V3_PATH.name]["decision_code"] == {"file": "verdicts.py", "sha256": verdicts}
    assert record[PLAN_V3_PATH.name]["superseded_by"] == PLAN_V4_PATH.name and PLAN3.registration is None
    reg = PLAN4.registration
    assert reg.commit == record[PLAN_V4_PATH.name]["commit"] and [name for name, _ in reg.code] == list(JUDGING_CODE)
    assert dict(reg.code) == {name: hashlib.sha256((CODE_DIR / name).read_bytes()).hexdigest()
                              for name in JUDGING_CODE}


@pytest.mark.parametrize("path", [PLAN_V2_PATH, PLAN_V3_PATH, PLAN_V4_PATH])
def test_git_history_shows_each_plan_committed_once_by_its_recorded_commit_at_its_recorded_time(path):
    """The registration is the commit that added the plan: its only commit (an edit would add one), whose
    committer time is the recorded one to the second, and whose file has the recorded sha256; v3's decision code
    and v4's judging code were committed, unchanged since, before it."""
    if not (ROOT / ".git").exists() or _git("rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("needs a full git clone (a shallow one has no history): actions/checkout with fetch-depth: 0")
    rel = path.relative_to(ROOT).as_posix()
    log = _git("log", "--format=%H %cI", "--", rel).splitlines()  # not --follow: v4 reads as a copy of v3
    assert len(log) == 1, f"{rel} has {len(log)} commits; a registered plan is never edited: {log}"
    commit, when = log[0].split()
    record = json.loads(REGISTRATIONS_PATH.read_text())["plans"][path.name]
    assert commit == record["commit"] and parse_utc(when, "git") == parse_utc(record["committed"], "record")
    assert _git("show", "--format=", "--name-only", commit).splitlines() == [rel]  # the plan alone
    blob = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=ROOT, capture_output=True, check=True).stdout
    assert hashlib.sha256(blob).hexdigest() == record["sha256"]
    for entry in record.get("judging_code") or ([record["decision_code"]] if "decision_code" in record else []):
        rel = (CODE_DIR / entry["file"]).relative_to(ROOT).as_posix()
        blob = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=ROOT, capture_output=True, check=True).stdout
        assert hashlib.sha256(blob).hexdigest() == entry["sha256"] == hashlib.sha256(
            (ROOT / rel).read_bytes()).hexdigest(), rel


def _repository(tmp_path, plan_bytes, *extra):
    """A git repository whose second commit adds plan.json alone (and ``extra`` files), committed at a fixed time;
    returns (plan path, registrations path, the record that git supports)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    when = "2026-12-01T10:00:00+00:00"
    env = dict(GIT_AUTHOR_DATE=when, GIT_COMMITTER_DATE=when, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    _git("init", "-q", cwd=repo)
    (repo / "README").write_text("x")
    _git("add", "README", cwd=repo)
    _git("commit", "-q", "-m", "first", cwd=repo, **env)
    plan = repo / "plan.json"
    plan.write_bytes(plan_bytes)
    for name in extra:
        (repo / name).write_text("y")
    _git("add", "plan.json", *extra, cwd=repo)
    _git("commit", "-q", "-m", "plan", cwd=repo, **env)
    record = {"sha256": hashlib.sha256(plan_bytes).hexdigest(), "commit": _git("rev-parse", "HEAD", cwd=repo),
              "committed": when}
    return plan, tmp_path / "registrations.json", record


def _register(registry, record):
    registry.write_text(json.dumps({"plans": {"plan.json": record}}))


def test_the_registration_is_checked_against_git_where_a_repository_holds_the_plan(tmp_path):
    """A record git supports loads; a plan edited together with its recorded sha256, a commit git does not have,
    another committer time or a commit with more files is refused; outside a repository the record is trusted."""
    raw = PLAN_V2_PATH.read_bytes()
    plan, registry, record = _repository(tmp_path, raw)
    _register(registry, record)
    assert load_plan(plan, registry).version == 2  # supported (v2: no decision code), judges none (unsuperseded)
    assert load_plan(plan, registry).registration.commit == record["commit"]
    edited = raw.replace(b'"alpha": 0.05', b'"alpha": 0.049')
    plan.write_bytes(edited)
    _register(registry, {**record, "sha256": hashlib.sha256(edited).hexdigest()})
    with pytest.raises(PlanError, match="another sha256"):
        load_plan(plan, registry)
    assert load_plan(plan, registry, check_git=False).alpha == 0.049  # what is trusted without git
    plan.write_bytes(raw)
    for change, match in [({"commit": "0" * 40}, "is not in the repository"),
                          ({"committed": "2026-12-01T10:00:01+00:00"}, "committer time"),
                          ({"committed": "2026-12-01T11:00:00+01:00"}, None)]:  # the same time, another offset
        _register(registry, {**record, **change})
        if match is None:
            assert load_plan(plan, registry).registration is not None
        else:
            with pytest.raises(PlanError, match=match):
                load_plan(plan, registry)
    crowded = tmp_path / "other"
    crowded.mkdir()
    plan, registry, record = _repository(crowded, raw, "notes.txt")
    _register(registry, record)
    with pytest.raises(PlanError, match="not \\['plan.json'\\] alone"):
        load_plan(plan, registry)
    untracked = plan.parent / "untracked.json"  # in a repository, but not its file (an installed copy, say)
    untracked.write_bytes(raw)
    registry.write_text(json.dumps({"plans": {"untracked.json": {**record, "commit": "2" * 40}}}))
    assert load_plan(untracked, registry).registration.checked.startswith("the plan is not tracked")
    outside = tmp_path / "copy.json"
    outside.write_bytes(raw)
    registry.write_text(json.dumps({"plans": {"copy.json": {**record, "commit": "1" * 40}}}))
    trusted = load_plan(outside, registry).registration
    assert trusted.commit == "1" * 40 and trusted.checked.startswith("no git repository")  # the record is trusted


# ----------------------------------------------------------------------------- malformed plans and records
def _malformed(tmp_path, content, name="p.json"):
    path = tmp_path / name
    path.write_text(content) if isinstance(content, str) else path.write_text(json.dumps(content))
    return path


V3 = json.loads(PLAN_V3_PATH.read_text())


#: what a caller that trains the plan passes (the book floor does not know the engine's settings).
CONFIG_FIELDS = [f.name for f in dataclasses.fields(TrainConfig)]


@pytest.mark.parametrize("content, match", [
    ("[1, 2]", "must be a JSON object; got list"),
    ("{", "not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
    ({**V3, "alpha": "0.05"}, "'alpha' must be a number in \\(0, 1\\)"),
    ({**V3, "alpha": True}, "'alpha' must be"),
    ({**V3, "claims": {"C1": 1}}, "'claims' must be a list"),
    ({**V3, "claims": ["C1"]}, "claim 1 must be a JSON object"),
    ({**V3, "claims": [{k: v for k, v in V3["claims"][0].items() if k != "source"}]}, "claim 1 has no 'source'"),
    ({**V3, "claims": [{**V3["claims"][0], "b": "texp"}]}, "compares arm 'texp' with itself"),
    ({**V3, "claims": [V3["claims"][0], V3["claims"][0]]}, "claim ids must be distinct"),
    ({**V3, "claims": [{**V3["claims"][0], "hypothesis": "none"}]}, "hypothesis must be one of"),
    ({**V3, "claims": [{**V3["claims"][3]}]}, "at least one primary claim"),
    ({**V3, "config": {**V3["config"], "learning_rate": 0.1}}, "config keys \\['learning_rate'\\] are not"),
    ({**V3, "config": {**V3["config"], "seed": 3}}, "config keys \\['seed'\\]"),
    ({**V3, "arms": []}, "'arms' must be a JSON object"),
    ({**V3, "arms": {"step": "step"}}, "arm 'step' must be a JSON object"),
    ({**V3, "seeds": "100"}, "'seeds' must be a list"),
    ({**V3, "seeds": [100, 100]}, "seeds must be at least"),
    ({**V3, "power": None}, "'power' must be a JSON object"),
    ({**V3, "version": 5}, "'version' must be 1, 2, 3 or 4"),
    ({**V3, "test": "welch"}, "implements test 'paired'"),
    ({k: v for k, v in V3.items() if k != "missing_runs"}, "has no 'missing_runs'"),
    ({**V3, "power": {**V3["power"], "sd": "0.4"}}, "the plan's power's 'sd' must be a number"),
    ({**V3, "power": {**V3["power"], "means": {"step": None}}}, "'means' must be an object of numbers"),
    ({**V3, "power": {k: v for k, v in V3["power"].items() if k != "table"}}, "the plan's power has no 'table'"),
])
def test_a_malformed_plan_is_one_plan_error_naming_the_file(tmp_path, content, match):
    path = _malformed(tmp_path, content)
    with pytest.raises(PlanError, match=match) as err:
        load_plan(path, registrations=tmp_path / "none.json", config_fields=CONFIG_FIELDS)
    assert str(path) in str(err.value) and isinstance(err.value, ValueError) and "\n" not in str(err.value)


def test_a_missing_or_unreadable_plan_is_one_plan_error_naming_the_file(tmp_path):
    for path in (tmp_path / "absent.json", tmp_path):
        with pytest.raises(PlanError, match="cannot read the analysis plan") as err:
            load_plan(path)
        assert str(path) in str(err.value)


@pytest.mark.parametrize("record, match", [
    ("[]", "the record must be a JSON object"),
    ("{]", "not valid JSON"),
    ({"plans": []}, "'plans' must be a JSON object"),
    ({"plans": {PLAN_V3_PATH.name: "abc"}}, "must be a JSON object; got str"),
    ({"plans": {PLAN_V3_PATH.name: {"commit": None}}}, "has no 'sha256'"),
    ({"plans": {PLAN_V3_PATH.name: {"sha256": 5, "commit": None}}}, "'sha256' must be a string"),
    ({"plans": {PLAN_V3_PATH.name: {"sha256": "x", "commit": 12}}}, "'commit' must be null or a 40-digit"),
    ({"plans": {PLAN_V3_PATH.name: {**json.loads(REGISTRATIONS_PATH.read_text())["plans"][PLAN_V3_PATH.name],
                                    "committed": "2026-12-02 06:12"}}}, "'committed' must be an ISO time with"),
])
def test_a_malformed_registration_is_one_plan_error_naming_the_file(tmp_path, record, match):
    registry = _malformed(tmp_path, record, "registrations.json")
    with pytest.raises(PlanError, match=match) as err:
        load_plan(PLAN_V3_PATH, registrations=registry)
    assert str(registry) in str(err.value)
    good = json.loads(REGISTRATIONS_PATH.read_text())
    good["plans"][PLAN_V3_PATH.name]["decision_code"] = {"file": "verdicts.py"}
    registry.write_text(json.dumps(good))
    with pytest.raises(PlanError, match="decision_code has no 'sha256'"):
        load_plan(PLAN_V3_PATH, registrations=registry)
