"""The book's simulations and analyses: the toy model (chapter 4), flows and sharpness (chapter 5), fits of recorded
series, the exact-twin test and chapter 6's registered analysis, the digits, the figure style and a chapter's checks.
Nothing in the maths floor or in :mod:`explr.cifar10` imports from here.
"""
