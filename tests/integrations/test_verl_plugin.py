"""The verl 0.9.1 plugin: registration through the entry point, the loss through verl's registry, group checks,
the eta hand-off, and the App. G reward function."""

import importlib.util
import json
import logging
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.llm]
pytest.importorskip("verl", reason="needs the verl extra: pip install -e '.[verl]'")

from verl.trainer.ppo import core_algos  # `import verl` loads the plugin through the entry point
from verl.workers.config.actor import ActorConfig, PolicyLossConfig

from targetpo.integrations import verl_plugin
from targetpo.objectives import tpo_sequence_loss

ROOT = Path(__file__).resolve().parents[2]
REWARD = ROOT / "examples" / "verl" / "app_g_reward.py"


@pytest.fixture(autouse=True)
def _eta(monkeypatch):
    """η as `python -m targetpo.integrations.verl_trainer` exports it to the workers (the loss has no default)."""
    monkeypatch.setenv(verl_plugin.ETA_ENV, "1.0")



def actor_config(k, loss_agg_mode="seq-mean-token-sum"):
    return ActorConfig(strategy="fsdp", rollout_n=k, ppo_micro_batch_size_per_gpu=k, loss_agg_mode=loss_agg_mode,
                       policy_loss=PolicyLossConfig(loss_mode="tpo"))


def batch(g=3, k=4, t=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = g * k
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None] < lengths[:, None]).float()
    rewards = torch.randint(0, 3, (n,), generator=gen).float()
    rewards[:k] = 1.0  # one zero-variance group
    token_rewards = torch.zeros(n, t)
    token_rewards[torch.arange(n), lengths - 1] = rewards  # outcome reward on the last response token
    uid = np.repeat(np.array([f"p{i}" for i in range(g)], dtype=object), k)
    return dict(
        rewards=rewards, token_rewards=token_rewards, mask=mask, uid=uid,
        logp=-torch.rand(n, t, generator=gen) * 3, old=-torch.rand(n, t, generator=gen) * 3,
    )


def tpo_advantages(b):
    adv, ret = core_algos.get_adv_estimator_fn("tpo")(token_level_rewards=b["token_rewards"],
                                                       response_mask=b["mask"], index=b["uid"], config=None)
    assert torch.equal(adv, ret)
    return adv


@pytest.mark.slow  # a fresh interpreter imports verl (and ray); one interpreter for three checks: each costs ~10 s
def test_entry_point_is_discoverable_and_import_verl_alone_registers_tpo():
    """In a fresh interpreter: targetpo imports no optional library; `import verl` alone loads the plugin through
    the entry point, which registers the loss, the estimator and (with the verl extra: TransferQueue, cachetools,
    fastapi, uvicorn) the group-keeping trainer in verl's own registries; importing verl_trainer after verl then
    registers nothing twice ("could not register" is the circular import once seen when it came first)."""
    eps = [ep for ep in entry_points(group="verl.plugins") if ep.value == "targetpo.integrations.verl_plugin"]
    assert len(eps) == 1, "reinstall with `make install` so the verl.plugins entry point is in the metadata"
    code = (
        "import sys\n"
        "import targetpo, targetpo.objectives, targetpo.integrations\n"
        "assert not {'trl', 'verl', 'transformers'} & set(sys.modules), 'targetpo imported an optional library'\n"
        "import verl\n"
        "from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn\n"
        "from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY\n"
        "assert get_policy_loss_fn('tpo').__module__ == 'targetpo.integrations.verl_plugin'\n"
        "assert get_adv_estimator_fn('tpo').__module__ == 'targetpo.integrations.verl_plugin'\n"
        "alone = 'tpo_sync' in TRAINER_REGISTRY\n"
        "import targetpo.integrations.verl_trainer\n"
        "print(alone, 'tpo_sync' in TRAINER_REGISTRY)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "VERL_USE_EXTERNAL_PLUGINS"}
    env["PYTHONPATH"] = str(ROOT / "src")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "could not register" not in proc.stderr
    alone, after = proc.stdout.split()[-2:]
    assert after == "True", proc.stdout
    if importlib.util.find_spec("transfer_queue") is None:
        pytest.skip("the rest passed; `import verl` alone registering tpo_sync needs the verl extra's TransferQueue")
    assert alone == "True", "with the verl extra installed, `import verl` alone did not register tpo_sync"


def test_advantage_estimator_writes_population_z_scores_broadcast_over_tokens():
    b = batch()
    adv = tpo_advantages(b)
    r = b["rewards"].view(3, 4)
    sd = r.std(dim=1, unbiased=False, keepdim=True)
    u = torch.where(sd > 1e-6, (r - r.mean(1, keepdim=True)) / sd, torch.zeros_like(r)).reshape(-1)
    torch.testing.assert_close(adv, u[:, None] * b["mask"])
    assert torch.equal(adv[:4], torch.zeros(4, 6))  # zero-variance group


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rewards_give_float32_advantages_the_loss_accepts(dtype):
    b = batch()
    rewards = torch.zeros(12, 6)
    rewards[:, -1] = torch.tensor([1.0, 1, 1, 1, 1, 0, 2, 3, 0.7, 0.1, 0.2, 0.9])  # not exact in half precision
    adv, _ = core_algos.get_adv_estimator_fn("tpo")(token_level_rewards=rewards.to(dtype), response_mask=b["mask"],
                                                    index=b["uid"])
    ref, _ = core_algos.get_adv_estimator_fn("tpo")(token_level_rewards=rewards.to(dtype).float(),
                                                    response_mask=b["mask"], index=b["uid"])
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, ref)
    core_algos.get_policy_loss_fn("tpo")(old_log_prob=b["old"], log_prob=b["logp"], advantages=adv,
                                         response_mask=b["mask"], config=actor_config(4))


def test_advantage_estimator_refuses_a_reordered_batch():
    b = batch()
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7, 8, 9, 10, 11])  # what balance_batch can do
    with pytest.raises(ValueError, match="balance_batch=False"):
        core_algos.get_adv_estimator_fn("tpo")(token_level_rewards=b["token_rewards"][perm],
                                               response_mask=b["mask"][perm], index=b["uid"][perm.numpy()])


@pytest.mark.parametrize("agg, seq_logp", [("seq-mean-token-sum", "sum"), ("seq-mean-token-mean", "mean")])
def test_loss_through_verls_registry_matches_the_objective(agg, seq_logp):
    b = batch()
    adv = tpo_advantages(b)
    logp = b["logp"].clone().requires_grad_()
    loss, metrics = core_algos.get_policy_loss_fn("tpo")(
        old_log_prob=b["old"], log_prob=logp, advantages=adv, response_mask=b["mask"], loss_agg_mode=agg,
        config=actor_config(4, agg), rollout_is_weights=None)
    loss.backward()
    ref_logp = b["logp"].clone().requires_grad_()
    ref = tpo_sequence_loss(ref_logp.view(3, 4, 6), b["old"].view(3, 4, 6), b["rewards"].view(3, 4),
                            token_mask=b["mask"].bool().view(3, 4, 6), seq_logp=seq_logp)
    ref.loss.backward()
    torch.testing.assert_close(loss, ref.loss)
    torch.testing.assert_close(logp.grad, ref_logp.grad)
    r = b["rewards"].view(3, 4)
    assert metrics["actor/tpo_frac_zero_var"] == pytest.approx(float((r == r[:, :1]).all(1).float().mean()))
    assert metrics["actor/tpo_kl_q_p"] >= 0


def test_loss_is_its_share_of_the_global_mini_batch_mean_and_reads_eta_from_the_environment(monkeypatch):
    b = batch()
    adv = tpo_advantages(b)
    fn = core_algos.get_policy_loss_fn("tpo")
    cfg = actor_config(4)
    cfg.global_batch_info.update(dp_size=2, global_batch_size=48, batch_num_tokens=None, loss_scale_factor=None)
    monkeypatch.setenv(verl_plugin.ETA_ENV, "0.5")
    loss, _ = fn(old_log_prob=b["old"], log_prob=b["logp"], advantages=adv, response_mask=b["mask"],
                 loss_agg_mode="seq-mean-token-sum", config=cfg)
    ref = tpo_sequence_loss(b["logp"].view(3, 4, 6), b["old"].view(3, 4, 6), b["rewards"].view(3, 4),
                            token_mask=b["mask"].bool().view(3, 4, 6), eta=0.5)
    # 12 of the global 48 rows, averaged over 2 data-parallel ranks: 12/48 · 2 of this micro-batch's group mean.
    torch.testing.assert_close(loss, ref.loss * 12 / 48 * 2)
    monkeypatch.setenv(verl_plugin.ETA_ENV, "-1")
    with pytest.raises(ValueError, match=verl_plugin.ETA_ENV):
        fn(old_log_prob=b["old"], log_prob=b["logp"], advantages=adv, response_mask=b["mask"],
           loss_agg_mode="seq-mean-token-sum", config=actor_config(4))


def test_loss_rejects_a_shuffled_group_and_other_layouts_it_cannot_trust():
    b = batch(g=2)
    b["token_rewards"][:, :] = 0
    last = b["mask"].sum(-1).long() - 1
    b["token_rewards"][torch.arange(8), last] = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0])
    adv = tpo_advantages(b)
    fn = core_algos.get_policy_loss_fn("tpo")

    def call(perm=None, advantages=adv, agg="seq-mean-token-sum", k=4, **kw):
        p = torch.arange(8) if perm is None else torch.tensor(perm)
        return fn(old_log_prob=b["old"][p], log_prob=b["logp"][p], advantages=advantages[p],
                  response_mask=b["mask"][p], loss_agg_mode=agg, config=actor_config(k, agg), **kw)

    call()  # the whole layout passes
    call(perm=[4, 5, 6, 7, 0, 1, 2, 3])  # whole groups in another order pass too
    with pytest.raises(ValueError, match="whole groups"):
        call(perm=[4, 1, 2, 3, 0, 5, 6, 7])  # one row swapped between groups
    with pytest.raises(ValueError, match="not a multiple of K"):
        call(k=3)
    grpo, _ = core_algos.compute_grpo_outcome_advantage(b["token_rewards"], b["mask"], b["uid"])
    with pytest.raises(ValueError, match="whole groups"):  # GRPO's Bessel-scaled advantages are not z-scores
        call(advantages=grpo)
    noisy = adv + 0.1 * torch.rand(adv.shape) * b["mask"]
    with pytest.raises(ValueError, match="vary over its tokens"):
        call(advantages=noisy)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        call(agg="token-mean")
    with pytest.raises(ValueError, match="importance weights"):
        call(rollout_is_weights=torch.ones(8, 6))


def test_verify_registration_raises_and_warns_when_tpo_is_missing(monkeypatch, caplog):
    verl_plugin.verify_registration()
    monkeypatch.setitem(core_algos.POLICY_LOSS_REGISTRY, "tpo", core_algos.get_policy_loss_fn("vanilla"))
    with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError, match="did not register"):
        verl_plugin.verify_registration()
    assert any("did not register" in r.message for r in caplog.records)


def test_graph_color_reward_uses_reasoning_gyms_scorer():
    import importlib.util

    spec = importlib.util.spec_from_file_location("app_g_reward", REWARD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the file verl's custom_reward_function.path points at
    from targetpo.integrations.verl_rewards import DATA_SOURCE, graph_color_rows

    import reasoning_gym as rg

    rows = graph_color_rows(3, seed=5, split="train")
    entries = rg.create_dataset("graph_color", size=3, seed=5)
    for row, entry in zip(rows, entries):
        assert row["prompt"][-1]["content"] == entry["question"] and row["data_source"] == DATA_SOURCE
        truth = row["reward_model"]["ground_truth"]
        good = json.dumps(entry["metadata"]["possible_answer"])
        assert module.compute_score(DATA_SOURCE, f"think...<answer>{good}</answer>", truth) == 1.0
        u, v = entry["metadata"]["puzzle"]["edges"][0]
        bad = {**entry["metadata"]["possible_answer"], str(u): 1, str(v): 1}
        assert module.compute_score(DATA_SOURCE, f"<answer>{json.dumps(bad)}</answer>", truth) == 0.01
        assert module.compute_score(DATA_SOURCE, "no answer tags", truth) == 0.0


@pytest.mark.parametrize("data_source, solution, truth, message", [
    ("openai/gsm8k", "<answer>5</answer>", None, "ground_truth"),  # scored 0 for every response before
    ("openai/gsm8k", "<answer>5</answer>", 5, "ground_truth"),
    ("reasoning_gym/knights_knaves", "<answer>x</answer>", "", "ground_truth"),  # scored 1.0 before
    ("reasoning_gym/graph_color", "<answer>{}</answer>", "not json", "ground_truth"),  # JSONDecodeError before
    ("reasoning_gym/graph_color", "<answer>{}</answer>", "{}", "vertices"),  # scored 0 for every response before
    ("reasoning_gym/graph_color", "<answer>{}</answer>", "[1, 2]", "ground_truth"),
    ("openai/gsm8k", None, "5", "solution_str"),
    ("openai/gsm8k", b"<answer>5</answer>", "5", "solution_str"),
    ("gsm8k", "<answer>5</answer>", "5", "data_source='gsm8k'"),
])
def test_reward_refuses_a_malformed_row_instead_of_scoring_it(data_source, solution, truth, message):
    from targetpo.integrations.verl_rewards import compute_score

    with pytest.raises(ValueError, match=message):
        compute_score(data_source, solution, truth)


def test_verls_worker_loss_ppo_loss_runs_tpo_end_to_end():
    """verl's own worker loss (`workers.utils.losses.ppo_loss`, the caller in the FSDP engine) with loss_mode=tpo."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    n, p_len, t, k = 8, 3, 5, 4
    gen = torch.Generator().manual_seed(0)
    resp_len = torch.randint(1, t + 1, (n,), generator=gen)
    resp_mask = (torch.arange(t)[None] < resp_len[:, None]).long()
    scores = torch.tensor([1.0, 0, 0, 1, 1, 1, 0, 1])
    token_rewards = torch.zeros(n, t)
    token_rewards[torch.arange(n), resp_len - 1] = scores
    adv = core_algos.get_adv_estimator_fn("tpo")(token_level_rewards=token_rewards, response_mask=resp_mask.float(),
                                                 index=np.repeat(["a", "b"], k))[0]
    full = -torch.rand(n, p_len + t, generator=gen)  # model output: log-prob of each next token, unpadded below
    old = -torch.rand(n, t, generator=gen)
    flat = torch.cat([full[i, : p_len + resp_len[i]] for i in range(n)]).requires_grad_()
    data = TensorDict({"prompts": torch.ones(n, p_len, dtype=torch.long), "responses": torch.ones(n, t, dtype=torch.long),
                       "attention_mask": torch.cat([torch.ones(n, p_len, dtype=torch.long), resp_mask], 1),
                       "response_mask": resp_mask, "old_log_probs": old, "advantages": adv}, batch_size=[n])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(resp_mask.sum()), global_batch_size=n)
    loss, metrics = ppo_loss(actor_config(k), {"log_probs": flat}, data)
    # Response token j's log-prob is the model output at position p_len - 1 + j (verl shifts by one).
    resp_logp = torch.stack([torch.nn.functional.pad(full[i, p_len - 1: p_len - 1 + resp_len[i]], (0, t - resp_len[i]))
                             for i in range(n)])
    ref = tpo_sequence_loss(resp_logp.view(2, k, t), old.view(2, k, t), scores.view(2, k),
                            token_mask=resp_mask.bool().view(2, k, t))
    torch.testing.assert_close(loss, ref.loss)
    assert {"actor/pg_loss", "actor/tpo_kl_q_p", "actor/tpo_target_entropy"} <= set(metrics)


# ----------------------------------------------------------------------------- edges a mutation audit found open

def test_a_group_split_into_two_blocks_is_refused():
    """uids a a b b a a: group a's rows are not contiguous, so its two blocks would be standardized as two groups."""
    from targetpo.integrations.verl_plugin import compute_tpo_advantage

    r = torch.tensor([[1.0], [0.0], [1.0], [0.0], [0.0], [0.0]])
    with pytest.raises(ValueError):
        compute_tpo_advantage(r, torch.ones(6, 1), index=np.array(list("aabbaa")))


def test_bf16_token_rewards_are_summed_in_fp32():
    """Token rewards summing to 257 and 256 are different scores (z = +1, −1); rounded to bf16 they tie at 256."""
    from targetpo.integrations.verl_plugin import compute_tpo_advantage

    r = torch.zeros(2, 3, dtype=torch.bfloat16)
    r[0] = torch.tensor([256.0, 1.0, 0.0])
    r[1, 0] = 256.0
    adv = compute_tpo_advantage(r, torch.ones(2, 3), index=np.array(["a", "a"]))[0]
    assert adv[:, 0].float().tolist() == pytest.approx([1.0, -1.0])


def test_a_gsm8k_response_without_an_answer_block_scores_zero():
    from targetpo.integrations.verl_rewards import compute_score

    assert compute_score("openai/gsm8k", "so the answer is 72", "72") == 0.0
    assert compute_score("openai/gsm8k", "so <answer>72</answer>", "72") == 1.0


def two_groups(t=4):
    """Two groups of K = 4 with outcome rewards on the last token, all tokens valid; their tpo advantages."""
    rewards = torch.zeros(8, t)
    rewards[:, -1] = torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0])
    mask = torch.ones(8, t)
    adv, _ = verl_plugin.compute_tpo_advantage(rewards, mask, index=np.repeat(["a", "b"], 4))
    return adv, mask


def tpo_loss(adv, mask, config=None, logp=None, old=None):
    logp = -torch.ones_like(mask) if logp is None else logp
    old = -torch.ones_like(mask) if old is None else old
    return verl_plugin.compute_policy_loss_tpo(old, logp, adv, mask, config=config or actor_config(4))



# ----------------------------------------------------------------------------- η hand-off (TARGETPO_TPO_ETA)

def test_a_near_miss_of_the_eta_variable_without_tpo_or_eta_in_it_is_refused(monkeypatch):
    """'A few edits away' also covers a typo that spells neither TPO nor ETA (two swapped letter pairs)."""
    monkeypatch.setenv("TARGETPO_TOP_EAT", "0.5")
    with pytest.raises(ValueError, match="TARGETPO_TOP_EAT is not read by targetpo; did you mean TARGETPO_TPO_ETA"):
        verl_plugin.tpo_eta_from_env()


@pytest.mark.parametrize("raw", ["inf", "-inf", "-2.5"])
def test_a_non_finite_or_negative_exported_eta_is_refused_with_its_value(raw, monkeypatch):
    """Non-finite and non-positive η are errors, and the message quotes the value that was exported."""
    monkeypatch.setenv(verl_plugin.ETA_ENV, raw)
    with pytest.raises(ValueError, match=f"TARGETPO_TPO_ETA='{raw}'"):
        verl_plugin.tpo_eta_from_env()


# ----------------------------------------------------------------------------- the tpo advantage estimator

@pytest.mark.parametrize("index", [
    list("aaaabbb"),  # 7 group ids for 8 rows
    list("abcdefgh"),  # K = 1: no group to standardize within
    list("aabbbbbb"),  # blocks of 2 and 6 rows: not one K
])
def test_estimator_refuses_ids_that_are_not_equal_contiguous_groups_of_k_at_least_2(index):
    """One id per row, and contiguous blocks of one size K >= 2 (the estimator's docstring)."""
    with pytest.raises(ValueError):
        verl_plugin.compute_tpo_advantage(torch.ones(8, 3), torch.ones(8, 3), index=np.array(index))


# ----------------------------------------------------------------------------- the tpo policy loss

def test_loss_refuses_a_row_whose_advantage_varies_by_a_thousandth_and_names_the_row():
    """One score per response: row 5's advantage differing by 1e-3 on one token is not constant over its tokens."""
    adv, mask = two_groups()
    adv[5, 1] += 1e-3
    with pytest.raises(ValueError, match="advantages of row 5 vary over its tokens"):
        tpo_loss(adv, mask)


def test_loss_refuses_rollout_n_zero_with_a_value_error():
    """K = rollout_n = 0 is a refused setting naming rollout_n, not a ZeroDivisionError."""
    adv, mask = two_groups()
    with pytest.raises(ValueError, match="rollout_n = 0"):
        tpo_loss(adv, mask, config=actor_config(0))


def test_loss_needs_the_global_batch_size_when_data_parallel():
    """With dp_size > 1 the share of the global mean cannot be formed without global_batch_size: an error."""
    adv, mask = two_groups()
    cfg = actor_config(4)
    cfg.global_batch_info.update(dp_size=2)
    with pytest.raises(ValueError, match="global_batch_size is required"):
        tpo_loss(adv, mask, config=cfg)


def test_ppo_kl_metric_is_verls_masked_mean_of_old_minus_new_log_prob():
    """actor/ppo_kl as verl defines it: the mean over valid response tokens of old_log_prob - log_prob."""
    adv, _ = two_groups()
    mask = torch.ones(8, 4)
    mask[:, 2:] = 0  # half the tokens are padding, where the log-probs below differ wildly
    old = torch.where(mask.bool(), -1.0, 0.0)
    logp = torch.where(mask.bool(), -1.5, -5.0)
    _, metrics = tpo_loss(adv * mask, mask, logp=logp, old=old)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.5)  # (-1) - (-1.5) on every valid token


def test_verify_registration_raises_when_the_estimator_is_not_ours(monkeypatch):
    """Both registries must resolve `tpo` to this module: another advantage estimator under the name is an error."""
    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, "tpo", core_algos.get_adv_estimator_fn("grpo"))
    with pytest.raises(RuntimeError, match="did not register"):
        verl_plugin.verify_registration()
