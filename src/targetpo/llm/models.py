"""Tiny offline language models: a character-level tokenizer and a small random Qwen2/Llama causal LM.

Everything is built locally (nothing is downloaded), so tests, CI and the CPU demo can exercise the real Hugging
Face code paths (generation, TRL, PEFT) in seconds. `save_tiny_model(dir)` writes a directory that
`AutoModelForCausalLM.from_pretrained(dir)` / `AutoTokenizer.from_pretrained(dir)` load offline.
"""

from __future__ import annotations

import json
import re
import string
from pathlib import Path

from targetpo.runs.data import MissingDataError

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
# Printable ASCII minus vertical tab / form feed: enough for arithmetic, GSM8K, JSON answers and <answer> tags.
CHARS = "".join(dict.fromkeys(c for c in string.printable if c not in "\x0b\x0c"))

# <|role|>content<eos> per message; the generation prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>' + message['content'] + '<eos>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_char_tokenizer(chars: str = CHARS):
    """A `PreTrainedTokenizerFast` with one token per character (WordLevel over single characters).

    Special tokens: <pad> (id 0), <eos> (id 1), <unk> (id 2) and the chat role markers. Decoding fuses the
    characters back without separators, so `decode(encode(s)) == s` for any string over `chars`.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = [PAD, EOS, UNK, *ROLE_TOKENS]
    vocab = {t: i for i, t in enumerate(special + [c for c in dict.fromkeys(chars) if c not in special])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # every character its own token
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                  additional_special_tokens=list(ROLE_TOKENS), padding_side="left",
                                  clean_up_tokenization_spaces=False)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_model(tokenizer, *, arch: str = "qwen2", hidden_size: int = 64, num_layers: int = 2,
                     num_heads: int = 4, num_kv_heads: int = 2, intermediate_size: int = 128,
                     max_positions: int = 512, seed: int = 0):
    """A randomly initialised causal LM sized for a CPU (~0.1M parameters at the defaults).

    arch: "qwen2" (Qwen2ForCausalLM, the family of the paper's Qwen3 runs) or "llama" (LlamaForCausalLM).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}) and num_heads "
                         f"by num_kv_heads ({num_kv_heads})")
    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}
    if arch not in classes:
        raise ValueError(f"arch must be one of {sorted(classes)}, got {arch!r}")
    cfg_cls, model_cls = classes[arch]
    config = cfg_cls(vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
                     num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                     intermediate_size=intermediate_size, max_position_embeddings=max_positions,
                     pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                     bos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_tiny_model(directory: str | Path, **model_kwargs) -> Path:
    """Build the tokenizer and a tiny model and save both to `directory` (loadable offline with from_pretrained)."""
    directory = Path(directory)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, **model_kwargs)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def load_tiny_tokenizer(directory: str | Path):
    """Load the character tokenizer saved by :func:`save_tiny_model`.

    Use this (or pass the tokenizer object on) rather than `AutoTokenizer`: for a directory whose config says
    `model_type: qwen2`, `AutoTokenizer` builds a `Qwen2Tokenizer`, whose byte-level pre-tokenizer drops the
    spaces and newlines our one-token-per-character vocabulary relies on.
    """
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(directory))


def load_tiny_model(directory: str | Path):
    """(model, tokenizer) from a directory written by :func:`save_tiny_model`; nothing is downloaded."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(directory)), load_tiny_tokenizer(directory)


# ----------------------------------------------------------------------------- loading any model directory

def load_tokenizer(directory: str | Path):
    """The tokenizer of a model directory. The offline character tokenizer (saved by `targetpo.llm.models`) is
    loaded as a plain fast tokenizer: `AutoTokenizer` would rebuild it as the model family's tokenizer class."""
    from transformers import AutoTokenizer

    cfg_file = Path(directory) / "tokenizer_config.json"
    if cfg_file.is_file():
        cls = json.loads(cfg_file.read_text()).get("tokenizer_class")
        if cls in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            return load_tiny_tokenizer(directory)
    return AutoTokenizer.from_pretrained(str(directory))


def check_model_dir(path: str | Path) -> Path:
    """`path` as a local Hugging Face model directory (with config.json), or a FileNotFoundError that says what is
    wrong. targetpo never downloads a model implicitly: a hub name must be fetched first, by the user."""
    if not str(path).strip():  # Path("") is the working directory: say what is missing, not that "." is no model
        raise FileNotFoundError("model is empty: give a local Hugging Face model directory; targetpo never downloads "
                                "models implicitly (e.g. `hf download ORG/NAME --local-dir DIR`, then model=DIR)")
    p = Path(path).expanduser()
    # A hub id (org/name) is fetched by its id; a local path names where the download should go.
    hub_id = re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", str(path)) is not None and not p.exists()
    example = f"hf download {path} --local-dir DIR" if hub_id else f"hf download ORG/NAME --local-dir {path}"
    fetch = f"targetpo never downloads models implicitly: fetch it first (e.g. `{example}`) and pass the directory"
    if not p.exists():  # missing like a data set (reproduce reports the experiment as not run, and goes on)
        raise MissingDataError(f"model {str(path)!r}: no such directory; {fetch}")
    if not p.is_dir() or not (p / "config.json").is_file():
        raise FileNotFoundError(f"model {str(path)!r} is not a Hugging Face model directory (it has no config.json); "
                                f"{fetch}")
    return p


def load_model(path: str | Path, dtype: str = "float32"):
    """(model, tokenizer) from a local model directory (see :func:`check_model_dir`), loaded offline."""
    import torch
    from transformers import AutoModelForCausalLM

    path = check_model_dir(path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype), local_files_only=True)
    tok = load_tokenizer(path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # generation pads finished rows; masks keep padding out of every loss
    return model, tok
