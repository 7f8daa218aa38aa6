import pytest


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    """No LLM test may reach the Hugging Face hub: every model here is built locally."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def arithmetic_parts():
    """A factory: (tokenizer, task, train pool, held-out set) for reasoning-gym addition with the given term and
    digit counts, on the offline character tokenizer."""
    def make(*, max_terms: int, min_digits: int, max_digits: int, train: int = 40, heldout: int):
        from targetpo.llm.data import load_task, parse_options, train_and_heldout
        from targetpo.llm.models import build_char_tokenizer

        task = load_task("basic_arithmetic", compact=True, options=parse_options(
            ["operators=+", "min_terms=2", f"max_terms={max_terms}", f"min_digits={min_digits}",
             f"max_digits={max_digits}", "allow_parentheses=false", "allow_negation=false"]))
        return (build_char_tokenizer(), task, *train_and_heldout(task, train, heldout, seed=0))

    return make


@pytest.fixture(scope="session")
def tiny_trainer():
    """A factory: an RLVRTrainer on a tiny character Qwen2 (hidden 32, 2 heads, 1 KV head, MLP 64) over `parts`
    (from arithmetic_parts), with TrainerConfig fields `kw` over k = 4, lr = 1e-2."""
    def make(parts, *, num_layers: int, seed: int, **kw):
        from targetpo.llm.models import build_tiny_model
        from targetpo.llm.templates import Template
        from targetpo.llm.trainer import RLVRTrainer, TrainerConfig

        tok, task, train, held = parts
        model = build_tiny_model(tok, hidden_size=32, num_layers=num_layers, num_heads=2, num_kv_heads=1,
                                 intermediate_size=64, seed=seed)
        return RLVRTrainer(model, tok, task, Template("plain"), train, held,
                           TrainerConfig(**{"k": 4, "lr": 1e-2, **kw}))

    return make
