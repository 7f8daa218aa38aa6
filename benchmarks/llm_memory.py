"""Peak memory of per-token log-probs + backward on a Qwen3-shaped model with the real 151,936-token vocabulary.

Three paths on the same randomly initialised model (no weights are downloaded) and the same batch:

- ``chunked``: :func:`targetpo.llm.rollout.token_logprobs` (the LM head in chunks of ``--chunk`` tokens,
  recomputed in backward; the full-vocabulary logits never exist);
- ``full``: the same function with ``chunk_tokens=0`` (the model's own [N, C, V] logits, upcast to fp32);
- ``trl``: TRL's GRPOTrainer path: the model's logits, sliced to the completion, divided by the temperature, then
  ``trl.trainer.utils.selective_log_softmax``.

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
    if args.path == "trl":
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

        chunk = args.chunk if args.path == "chunked" else 0
        logp = token_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature,
                              chunk_tokens=chunk)
    logp.float().mean().backward()
    seconds = time.perf_counter() - t0
    peak = rss_kb("VmHWM")
    return {"path": args.path, "peak_above_gb": (peak - before) / 2**20, "model_gb": before / 2**20,
            "seconds": seconds, "logp_sum": float(logp.detach().float().sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (Qwen3-1.7B has 28; the head's cost "
                    "does not depend on it)")
    ap.add_argument("--hidden", type=int, default=2048, help="hidden size (Qwen3-1.7B: 2048)")
    ap.add_argument("--ffn", type=int, default=6144, help="MLP size (Qwen3-1.7B: 6144)")
    ap.add_argument("--vocab", type=int, default=151936, help="vocabulary (Qwen3: 151,936)")
    ap.add_argument("--rows", type=int, default=4, help="sequences in the batch")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens per sequence")
    ap.add_argument("--completion", type=int, default=1024, help="completion tokens per sequence")
    ap.add_argument("--chunk", type=int, default=1024, help="tokens per LM-head chunk of the chunked path")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="model dtype")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--paths", default="chunked,full,trl", help="which paths to measure, comma-separated")
    ap.add_argument("--path", default=None, help=argparse.SUPPRESS)  # one path, in a child process
    ap.add_argument("--write", default=None, help="write the result table into this markdown file")
    args = ap.parse_args()
    if args.path:
        print(json.dumps(one_path(args)))
        return

    results = {}
    passthrough = [a for a in sys.argv[1:] if not a.startswith("--write")]
    if "--write" in sys.argv:
        i = sys.argv.index("--write")
        passthrough = sys.argv[1:i] + sys.argv[i + 2:]
    for path in args.paths.split(","):
        out = subprocess.run([sys.executable, __file__, *passthrough, "--path", path], check=True,
                             capture_output=True, text=True).stdout
        results[path] = json.loads(out.strip().splitlines()[-1])
        r = results[path]
        print(f"{path:<8} peak above baseline {r['peak_above_gb']:.2f} GB  ({r['seconds']:.1f} s; "
              f"model + batch {r['model_gb']:.2f} GB; sum log-p {r['logp_sum']:.3f})", flush=True)
    if "trl" in results and "chunked" in results:
        ratio = results["chunked"]["peak_above_gb"] / results["trl"]["peak_above_gb"]
        print(f"chunked / trl = {ratio:.2f}x")
    if args.write:
        from _markdown import replace_section

        cmd = "python benchmarks/llm_memory.py " + " ".join(passthrough)
        rows = "\n".join(f"| `{p}` | {r['peak_above_gb']:.2f} | {r['seconds']:.1f} |" for p, r in results.items())
        trl = results.get("trl", {}).get("peak_above_gb")
        ratios = "\n".join(f"- `{p}` / `trl`: {r['peak_above_gb'] / trl:.2f}×" for p, r in results.items()
                           if trl and p != "trl")
        section = (f"{HEADING}\n\nQwen3-shaped model ({args.layers} layers, hidden {args.hidden}, vocabulary "
                   f"{args.vocab:,}, tied embeddings, {args.dtype}, random weights), {args.rows} sequences × "
                   f"({args.prompt} prompt + {args.completion} completion) tokens, one forward + backward of the "
                   f"completion tokens' log-probs, CPU, each path in a fresh process; peak resident memory above "
                   f"what the process held before (model + batch). Command: `{cmd.strip()}`.\n\n"
                   f"| path | peak above baseline (GB) | seconds |\n|---|---|---|\n{rows}\n\n{ratios}\n")
        replace_section(args.write, HEADING, section)


if __name__ == "__main__":
    main()
