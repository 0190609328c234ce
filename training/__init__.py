"""Trains per-view evidential heads on the DBF benchmark datasets and evaluates their fused opinions.

:mod:`training.data` loads, fetches, splits, scales and perturbs the multi-view benchmark data. The package
imports :mod:`fusion`, never :mod:`service`: serving must not depend on training code.
"""
