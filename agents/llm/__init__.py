"""LLM proposers through any OpenAI-compatible endpoint.

`config` (where the model is, what it may cost), `client` (retries, concurrency, budget), `prompts`
(per implementation space), `parse` (strict parsing of what a model returns), `sandbox` (where
generated Python runs), `proposer` (multi-turn refinement and the optimizer's proposer interface), `kernel`
(kernel-level answers for the ir and asm spaces, judged by the compiled-kernel search), `setup` (what `--llm`
adds to a run, on one client).
"""
