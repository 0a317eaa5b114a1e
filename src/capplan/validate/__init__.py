"""Validation against real vLLM: suites of experiments, the GPU runner, stored measurements,
and the comparison with the simulator's predictions."""
