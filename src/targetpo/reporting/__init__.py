"""Run storage (append-only JSONL + run.json) and reports (tables vs the paper, PNG plots, claim checks)."""
