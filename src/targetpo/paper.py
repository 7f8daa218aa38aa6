"""The paper's reported numbers, as labelled reference constants.

Source: Kaddour 2026, "Target Policy Optimization" (arXiv 2604.06159), and, where the paper gives only a
figure, runs of the authors' public code on a 2-core CPU (labelled `source="authors' code"`). These values are
only ever shown next to numbers measured by targetpo, never in their place. `None` means "not reached" / "−"
in the paper's tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reference:
    what: str
    source: str
    values: Any


# --- E1: tabular single-context bandit (paper §3.1, Fig. 2) -------------------------------------------
TABULAR_SINGLE_ERROR = Reference(
    "error 1 − π(y*) at steps 0/50/75/100/125/149, and first step below 1% / 0.1% (100 seeds)",
    "authors' code, full preset (the paper gives only Fig. 2)",
    {
        "steps": (0, 50, 75, 100, 125, 149),
        "pg": {"error": (0.99, 0.93, 0.567, 0.100, 0.0098, 0.0010), "below_1pct": 125, "below_0.1pct": None},
        "dg": {"error": (0.99, 0.519, 0.0816, 0.0072, 5.9e-4, 5.3e-5), "below_1pct": 97, "below_0.1pct": 120},
        "tpo": {"error": (0.99, 0.514, 0.0801, 0.0070, 5.7e-4, 5.2e-5), "below_1pct": 97, "below_0.1pct": 120},
        "grpo": {"error": (0.99, 0.479, 0.0753, 0.0119, 0.0047, 0.0027), "below_1pct": 104, "below_0.1pct": None},
    },
)
TABULAR_SINGLE_MISALIGNMENT = Reference(
    "misalignment 1 − cos(g, g*_PG) at steps 0/25/50/100/149",
    "authors' code, full preset",
    {
        "steps": (0, 25, 50, 100, 149),
        "pg": (0.79, 0.66, 0.21, 0.015, 0.015),
        "dg": (0.42, 0.016, 4.6e-4, 2.1e-4, 3.3e-3),
        "tpo": (0.49, 9e-4, 0.0, 0.0, 4e-4),
        "grpo": (0.34, 5.2e-3, 0.010, 0.40, 0.77),
    },
)

# --- E2: tabular multi-context bandit (paper §3.2, Fig. 3, App. B) -------------------------------------
TABULAR_MULTI_ERROR = Reference(
    "average error at steps 0/100/250/500/750/999, first step below 1% / 0.1% (100 seeds)",
    "authors' code, full preset (the paper gives Fig. 3 and the β values)",
    {
        "steps": (0, 100, 250, 500, 750, 999),
        "pg": {"error": (0.899, 0.758, 0.515, 0.209, 0.0553, 0.0061), "below_1pct": 956, "below_0.1pct": None},
        "dg": {"error": (0.899, 0.755, 0.493, 0.166, 0.0298, 0.0021), "below_1pct": 860, "below_0.1pct": None},
        "tpo": {"error": (0.899, 0.769, 0.472, 0.0755, 0.0056, 4.0e-4), "below_1pct": 696, "below_0.1pct": 914},
        "grpo": {"error": (0.899, 0.758, 0.482, 0.126, 0.0102, 5.3e-4), "below_1pct": 752, "below_0.1pct": 940},
        "ce": {"error": (0.899, 0.786, 0.484, 0.0638, 0.0047, 3.4e-4), "below_1pct": 679, "below_0.1pct": 897},
    },
)
TABULAR_MULTI_MISALIGNMENT = Reference(
    "misalignment to CE at steps 0/250/500/750/999",
    "authors' code, full preset",
    {
        "steps": (0, 250, 500, 750, 999),
        "pg": (0.26, 0.39, 0.44, 0.51, 0.056),
        "dg": (0.22, 0.30, 0.35, 0.30, 7e-5),
        "tpo": (0.051, 0.023, 0.005, 0.0, 0.0),
        "grpo": (0.11, 0.22, 0.33, 0.21, 3e-3),
    },
)
TABULAR_BETA_AT_0_1 = Reference("β(p) at p = 0.1, K = 10", "paper §3.2", {"tpo": 0.73, "dg": 0.09, "grpo": 0.33})

# --- E3: MNIST contextual bandit (paper §3.3, Fig. 4a) -------------------------------------------------
MNIST_FINAL_ERROR = Reference(
    "final test error after 10,000 steps (20 seeds)", "paper §3.3 (DG read from Fig. 4a)",
    {"tpo": 0.029, "pg": 0.053, "grpo": 0.059, "group_pg": 0.072, "dg": 0.031},
)
MNIST_STEPS_TO_5PCT = Reference(
    "first labelled eval step with error ≤ 5% (labels are i·200 for a point measured after (i+1)·200 updates)",
    "paper §3.3", {"tpo": 1600, "dg": 2200},
)
MNIST_MECHANISM_SURPLUS = Reference(
    "exact − scalar first-order gain, by wrong-class concentration bin, at label 2,000 (after 2,200 updates)",
    "paper Fig. 4b (read from the figure)",
    {"bins": ((0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.01)),
     "tpo": (0.000, 0.007, 0.021, 0.073), "dg": (0.000, -0.001, -0.003, -0.005)},
)
MNIST_STALENESS = Reference(
    "final MNIST test error (%) when actors use parameters D updates old", "talk slides (not in the paper)",
    {"delays": (0, 1, 3, 10, 30, 100, 300, 1000),
     "reinforce": (6.3, 6.3, 6.8, 6.5, 42.7, 67.3, 74.9, 78.1),
     "pg_is": (6.3, 6.3, 6.4, 6.8, 8.9, 10.2, 10.1, 9.8),
     "ppo": (6.3, 6.3, 7.0, 4.1, 5.6, 5.8, 5.9, 5.4),
     "dg": (2.8, 2.8, 2.8, 2.7, 2.6, 2.5, 2.5, 2.5),
     "tpo": (2.3, 2.3, 2.3, 2.3, 2.3, 2.3, 2.3, 2.3)},
)

# --- E4: dense token reversal, token-level groups, V sweep (paper §3.4, Table 1) ------------------------
TABLE1_STEPS_TO_1PCT = Reference(
    "episodes to 1% error, reverse copy, bag-of-tokens, H = 10 (20 seeds)", "paper Table 1",
    {"V": (2, 4, 8, 16), "tpo_token": (58, 74, 103, 102), "grpo_token": (904, 141, 124, 148),
     "dg": (199, 273, 314, 393), "ppo": (872, 181, 191, 259)},
)

# --- E5: eight variants (paper §3.5, Table 2) -----------------------------------------------------------
TABLE2_STEPS_TO_1PCT = Reference(
    "episodes to 1% error, H = 10, V = 2 (10 seeds); None = never within 1000", "paper Table 2",
    {("bag", "copy"): {"tpo_token": 81, "grpo_token": 338, "dg": 219, "ppo": 170},
     ("bag", "flip"): {"tpo_token": 56, "grpo_token": 104, "dg": 201, "ppo": 146},
     ("bag", "reverse_copy"): {"tpo_token": 55, "grpo_token": 352, "dg": 202, "ppo": None},
     ("bag", "reverse_flip"): {"tpo_token": 59, "grpo_token": 209, "dg": 200, "ppo": 143},
     ("sequential", "copy"): {"tpo_token": 295, "grpo_token": None, "dg": 439, "ppo": None},
     ("sequential", "flip"): {"tpo_token": 321, "grpo_token": None, "dg": 349, "ppo": None},
     ("sequential", "reverse_copy"): {"tpo_token": 159, "grpo_token": None, "dg": 515, "ppo": None},
     ("sequential", "reverse_flip"): {"tpo_token": 276, "grpo_token": None, "dg": 309, "ppo": None}},
)

# --- E6: terminal reward, sequence-level groups (paper §3.6, Table 3) -----------------------------------
TABLE3_FINAL_ERROR_PCT = Reference(
    "final exact-match error (%) at episode 1999, reverse copy, V = 2 (20 seeds); None = > 95%", "paper Table 3",
    {"H": (7, 8, 9, 10),
     "prompts": {"tpo": (6.9, 8.6, 6.1, 7.4), "grpo": (14.5, 27.6, 30.0, 50.4), "grpo_no_kl": (66.6, 92.5, None, None),
                 "ppo": (12.0, 26.3, 90.6, None), "dg": (33.8, 58.8, None, None)},
     "interactions": {"tpo": (1.8, 2.8, 5.3, 19.0), "grpo": (9.6, 23.2, 36.2, 48.7),
                      "grpo_no_kl": (78.1, 83.8, None, None), "ppo": (38.6, 62.1, 66.2, None),
                      "dg": (47.7, 69.4, None, None)}},
)
TERMINAL_H10_CURVE_PCT = Reference(
    "seed-mean exact-match error (%) by episode, H = 10, prompt-matched", "authors' committed npz (hero Fig. 1b)",
    {"tpo": {0: 99.8, 100: 99.8, 200: 95.0, 250: 82.4, 400: 67.9, 500: 47.6, 750: 37.5, 1000: 21.7, 1250: 12.6,
             1500: 9.6, 1750: 9.9, 1999: 7.4},
     "grpo": {500: 83.9, 1000: 63.3, 1500: 58.7, 1999: 50.4}, "dg": {1999: 99.75}},
)

# --- E7: anchor / target-matching ablations (paper §3.7, Fig. 8) ----------------------------------------
FIG8_FINAL_ERROR = Reference(
    "final exact-match error, prompt-matched (read from Fig. 8)", "paper Fig. 8",
    {"H": (7, 8, 10), "tpo": (0.06, 0.07, 0.08), "grpo": (0.15, 0.28, 0.5), "grpo_no_kl": (0.62, 0.92, 1.0),
     "tpo_no_anchor": (0.89, 0.94, 1.0), "group_pg": (0.99, 1.0, 1.0)},
)

# --- E8: section-4 diagnostics, H = 8, K = 32, B = 256 (Figs. 10, 11, 14) -------------------------------
SECTION4_DIAGNOSTICS = Reference(
    "diagnostics at H = 8, K = 32, B = 256 (10 seeds)", "paper §4.1–4.3, Figs. 10, 11, 14",
    {"initial_all_fail_fraction": 0.9, "theory_frac_success_at_init": 0.118, "grpo_error_plateau": 0.127,
     "tpo_all_fail_near_zero_by_episode": 250, "tpo_4ep_error_at_400": 0.002, "tpo_1ep_error_at_400": 0.011,
     "dg_plateau": 0.14},
)

# --- E9: K sweep, epoch sweep, zero-variance masking (Figs. 12, 13, 15) --------------------------------
K_SWEEP_FINAL_ERROR_PCT = Reference(
    "final error (%) by K, 4 epochs", "paper Fig. 12",
    {"K": (4, 8, 16, 32, 64), "tpo": (8.9, 5.2, 5.1, 2.6, 0.36), "grpo": (19.4, 19.8, 9.2, 4.4, 5.6)},
)
EPOCH_SWEEP_FINAL_ERROR_PCT = Reference(
    "final error (%) by epochs per batch, K = 32 (30 seeds)", "paper Fig. 15 (TPO 2/8/16 ep read from the figure)",
    {"epochs": (1, 2, 4, 8, 16), "tpo": (0.02, 2.0, 0.05, 2.3, 2.0), "grpo": (4.3, 37.6, 6.3, 3.3, 1.1)},
)
MASKING_FINAL_ERROR_PCT = Reference(
    "final error (%) with zero-variance masking, K = 32 (30 seeds)", "paper Fig. 13",
    {"tpo": 0.05, "grpo": 6.3, "grpo_masked": 29.7},
)

# --- E10: temperature sweep (App. D, Table 5) -----------------------------------------------------------
TABLE5_TEMPERATURE = Reference(
    "TPO final error (%) and episodes to 1% by η, reverse copy, bag, V = 2, H = 10, K = 8 (10 seeds)",
    "paper Table 5",
    {"eta": (0.25, 0.5, 1.0, 2.0, 4.0), "final_error_pct": (1.0, 0.0, 0.7, 1.0, 0.8), "steps_to_1pct": (72, 67, 96, 141, 260)},
)

# --- E11: multi-epoch DG (App. E, Fig. 17) --------------------------------------------------------------
DG_EPOCHS_TERMINAL = Reference(
    "final error, reverse-copy terminal reward (H = 5), 20 seeds", "paper App. E(a)", {"dg_1ep": 0.020, "dg_4ep": 0.483},
)
DG_EPOCHS_VARIANTS_PCT = Reference(
    "final error (%) 1-epoch vs 4-epoch DG on the 8 variants (bag values read from the figure)", "paper App. E(b, c)",
    {("bag", "copy"): (0.02, 0.12), ("bag", "flip"): (0.04, 0.04), ("bag", "reverse_copy"): (0.03, 0.21),
     ("bag", "reverse_flip"): (0.01, 0.02), ("sequential", "copy"): (0.45, 1.35), ("sequential", "flip"): (0.07, 4.56),
     ("sequential", "reverse_copy"): (0.35, 0.05), ("sequential", "reverse_flip"): (0.00, 0.82)},
)

# --- E12: LLM RLVR (paper §3.8, App. G) -----------------------------------------------------------------
LLM_RLVR = Reference(
    "LLM RLVR results (verl, K = 16, AdamW 1e-5, batch 16)", "paper §3.8",
    {"gsm8k_qwen3_1.7b": "TPO reaches 50% ~10 steps before GRPO; both end at 85–87%",
     "graph_color_qwen3_1.7b": {"tpo": 0.96, "grpo": 0.0},
     "graph_color_r1_distill_1.5b": {"tpo": 0.96, "grpo": 0.81}},
)
