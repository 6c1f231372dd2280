"""The book's simulations and analyses: what the chapters compute on top of the paper's maths.

* :mod:`explr.book.toy` -- the BN + WD counterexample of Section 3, vectorised over seeds (chapter 4);
* :mod:`explr.book.flow` -- gradient flow and modified flows with counter terms (chapter 5);
* :mod:`explr.book.sharpness` -- the Hessian's top eigenvalue, by Lanczos and by power iteration (chapter 5);
* :mod:`explr.book.fits` -- fits and levels of recorded time series (log-log slopes, returning levels;
  chapters 4, 5);
* :mod:`explr.book.registration` -- chapter 6's analysis plans (``analysis_plan_v4.json`` judges; v1-v3
  are kept) and their registration, checked against git;
* :mod:`explr.book.judging` -- chapter 6's path from run folders to verdicts: the runs a plan judges, failed
  and missing runs, the decisions; hashed by v4's registration with registration and verdicts;
* :mod:`explr.book.stats` -- chapter 6's power analysis, the pilot's spread and the grid's cost;
* :mod:`explr.book.verdicts` -- the decision rule of plans v3 and v4 (paired one-sided superiority, TOST,
  Holm), hashed by their registrations;
* :mod:`explr.book.digits` -- scikit-learn's 8×8 digits, the small real dataset of chapters 1-3 and 5;
* :mod:`explr.book.plotting` -- the book's figure style (vector figures, one colour per schedule);
* :mod:`explr.book.checks` -- a chapter's asserted claims, one line each, and the round-off rule of what
  they show;
* :mod:`explr.book.twins` -- the exact-twin test on a real network (chapter 6): TEXP and the cosine hybrid
  against their weight-decay originals, logit for logit, within a float64 round-off estimate.

Nothing in :mod:`explr`'s maths floor or in :mod:`explr.cifar10` imports from here.
"""
