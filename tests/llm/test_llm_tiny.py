"""The tiny offline model and character tokenizer: lossless round trips, saved and reloaded without a hub."""

import pytest
import torch

pytestmark = pytest.mark.llm
pytest.importorskip("transformers", reason="needs the llm extra: pip install -e '.[llm]'")

from targetpo.llm.models import CHARS, build_char_tokenizer, build_tiny_model, load_tiny_model, save_tiny_model


def test_character_tokenizer_round_trips_every_printable_character():
    tok = build_char_tokenizer()
    text = CHARS + " <answer>42</answer>\n"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1


def test_chat_template_and_special_tokens_are_single_tokens():
    tok = build_char_tokenizer()
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.convert_ids_to_tokens(ids) == ["<|user|>", "h", "i", "<eos>", "<|assistant|>"]


def test_saved_model_reloads_offline_with_identical_logits(tmp_path):
    path = save_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                           intermediate_size=64)
    model, tok = load_tiny_model(path)
    ref = build_tiny_model(build_char_tokenizer(), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                           intermediate_size=64)
    ids = torch.tensor([tok("1+2=3")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref(ids).logits)  # same seed -> same weights
    assert tok.decode(tok("a b\nc")["input_ids"]) == "a b\nc"
