"""Peak memory of per-token log-probs + backward on a Qwen3-shaped model with the real 151,936-token vocabulary.

Four paths on the same randomly initialised model (no weights are downloaded) and the same batch:

- ``chunked``: :func:`targetpo.llm.rollout.token_logprobs` (the LM head in chunks of ``--chunk`` tokens,
  recomputed in backward; the full-vocabulary logits never exist);
- ``full``: the same function with ``chunk_tokens=0`` (the model's own [N, C, V] logits, upcast to fp32);
- ``fallback``: the path of a model whose head cannot be split off (soft-capped logits; here the config's
  ``final_logit_softcapping``, which Qwen3 ignores, only routes it there): the model's own logits, their fp32
  log-softmax ``--chunk`` tokens at a time;
- ``selective``: the model's logits, sliced to the completion, divided by the temperature, then
  ``trl.trainer.utils.selective_log_softmax``: the log-probs of TRL's GRPOTrainer before its fused LM head (TRL
  1.16 computes them through ``add_fused_lm_head``, a chunked head of its own, which this does not measure).

Each path runs in a fresh process, which builds the model, resets the kernel's peak-RSS counter
(``/proc/self/clear_refs``) and measures the peak resident memory of one forward + backward above the memory it
held before (the model, its weights and the batch). CPU, float32 by default.

    python benchmarks/llm_memory.py                        # 2 layers, 4 x 1024 completion tokens
    python benchmarks/llm_memory.py --write BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _args import Parser, comma_choices, positive_int  # noqa: E402  (benchmarks/ is on sys.path as a script)

PATHS = ("chunked", "full", "fallback", "selective")
HEADING = "## LLM log-probs: peak memory of log-probs + backward"


def rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def build_model(args):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                      num_hidden_layers=args.layers, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                      max_position_embeddings=args.prompt + args.completion + 8, tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg).to(getattr(torch, args.dtype))


def one_path(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    model = build_model(args)
    g = torch.Generator().manual_seed(1)
    n, p, c = args.rows, args.prompt, args.completion
    prompt_ids = torch.randint(0, args.vocab, (n, p), generator=g)
    completion_ids = torch.randint(0, args.vocab, (n, c), generator=g)
    prompt_mask = torch.ones(n, p, dtype=torch.bool)
    completion_mask = torch.ones(n, c, dtype=torch.bool)
    temperature = 0.9

    Path("/proc/self/clear_refs").write_text("5")  # reset the peak-RSS counter to the current RSS
    before = rss_kb("VmRSS")
    t0 = time.perf_counter()
    if args.path == "selective":
        from trl.trainer.utils import selective_log_softmax

        from targetpo.llm.rollout import position_ids

        ids = torch.cat([prompt_ids, completion_ids], 1)
        mask = torch.cat([prompt_mask, completion_mask], 1)
        logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=position_ids(mask),
                       use_cache=False).logits
        logits = logits[:, p - 1:-1, :] / temperature
        logp = selective_log_softmax(logits, completion_ids)
    else:
        from targetpo.llm.rollout import token_logprobs

        chunk = 0 if args.path == "full" else args.chunk
        if args.path == "fallback":
            model.config.final_logit_softcapping = 30.0
        logp = token_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature,
                              chunk_tokens=chunk)
    logp.float().mean().backward()
    seconds = time.perf_counter() - t0
    peak = rss_kb("VmHWM")
    return {"path": args.path, "peak_above_gb": (peak - before) / 2**20, "model_gb": before / 2**20,
            "seconds": seconds, "logp_sum": float(logp.detach().float().sum())}


ESTIMATE_HEADING = "## LLM own loop: the paper preset's GPU memory, estimated"


def estimate_paper_preset(args) -> list[tuple[str, float, str]]:
    """(item, GB, how) for `targetpo rlvr --preset paper` on Qwen3-1.7B: an arithmetic estimate from the model's
    shapes and the preset's settings, not a measurement (no GPU here)."""
    from targetpo.llm import experiment as rlvr

    cfg = rlvr.PRESETS["paper"]
    layers, hidden, ffn, vocab, kv_heads, head_dim, heads = 28, 2048, 6144, 151936, 8, 128, 16
    gb = 1 / 2**30
    attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
    per_layer = attn + 3 * hidden * ffn
    params = layers * per_layer + vocab * hidden  # tied embeddings; norms are negligible
    # LoRA on every linear layer: r·(fan_in + fan_out) per matrix
    lora = layers * cfg.lora_r * ((hidden + heads * head_dim) * 2 + 2 * (hidden + kv_heads * head_dim)
                                  + 2 * (hidden + ffn) + (ffn + hidden))
    rows, prompt, completion = cfg.batch_prompts * cfg.k, args.paper_prompt, cfg.max_new_tokens
    kv_per_token = 2 * layers * kv_heads * head_dim * 2  # K and V, bf16
    t_mb = cfg.micro_batch_tokens
    from targetpo.llm.logprobs import DEFAULT_CHUNK_TOKENS, VOCAB_SLICE

    chunk = DEFAULT_CHUNK_TOKENS
    items = [
        ("weights (bf16)", params * 2 * gb, f"{params / 1e9:.2f}B parameters × 2 B"),
        ("LoRA adapter: weights, grads, AdamW m and v (fp32)", lora * 16 * gb, f"{lora / 1e6:.1f}M parameters × 16 B"),
        ("generation: KV cache", rows * (prompt + completion) * kv_per_token * gb,
         f"{rows} sequences × ({prompt} + {completion}) tokens × {kv_per_token // 1024} KiB"),
        ("update: checkpointed layer inputs", layers * t_mb * hidden * 2 * gb,
         f"{layers} layers × {t_mb} tokens × {hidden} × 2 B (micro_batch_tokens={t_mb})"),
        ("update: one layer recomputed (attention via SDPA, MLP)", t_mb * (4 * hidden + 4 * ffn) * 2 * gb,
         f"{t_mb} tokens × (4·{hidden} + 4·{ffn}) × 2 B"),
        ("update: chunked LM head", (chunk * vocab + VOCAB_SLICE * hidden) * 4 * gb,
         f"one [{chunk}, {vocab}] fp32 logits buffer + one [{VOCAB_SLICE}, {hidden}] fp32 slice of the bf16 head"),
    ]
    return items


def main() -> None:
    ap = Parser(description=__doc__)
    ap.add_argument("--layers", type=positive_int, default=2, help="decoder layers (Qwen3-1.7B has 28; the head's "
                    "cost does not depend on it)")
    ap.add_argument("--hidden", type=positive_int, default=2048, help="hidden size (Qwen3-1.7B: 2048)")
    ap.add_argument("--ffn", type=positive_int, default=6144, help="MLP size (Qwen3-1.7B: 6144)")
    ap.add_argument("--vocab", type=positive_int, default=151936, help="vocabulary (Qwen3: 151,936)")
    ap.add_argument("--rows", type=positive_int, default=4, help="sequences in the batch")
    ap.add_argument("--prompt", type=positive_int, default=64, help="prompt tokens per sequence")
    ap.add_argument("--completion", type=positive_int, default=1024, help="completion tokens per sequence")
    ap.add_argument("--chunk", type=positive_int, default=512, help="tokens per LM-head chunk of the chunked path "
                    "(the library's default, DEFAULT_CHUNK_TOKENS)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="model dtype")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    ap.add_argument("--paths", default=",".join(PATHS), type=comma_choices(PATHS),
                    help=f"which paths to measure, comma-separated (default {','.join(PATHS)})")
    ap.add_argument("--estimate", action="store_true", help="print (and with --write record) the paper preset's "
                    "estimated GPU memory instead of measuring")
    ap.add_argument("--paper-prompt", type=positive_int, default=256, help="prompt tokens assumed for the estimate")
    ap.add_argument("--path", default=None, choices=PATHS, help=argparse.SUPPRESS)  # one path, in a child process
    ap.add_argument("--write", default=None, help="write the result table into this markdown file")
    args = ap.parse_args()
    if args.path:
        print(json.dumps(one_path(args)))
        return
    if args.estimate:
        items = estimate_paper_preset(args)
        fixed = items[0][1] + items[1][1]
        gen, upd = fixed + items[2][1], fixed + sum(x[1] for x in items[3:])
        rows = "\n".join(f"| {name} | {v:.2f} | {how} |" for name, v, how in items)
        text = (f"{ESTIMATE_HEADING}\n\nAn estimate, not a measurement (no GPU was available): `targetpo rlvr --preset "
                f"paper` (Qwen3-1.7B, bf16, LoRA r = 32, 16 prompts × K = 16, 1,024 new tokens, gradient "
                f"checkpointing, micro-batches of 32,768 padded tokens, chunked log-probs), from the model's shapes. "
                f"Command: `python benchmarks/llm_memory.py --estimate`.\n\n| item | GB | how |\n|---|---|---|\n"
                f"{rows}\n\nPeak of the generation phase ≈ {gen:.1f} GB, of the update phase ≈ {upd:.1f} GB (the KV "
                f"cache is freed before the update): both well inside one 80 GB GPU. Not counted: the CUDA context "
                f"and allocator fragmentation (typically 1–3 GB), and `generate`'s per-step logits ([256, V] fp32, "
                f"0.15 GB).\n")
        print(text)
        if args.write:
            from _markdown import replace_section

            replace_section(args.write, ESTIMATE_HEADING, text)
        return

    results = {}
    # The child process gets the model and batch options (everything but what only the parent uses).
    shape = {k: v for k, v in vars(args).items() if k not in ("write", "path", "paths", "estimate", "paper_prompt")}
    child = [f"--{k.replace('_', '-')}={v}" for k, v in shape.items()]
    for path in args.paths.split(","):
        out = subprocess.run([sys.executable, __file__, *child, "--path", path], check=True,
                             capture_output=True, text=True).stdout
        results[path] = json.loads(out.strip().splitlines()[-1])
        r = results[path]
        print(f"{path:<8} peak above baseline {r['peak_above_gb']:.2f} GB  ({r['seconds']:.1f} s; "
              f"model + batch {r['model_gb']:.2f} GB; sum log-p {r['logp_sum']:.3f})", flush=True)
    if "selective" in results and "chunked" in results:
        ratio = results["chunked"]["peak_above_gb"] / results["selective"]["peak_above_gb"]
        print(f"chunked / selective = {ratio:.2f}x")
    if args.write:
        from _markdown import replace_section

        cmd = "python benchmarks/llm_memory.py " + " ".join(child)
        rows = "\n".join(f"| `{p}` | {r['peak_above_gb']:.2f} | {r['seconds']:.1f} |" for p, r in results.items())
        sel = results.get("selective", {}).get("peak_above_gb")
        ratios = "\n".join(f"- `{p}` / `selective`: {r['peak_above_gb'] / sel:.2f}×" for p, r in results.items()
                           if sel and p != "selective")
        section = (f"{HEADING}\n\nQwen3-shaped model ({args.layers} layers, hidden {args.hidden}, vocabulary "
                   f"{args.vocab:,}, tied embeddings, {args.dtype}, random weights), {args.rows} sequences × "
                   f"({args.prompt} prompt + {args.completion} completion) tokens, one forward + backward of the "
                   f"completion tokens' log-probs, CPU, each path in a fresh process; peak resident memory above "
                   f"what the process held before (model + batch). Command: `{cmd.strip()}`.\n\n"
                   f"| path | peak above baseline (GB) | seconds |\n|---|---|---|\n{rows}\n\n{ratios}\n\n"
                   "`chunked` is targetpo's log-probs (`token_logprobs`), `full` the same with `chunk_tokens=0` (the "
                   "model's own logits), `fallback` the path of a head that cannot be split off (soft-capped logits: "
                   "the model's own logits, their fp32 log-softmax a chunk at a time), `selective` the full logits + "
                   "TRL's `selective_log_softmax`, the log-probs "
                   "of TRL's GRPOTrainer before its fused LM head (TRL 1.16 runs a chunked head of its own, not "
                   "measured here).\n")
        replace_section(args.write, HEADING, section)


if __name__ == "__main__":
    main()
