"""Real serving engines as targets: :mod:`kvhit.engines.vllm` and
:mod:`kvhit.engines.sglang`, each driven through the engine's own code."""
