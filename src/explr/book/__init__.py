"""The book's simulations and analyses: what the chapters compute on top of the paper's maths.

:mod:`~explr.book.toy` (Sec. 3's BN + WD counterexample, chapter 4), :mod:`~explr.book.flow` (gradient flow and
modified flows, chapter 5), :mod:`~explr.book.sharpness` (the Hessian's top eigenvalue, chapter 5),
:mod:`~explr.book.fits` (slopes and levels of recorded series), :mod:`~explr.book.twins` (the exact-twin test on
a real network, chapter 6), chapter 6's registered analysis (:mod:`~explr.book.registration`: the plans, v4
judges; :mod:`~explr.book.judging`: run folders to verdicts; :mod:`~explr.book.verdicts`: the decision rule;
:mod:`~explr.book.stats`: power and cost), :mod:`~explr.book.digits` (scikit-learn's 8×8 digits),
:mod:`~explr.book.plotting` (the figure style) and :mod:`~explr.book.checks` (a chapter's asserted claims and the
round-off rule of what they show).  Nothing in the maths floor or in :mod:`explr.cifar10` imports from here.
"""
