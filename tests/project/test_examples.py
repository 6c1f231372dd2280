"""Every public scheduler and schedule builder carries an ``Example:`` that runs as written: each is run here as a
doctest in an empty namespace (the example imports what it uses) and must print exactly what it shows."""
import doctest
import importlib
import inspect

import pytest

#: the modules whose public names (their ``__all__``) each need an example, if callable
MODULES = ["explr.schedules", "explr.lr_scheduler"]
FLAGS = doctest.NORMALIZE_WHITESPACE
#: the widest code line that the API page shows without scrolling sideways (its column at 1280 px)
WIDTH = 88


def public_callables():
    for name in MODULES:
        module = importlib.import_module(name)
        for public in module.__all__:
            obj = getattr(module, public)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                yield f"{name}.{public}", obj


def run(obj, name: str) -> tuple[doctest.TestResults, str]:
    """Run ``obj``'s own docstring examples (not its methods') in an empty namespace; (results, report)."""
    test = doctest.DocTestParser().get_doctest(inspect.getdoc(obj) or "", {}, name, None, 0)
    out: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test, out=out.append)
    return doctest.TestResults(runner.failures, runner.tries), "".join(out)


@pytest.mark.parametrize("name, obj", list(public_callables()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_public_builder_has_an_example_that_runs_as_written(name, obj, one_thread):
    doc = inspect.getdoc(obj) or ""
    assert "Example:" in doc, f"{name}'s docstring has no Example: block"
    results, report = run(obj, name)
    assert results.attempted >= 2, f"{name}'s Example: has {results.attempted} statement(s)"
    assert results.failed == 0, report
    wide = [line for line in doc[doc.index("Example:"):].splitlines()
            if line.startswith((">>>", "...")) and len(line) > WIDTH]
    assert not wide, f"{name}'s Example: has code lines wider than the API page's column ({WIDTH}): {wide}"


def test_a_wrong_or_incomplete_example_fails():
    """Deliberately wrong examples: a wrong output, and an example relying on a name it does not import."""
    def wrong_output():
        """Example:

        >>> from explr.schedules import cosine
        >>> print(f"{cosine(0.1, 2, 1)[1]:.2f}")
        0.06
        """

    def no_import():
        """Example:

        >>> step_decay(0.1, 2, 1)[0]
        0.1
        """
    for example in (wrong_output, no_import):
        results, report = run(example, example.__name__)
        assert results == (1, 2 if example is wrong_output else 1), report
    assert "Expected:\n    0.06\nGot:\n    0.05" in run(wrong_output, "wrong_output")[1]
    assert "NameError: name 'step_decay' is not defined" in run(no_import, "no_import")[1]

