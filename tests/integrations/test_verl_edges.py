"""Edges of the verl plugin and the tpo_sync trainer path that a mutation audit found untested: the η hand-off's
refusals, the estimator's layout checks, the loss's per-micro-batch checks and metrics, and step-0 config checks."""

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.llm]
pytest.importorskip("verl", reason="needs the verl extra: pip install -e '.[verl]'")

from hydra import compose, initialize_config_module  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config.actor import ActorConfig, PolicyLossConfig  # noqa: E402

from targetpo.integrations import verl_plugin, verl_trainer  # noqa: E402

TPO_LAYOUT = ["algorithm.adv_estimator=tpo", "actor_rollout_ref.actor.policy_loss.loss_mode=tpo",
              "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum", "actor_rollout_ref.rollout.n=4",
              "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.shuffle=False",
              "trainer.n_gpus_per_node=2", "trainer.v1.trainer_mode=tpo_sync"]


@pytest.fixture(autouse=True)
def _eta(monkeypatch):
    """η as the launcher exports it to the workers (the loss has no default)."""
    monkeypatch.setenv(verl_plugin.ETA_ENV, "1.0")


def compose_verl(overrides):
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def actor_config(k=4):
    return ActorConfig(strategy="fsdp", rollout_n=k, ppo_micro_batch_size_per_gpu=4,
                       loss_agg_mode="seq-mean-token-sum", policy_loss=PolicyLossConfig(loss_mode="tpo"))


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
    return verl_plugin.compute_policy_loss_tpo(old, logp, adv, mask, config=config or actor_config())


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
        tpo_loss(adv, mask, config=actor_config(k=0))


def test_loss_needs_the_global_batch_size_when_data_parallel():
    """With dp_size > 1 the share of the global mean cannot be formed without global_batch_size: an error."""
    adv, mask = two_groups()
    cfg = actor_config()
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


# ----------------------------------------------------------------------------- step-0 config checks

@pytest.mark.parametrize("key", ["TPO_eta", "Tpo_eta"])
def test_a_top_level_tpo_key_in_any_case_is_refused(key):
    """A stray top-level tpo* key (any case) would be ignored, training with the default η: it is an error."""
    with pytest.raises(ValueError, match=f"{key} is not a verl or TPO setting"):
        verl_trainer.tpo_settings(OmegaConf.create({key: 0.5}))


@pytest.mark.parametrize("overrides, names", [
    (["actor_rollout_ref.rollout.n=1"], "actor_rollout_ref.rollout.n=1"),  # K >= 2
    (["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"], "ppo_micro_batch_size_per_gpu=2"),  # half a group
    # 2 nodes x 2 GPUs = 4 data-parallel ranks: 2 prompts per mini-batch cannot be split into whole groups
    (["trainer.nnodes=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2"], "ppo_mini_batch_size=2 prompts"),
    (["data.train_batch_size=6"], "data.train_batch_size=6"),  # not a multiple of the mini-batch of 4
    (["trainer.nnodes=true"], "trainer.nnodes=True"),  # a bool is not an integer count
    (["algorithm.norm_adv_by_std_in_grpo=0"], "algorithm.norm_adv_by_std_in_grpo=0"),  # anything but True
])
def test_more_settings_that_split_a_group_are_refused_by_name(overrides, names):
    """docs/verl.md §2: each setting that would split a group (or is ignored by TPO) is an error naming it."""
    with pytest.raises(ValueError, match="TPO cannot run with these verl settings") as err:
        verl_trainer.check_config(compose_verl(TPO_LAYOUT + overrides))
    assert names in str(err.value)


@pytest.mark.parametrize("overrides", [
    ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"],  # two whole groups of K = 4
    ["trainer.nnodes=2", "data.train_batch_size=8"],  # 4 ranks, mini-batch of 4 prompts: one group each
])
def test_settings_that_keep_groups_whole_are_accepted(overrides):
    """Micro-batches of any multiple of K, and mini-batches a multiple of nnodes x n_gpus_per_node, pass."""
    assert verl_trainer.check_config(compose_verl(TPO_LAYOUT + overrides)) == {"eta": 1.0}


# ----------------------------------------------------------------------------- the tpo_sync trainer

class FakeKVBatch:
    """verl's KVBatchMeta as the v1 trainer's _balance_batch uses it: keys, tags, reorder, len."""

    def __init__(self, keys, seq_lens):
        self.keys, self.tags = list(keys), [{"seq_len": s} for s in seq_lens]

    def __len__(self):
        return len(self.keys)

    def reorder(self, order):
        self.keys, self.tags = [self.keys[i] for i in order], [self.tags[i] for i in order]


def test_balance_whole_groups_parses_uids_that_contain_underscores():
    """Keys are {uid}_{session}_{output index}: a uid with '_' in it is still one uid, output index 0."""
    keys = [f"prompt_{g}_{s}_0" for s in range(2) for g in range(4)]
    batch = FakeKVBatch(keys, [5] * 8)
    verl_trainer.balance_whole_groups(batch, 2, required_multiple=4)
    uids = [key.rsplit("_", 2)[0] for key in batch.keys]
    assert all(uids[i] == uids[i + 1] for i in range(0, 8, 2)) and len(set(uids)) == 4


def test_whole_group_order_balances_verls_workload_not_the_token_count():
    """Groups go to ranks by verl's calculate_workload (24576·s + s² per row), not by summed lengths s.

    Group workloads: a (1, 1999): 53_148_002; b (1025, 1025): 52_482_050; c (10, 2000): 53_397_860;
    d (1200, 1200): 61_862_400. Rank pairs {a,b|c,d} differ by 9_630_208, {a,c|b,d} by 7_798_588 (the best),
    {a,d|b,c} by 9_130_492. By token count (2000, 2050, 2010, 2400) {a,d|b,c} would be the best (340 vs 360, 440).
    """
    uids = list("aabbccdd")
    parts = verl_trainer.whole_group_order(uids, [1, 1999, 1025, 1025, 10, 2000, 1200, 1200], 2)
    assert sorted(sorted({uids[i] for i in part}) for part in parts) == [["a", "c"], ["b", "d"]]


def test_tpo_sync_trainer_refuses_a_process_without_the_exported_eta(monkeypatch):
    """Without TARGETPO_TPO_ETA in the trainer's process, construction is a ValueError naming tpo.eta."""
    monkeypatch.delenv(verl_plugin.ETA_ENV)
    with pytest.raises(ValueError, match="tpo.eta=1.0 but the Ray workers' TARGETPO_TPO_ETA=None"):
        verl_trainer.register_tpo_trainer()(compose_verl(TPO_LAYOUT))
