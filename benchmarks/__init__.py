"""propop's benchmarks: ratios against a baseline measured in the same run.

Run one as ``python -m benchmarks.<name>``; results land in ``benchmarks/results``.
"""
