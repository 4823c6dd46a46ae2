"""Benchmarks of sparkiq's embedded mode.

Each module is runnable on its own (``python -m bench.lookup [--quick | --smoke]``) and has a
``main()`` that prints a short table and returns its figures as a dict;
``python -m bench.run_all`` (``make bench``) runs them all and rewrites
``docs/benchmarks.md``. Timings are never asserted: the machines these run on are shared and
noisy, so every benchmark reports medians and ratios against a baseline measured in the same
run.
"""
