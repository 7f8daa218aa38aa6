"""LLM RLVR: train Hugging Face causal LMs with TPO (or any objective of `targetpo.objectives`) on verifiable
rewards. Needs the `llm` extra (`pip install 'targetpo[llm]'`)."""
