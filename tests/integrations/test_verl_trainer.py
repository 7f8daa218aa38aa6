"""verl 0.9.1's current trainer with TPO, on CPU: whole-group balancing on a real DataProto (and verl's per-row
balancing splitting the same batch), the `tpo` config section and layout checks through Hydra, how
loss_agg_mode scales verl's KL and entropy terms (verl's own ppo_loss / agg_loss), and the App. G recipes:
data preparation into verl's parquet layout and every launch script's overrides composing with verl's config."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.llm]
pytest.importorskip("verl", reason="needs the verl extra: pip install -e '.[verl]'")

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_module  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions  # noqa: E402

from targetpo.integrations import verl_plugin, verl_trainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "examples" / "verl"
SCRIPTS = ("run_gsm8k.sh", "run_graph_color.sh", "run_knights_knaves.sh")


def compose_verl(overrides):
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


TPO_LAYOUT = ["algorithm.adv_estimator=tpo", "actor_rollout_ref.actor.policy_loss.loss_mode=tpo",
              "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum", "actor_rollout_ref.rollout.n=4",
              "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.shuffle=False",
              "trainer.n_gpus_per_node=2", "trainer.v1.trainer_mode=tpo_sync"]


def grouped_batch(groups=8, k=4, seed=0):
    """A rollout batch as verl lays it out: each uid's k responses contiguous, varying lengths."""
    gen = torch.Generator().manual_seed(seed)
    n, width = groups * k, 64
    lengths = torch.randint(4, width + 1, (n,), generator=gen)
    lengths[::k] = width  # one long response per group makes per-row balancing pull groups apart
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    uid = np.repeat(np.array([f"u{g}" for g in range(groups)], dtype=object), k)
    return DataProto.from_dict(tensors={"attention_mask": mask, "row": torch.arange(n)},
                               non_tensors={"uid": uid})


def rank_groups(data, dp):
    """{uid: set of ranks} after verl's dispatch splits the batch into dp equal contiguous chunks."""
    uids, size = data.non_tensor_batch["uid"], len(data) // dp
    out = {}
    for i, u in enumerate(uids):
        out.setdefault(u, set()).add(i // size)
    return out


def test_verls_per_row_balancing_splits_groups_and_whole_group_order_keeps_them(one_torch_thread):
    dp, k = 2, 4
    naive, ours = grouped_batch(k=k), grouped_batch(k=k)
    seqlens = naive.batch["attention_mask"].sum(-1)
    parts = get_seqlen_balanced_partitions(calculate_workload(seqlens), k_partitions=dp, equal_size=True)
    naive.reorder(torch.tensor([j for p in parts for j in p]))  # what verl's _balance_batch does
    assert any(len(ranks) > 1 for ranks in rank_groups(naive, dp).values()), "per-row balancing kept groups"

    parts = verl_trainer.whole_group_order(ours.non_tensor_batch["uid"], seqlens.tolist(), dp)
    ours.reorder(torch.tensor([j for p in parts for j in p]))
    assert all(len(ranks) == 1 for ranks in rank_groups(ours, dp).values())
    uids = ours.non_tensor_batch["uid"]
    blocks = [uids[i:i + k] for i in range(0, len(uids), k)]
    assert all(len(set(b)) == 1 for b in blocks) and len({b[0] for b in blocks}) == 8  # contiguous, whole
    assert sorted(ours.batch["row"].tolist()) == list(range(32))
    loads = [int(calculate_workload(seqlens[p]).sum()) for p in parts]
    assert max(loads) / min(loads) < 1.5  # still balanced across ranks
    # The TPO estimator accepts the reordered batch (groups contiguous) ...
    rewards = torch.zeros(32, 3)
    rewards[:, -1] = torch.arange(32.0) % 3
    core_algos.get_adv_estimator_fn("tpo")(token_level_rewards=rewards, response_mask=torch.ones(32, 3),
                                           index=uids)
    # ... and refuses the per-row-balanced one.
    with pytest.raises(ValueError, match="contiguous block"):
        core_algos.get_adv_estimator_fn("tpo")(token_level_rewards=rewards, response_mask=torch.ones(32, 3),
                                               index=naive.non_tensor_batch["uid"])


def test_whole_group_order_gathers_interleaved_groups_and_refuses_uneven_ones():
    # The replay buffer may hand rows over in completion order: a group's rows are gathered, in arrival order.
    uids = ["a", "b", "a", "c", "b", "d", "c", "d"]
    parts = verl_trainer.whole_group_order(uids, [5, 1, 6, 2, 2, 3, 1, 4], 2)
    assert sorted(i for p in parts for i in p) == list(range(8)) and [len(p) for p in parts] == [4, 4]
    for part in parts:
        for block in (part[:2], part[2:]):
            assert uids[block[0]] == uids[block[1]] and block[0] < block[1]
    with pytest.raises(ValueError, match="group sizes"):
        verl_trainer.whole_group_order(["a", "a", "a", "b", "b"], [1] * 5, 1)
    with pytest.raises(ValueError, match="group sizes"):
        verl_trainer.whole_group_order(["a", "b"], [1, 1], 1)  # K = 1
    with pytest.raises(ValueError, match="dp_size=2"):
        verl_trainer.whole_group_order(["a"] * 4 + ["b"] * 4 + ["c"] * 4, [1] * 12, 2)


class FakeKVBatch:
    """The part of verl's KVBatchMeta the v1 trainer's _balance_batch touches: keys, tags, reorder, len."""

    def __init__(self, keys, seq_lens):
        self.keys, self.tags = list(keys), [{"seq_len": s} for s in seq_lens]

    def __len__(self):
        return len(self.keys)

    def reorder(self, order):
        self.keys, self.tags = [self.keys[i] for i in order], [self.tags[i] for i in order]


def test_balance_whole_groups_reorders_a_v1_batch_into_whole_groups_per_rank():
    k, dp = 4, 2
    keys = [f"uid{g}_{s}_0" for s in range(k) for g in range(4)]  # interleaved: arrival order across groups
    batch = FakeKVBatch(keys, seq_lens=[10 + 7 * i for i in range(16)])
    verl_trainer.balance_whole_groups(batch, dp, required_multiple=8)
    uids = [key.split("_")[0] for key in batch.keys]
    assert all(len(set(uids[i:i + k])) == 1 for i in range(0, 16, k))  # contiguous whole groups
    assert set(uids[:8]).isdisjoint(uids[8:])  # each rank's half holds its own groups
    assert sorted(batch.keys) == sorted(keys)
    with pytest.raises(ValueError, match="filler rows"):
        verl_trainer.balance_whole_groups(FakeKVBatch(keys, [1] * 16), dp, required_multiple=32)
    with pytest.raises(ValueError, match="multi-output"):
        verl_trainer.balance_whole_groups(FakeKVBatch([key[:-1] + "1" for key in keys], [1] * 16), dp, 8)


def test_tpo_section_composes_through_hydra_and_is_validated():
    cfg = compose_verl(TPO_LAYOUT + ["+tpo.eta=0.25"])
    assert verl_trainer.check_config(cfg) == {"eta": 0.25}
    omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # verl's own dataclass validation still passes
    omega_conf_to_dataclass(cfg.algorithm)
    assert verl_trainer.export_eta(cfg) == 0.25
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars[verl_plugin.ETA_ENV] == "0.25"
    assert verl_trainer.check_config(compose_verl(TPO_LAYOUT)) == {"eta": 1.0}
    with pytest.raises(ValueError, match=r"tpo\.etta is not a TPO setting; did you mean tpo\.eta"):
        verl_trainer.check_config(compose_verl(TPO_LAYOUT + ["+tpo.etta=0.5"]))
    with pytest.raises(ValueError, match=r"tpo_eta is not a verl or TPO setting.*did you mean tpo\.eta"):
        verl_trainer.check_config(compose_verl(TPO_LAYOUT + ["+tpo_eta=0.5"]))
    for bad in ("0", "-1", "inf", "nan", "abc", "true"):
        with pytest.raises(ValueError, match="tpo.eta"):
            verl_trainer.check_config(compose_verl(TPO_LAYOUT + [f"+tpo.eta={bad}"]))
    for bad in ("0.5", "abc", "[1,2]"):  # the section itself, not tpo.eta
        with pytest.raises(ValueError, match=r"tpo=.*must be a section.*tpo\.eta"):
            verl_trainer.check_config(compose_verl(TPO_LAYOUT + [f"+tpo={bad}"]))
    # Where verl's dataclasses would put it, a TPO key is rejected by verl itself: hence the own section.
    cfg = compose_verl(TPO_LAYOUT + ["+actor_rollout_ref.actor.policy_loss.tpo_eta=0.5"])
    with pytest.raises(Exception, match="tpo_eta"):
        omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


@pytest.mark.parametrize("override, names", [
    ("trainer.v1.trainer_mode=sync", "trainer.v1.trainer_mode=tpo_sync"),
    ("actor_rollout_ref.actor.use_dynamic_bsz=True", "use_dynamic_bsz"),
    ("actor_rollout_ref.actor.shuffle=True", "actor_rollout_ref.actor.shuffle"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=6", "ppo_micro_batch_size_per_gpu"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=3", "ppo_mini_batch_size"),
    ("actor_rollout_ref.actor.loss_agg_mode=token-mean", "loss_agg_mode"),
    ("algorithm.adv_estimator=grpo", "algorithm.adv_estimator=tpo"),
    ("algorithm.rollout_correction.rollout_is=token", "rollout_is"),
    # Rollout log-probs as p_old (and, on the legacy trainer, verl's bypass loss in place of TPO's).
    ("algorithm.rollout_correction.bypass_mode=True", "algorithm.rollout_correction.bypass_mode=True"),
    ("algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs=token_k1"),
    # Counts that are missing, fractional or zero (no ZeroDivisionError, no silent int() truncation).
    ("actor_rollout_ref.rollout.n=null", "actor_rollout_ref.rollout.n=None"),
    ("actor_rollout_ref.rollout.n=4.5", "actor_rollout_ref.rollout.n=4.5"),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0", "ppo_micro_batch_size_per_gpu=0"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=0", "ppo_mini_batch_size=0"),
    ("actor_rollout_ref.actor.ppo_mini_batch_size=null", "ppo_mini_batch_size=None"),
    ("data.train_batch_size=0", "data.train_batch_size=0"),
    ("trainer.n_gpus_per_node=0", "trainer.n_gpus_per_node=0"),
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=3", "ulysses_sequence_parallel_size=3"),
    # Settings the tpo estimator or loss never reads: refused rather than silently ignored.
    ("algorithm.norm_adv_by_std_in_grpo=False", "algorithm.norm_adv_by_std_in_grpo=False"),
    ("actor_rollout_ref.actor.clip_ratio_high=0.28", "actor_rollout_ref.actor.clip_ratio_high=0.28"),
    ("actor_rollout_ref.actor.clip_ratio_c=10.0", "actor_rollout_ref.actor.clip_ratio_c=10.0"),
    ("actor_rollout_ref.actor.tau_neg=2.0", "actor_rollout_ref.actor.tau_neg=2.0"),
    ("actor_rollout_ref.actor.policy_loss.kl_cov_ratio=0.01", "policy_loss.kl_cov_ratio=0.01"),
])
def test_every_setting_that_splits_a_group_is_refused_by_name(override, names):
    cfg = compose_verl(TPO_LAYOUT + [override])
    with pytest.raises(ValueError, match="TPO cannot run with these verl settings") as err:
        verl_trainer.check_config(cfg)
    assert names in str(err.value)


def test_ignored_settings_table_holds_verls_own_defaults():
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig

    fields = {f"{prefix}{f.name}": f.default for cls, prefix in ((ActorConfig, ""), (PolicyLossConfig, "policy_loss."))
              for f in __import__("dataclasses").fields(cls)}
    assert {name: fields[name] for name in verl_trainer.IGNORED_BY_TPO_LOSS} == verl_trainer.IGNORED_BY_TPO_LOSS
    verl_trainer.check_config(compose_verl(TPO_LAYOUT + ["actor_rollout_ref.actor.clip_ratio=0.2"]))  # the default


def test_legacy_trainer_needs_balance_batch_off_and_grpo_needs_no_tpo_layout():
    legacy = [o for o in TPO_LAYOUT if not o.startswith("trainer.v1")] + ["trainer.use_v1=False"]
    with pytest.raises(ValueError, match="trainer.balance_batch=False"):
        verl_trainer.check_config(compose_verl(legacy))
    verl_trainer.check_config(compose_verl(legacy + ["trainer.balance_batch=False"]))
    verl_trainer.check_config(compose_verl(["algorithm.adv_estimator=grpo"]))  # verl defaults are fine for GRPO


def test_eta_environment_transport_is_strict(monkeypatch):
    monkeypatch.delenv(verl_plugin.ETA_ENV, raising=False)
    with pytest.raises(ValueError, match="tpo.eta"):
        verl_plugin.tpo_eta_from_env()
    monkeypatch.setenv(verl_plugin.ETA_ENV, "0.5")
    assert verl_plugin.tpo_eta_from_env() == 0.5
    for typo in ("TARGETPO_TPO_ETTA", "TARGETPO_ETA", "TARGETPO_TP0_ETA"):
        monkeypatch.setenv(typo, "0.5")
        with pytest.raises(ValueError, match=f"{typo} is not read by targetpo; did you mean TARGETPO_TPO_ETA"):
            verl_plugin.tpo_eta_from_env()
        monkeypatch.delenv(typo)
    monkeypatch.setenv("TARGETPO_GSM8K_DIR", "/data")  # the package's other variables are not typos of it
    assert verl_plugin.tpo_eta_from_env() == 0.5
    for bad in ("nan", "0", "x"):
        monkeypatch.setenv(verl_plugin.ETA_ENV, bad)
        with pytest.raises(ValueError, match=verl_plugin.ETA_ENV):
            verl_plugin.tpo_eta_from_env()


@pytest.mark.parametrize("agg", sorted(verl_plugin.SEQ_LOGP_BY_LOSS_AGG))
def test_loss_agg_mode_scales_verls_kl_and_entropy_terms_as_documented(agg, monkeypatch):
    """verl's own ppo_loss: total = TPO loss - entropy_coeff * H + kl_loss_coef * KL, each aggregated by agg."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.config.actor import ActorConfig, PolicyLossConfig
    from verl.workers.utils.losses import ppo_loss

    monkeypatch.setenv(verl_plugin.ETA_ENV, "1.0")
    n, p_len, t, k = 8, 2, 5, 4
    gen = torch.Generator().manual_seed(1)
    resp_len = torch.tensor([1, 5, 3, 2, 5, 4, 1, 3])
    resp_mask = (torch.arange(t)[None] < resp_len[:, None]).long()
    token_rewards = torch.zeros(n, t)
    token_rewards[torch.arange(n), resp_len - 1] = torch.tensor([1.0, 0, 0, 1, 1, 1, 0, 1])
    adv = core_algos.get_adv_estimator_fn("tpo")(token_level_rewards=token_rewards, response_mask=resp_mask.float(),
                                                 index=np.repeat(["a", "b"], k))[0]
    full = -torch.rand(n, p_len + t, generator=gen)
    ent_full = torch.rand(n, p_len + t, generator=gen)
    old, ref = -torch.rand(n, t, generator=gen), -torch.rand(n, t, generator=gen)

    def nested(x):
        return torch.cat([x[i, : p_len + resp_len[i]] for i in range(n)])

    def shifted(x):  # response token j sits at model position p_len - 1 + j
        return torch.stack([torch.nn.functional.pad(x[i, p_len - 1: p_len - 1 + resp_len[i]], (0, t - resp_len[i]))
                            for i in range(n)])

    def run(use_kl, ent_coeff):
        cfg = ActorConfig(strategy="fsdp", rollout_n=k, ppo_micro_batch_size_per_gpu=k, loss_agg_mode=agg,
                          policy_loss=PolicyLossConfig(loss_mode="tpo"), use_kl_loss=use_kl, kl_loss_coef=0.3,
                          kl_loss_type="low_var_kl", entropy_coeff=ent_coeff)
        data = TensorDict({"prompts": torch.ones(n, p_len, dtype=torch.long),
                           "responses": torch.ones(n, t, dtype=torch.long),
                           "attention_mask": torch.cat([torch.ones(n, p_len, dtype=torch.long), resp_mask], 1),
                           "response_mask": resp_mask, "old_log_probs": old, "advantages": adv,
                           "ref_log_prob": ref}, batch_size=[n])
        tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(resp_mask.sum()), global_batch_size=n)
        out = {"log_probs": nested(full)}
        if ent_coeff:
            out["entropy"] = nested(ent_full)
        return ppo_loss(cfg, out, data)[0]

    m = resp_mask.float()
    per_token = (lambda x: (x * m).sum(-1)) if agg == "seq-mean-token-sum" else (lambda x: (x * m).sum(-1) / m.sum(-1))
    kl_tok = core_algos.kl_penalty(shifted(full), ref, "low_var_kl")
    kl_expected = per_token(kl_tok).mean()  # mean over the 8 responses of the per-response sum / mean
    ent_expected = per_token(shifted(ent_full)).mean()
    for name, value in (("kl", kl_expected), ("entropy", ent_expected)):  # verl's agg_loss agrees
        mat = kl_tok if name == "kl" else shifted(ent_full)
        torch.testing.assert_close(core_algos.agg_loss(mat, m, agg, global_batch_size=n), value)
    base = run(False, 0.0)
    torch.testing.assert_close(run(True, 0.0) - base, 0.3 * kl_expected)
    torch.testing.assert_close(run(False, 0.2) - base, -0.2 * ent_expected)
    if agg == "seq-mean-token-sum":  # the sum grows with length: a long response weighs its whole KL
        assert kl_expected > (kl_tok * m).sum() / m.sum()


@pytest.mark.parametrize("task", ["gsm8k", "graph_color", "knights_knaves"])
def test_prepare_data_writes_verls_parquet_layout(task, tmp_path, request):
    from targetpo.integrations.verl_rewards import compute_score

    args = [task, "--out", str(tmp_path), "--train", "3", "--test", "2"]
    if task == "gsm8k":
        args += ["--gsm8k-dir", str(request.getfixturevalue("gsm8k_dir"))]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(RECIPES / "prepare_data.py"), *args],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for split, size in (("train", 3), ("test", 2)):
        table = pd.read_parquet(tmp_path / f"{split}.parquet")
        assert len(table) == size
        assert {"data_source", "prompt", "ability", "reward_model", "extra_info"} <= set(table.columns)
        row = table.iloc[0]
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert row["reward_model"]["style"] == "rule" and row["extra_info"]["split"] == split
        truth = row["reward_model"]["ground_truth"]
        assert compute_score(row["data_source"], "no answer", truth) == 0.0
        if task == "gsm8k":
            assert compute_score(row["data_source"], f"<answer>{truth}</answer>", truth) == 1.0
        if task == "knights_knaves":  # the gold answer scores 1
            assert compute_score(row["data_source"], f"<answer>{truth}</answer>", truth) == 1.0


@pytest.mark.parametrize("args, message", [
    (["gsm8k"], "gsm8k needs --gsm8k-dir DIR"),
    (["gsm8k", "--gsm8k-dir", "{missing}"], "has no train.jsonl or test.jsonl"),
    (["gsm8k", "--gsm8k-dir", "{gsm8k}", "--train", "100000"], "holds only 7473 problems"),
    (["graph_color", "--train", "0"], "--train must be at least 1, got 0"),
    (["knights_knaves", "--test", "-3"], "--test must be at least 1, got -3"),
])
def test_prepare_data_refuses_bad_arguments_before_writing(args, message, tmp_path, request):
    if "{gsm8k}" in args:
        args = [str(request.getfixturevalue("gsm8k_dir")) if a == "{gsm8k}" else a for a in args]
    args = [str(tmp_path / "nowhere") if a == "{missing}" else a for a in args]
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, str(RECIPES / "prepare_data.py"), *args, "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"prepare_data.py: error: {proc.stderr.split('error: ', 1)[1].strip()}"]
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("line, why", [('{"q": 1}', "lacks 'question'"), ("not json", "not valid JSON"),
                                       ('["q", "a"]', "not a JSON object"), ('{"question": "q", "answer": "5"}', "####")])
def test_gsm8k_rows_name_the_file_and_line_of_a_malformed_row(line, why, tmp_path):
    from targetpo.integrations import verl_rewards

    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "x #### 5"}\n\n' + line + "\n")
    with pytest.raises(ValueError, match=rf"train\.jsonl:3: .*{why}"):
        verl_rewards.gsm8k_rows(tmp_path, "train")
    if why == "####":  # the data script says it in one line, before writing
        (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "x #### 5"}\n')
        proc = subprocess.run([sys.executable, str(RECIPES / "prepare_data.py"), "gsm8k", "--gsm8k-dir", str(tmp_path),
                               "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "train.jsonl:3:" in proc.stderr.strip().splitlines()[-1] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("call", [lambda f, d: f.gsm8k_rows(d, "train", limit=0),
                                  lambda f, d: f.gsm8k_rows(d, "train", limit=2.0),
                                  lambda f, d: f.reasoning_gym_rows("graph_color", 0, 0, "train")])
def test_row_builders_refuse_counts_below_one(call, tmp_path):
    from targetpo.integrations import verl_rewards

    with pytest.raises(ValueError, match="must be"):
        call(verl_rewards, tmp_path)  # checked before any file is read


def script_runs(script):
    """The overrides of each verl run a launch script makes (its DRY_RUN output), one list per run."""
    proc = subprocess.run(["bash", str(RECIPES / script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DRY_RUN": "1", "MODEL": "Qwen/Qwen3-1.7B", "DATA": "/data"})
    assert proc.returncode == 0, proc.stderr
    runs = [block.strip().splitlines() for block in proc.stdout.split("--- run") if block.strip()]
    return runs


@pytest.mark.parametrize("script", SCRIPTS)
def test_launch_scripts_compose_with_verls_config_and_pair_grpo_with_tpo(script, monkeypatch):
    import types

    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    # verl's validate_config looks up vLLM's allowed LoRA ranks in its vLLM rollout package, which imports vLLM.
    lora_ranks = []
    pkg = types.ModuleType("verl.workers.rollout.vllm_rollout")
    pkg.__path__ = []
    utils = types.ModuleType("verl.workers.rollout.vllm_rollout.utils")
    utils.get_vllm_max_lora_rank = lora_ranks.append
    monkeypatch.setitem(sys.modules, pkg.__name__, pkg)
    monkeypatch.setitem(sys.modules, utils.__name__, utils)
    runs = script_runs(script)
    assert len(runs) == 2
    grpo, tpo = (compose_verl(r) for r in runs)
    for cfg in (grpo, tpo):
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)  # verl's own validation
        assert actor.optim.lr == 1e-5 and cfg.actor_rollout_ref.rollout.n == 16
        assert cfg.data.train_batch_size == 16 and cfg.trainer.n_gpus_per_node == 4
        assert cfg.trainer.get("use_v1") is True and cfg.trainer.v1.trainer_mode == "tpo_sync"
        assert cfg.actor_rollout_ref.model.path == "Qwen/Qwen3-1.7B"
        verl_trainer.check_config(cfg)
    assert grpo.algorithm.adv_estimator == "grpo" and tpo.algorithm.adv_estimator == "tpo"
    assert tpo.actor_rollout_ref.actor.policy_loss.loss_mode == "tpo" and tpo.tpo.eta == 1.0
    differ = {o.split("=", 1)[0] for o in set(runs[0]) ^ set(runs[1])}
    assert differ == {"algorithm.adv_estimator", "actor_rollout_ref.actor.policy_loss.loss_mode", "+tpo.eta",
                      "trainer.experiment_name"}
    gsm8k = script == "run_gsm8k.sh"
    assert tpo.actor_rollout_ref.model.lora_rank == (32 if gsm8k else 0)
    assert tpo.actor_rollout_ref.actor.use_kl_loss is gsm8k
    assert lora_ranks == ([32, 32] if gsm8k else [])
    if gsm8k:
        assert tpo.actor_rollout_ref.actor.kl_loss_coef == 1e-3
    assert Path(tpo.reward.custom_reward_function.path) == RECIPES / "app_g_reward.py"


@pytest.mark.slow  # a fresh interpreter imports verl (and ray)
def test_launcher_refuses_a_group_splitting_config_before_starting_anything(tmp_path):
    """`python -m targetpo.integrations.verl_trainer` validates at step 0, before Ray or any model."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "targetpo.integrations.verl_trainer", *TPO_LAYOUT,
                           "actor_rollout_ref.actor.shuffle=True", "trainer.v1.trainer_mode=sync"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)  # hydra's outputs/
    # a refusal is the message and exit 2, not Hydra's "Error executing job with overrides: [...]", a traceback and 1
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "python -m targetpo.integrations.verl_trainer: error: TPO cannot run with these verl settings" in proc.stderr
    assert "trainer.v1.trainer_mode=tpo_sync" in proc.stderr and "actor_rollout_ref.actor.shuffle" in proc.stderr
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr
    assert "ray.init" not in proc.stderr.lower()  # failed in validation, not in Ray


@pytest.mark.slow  # a fresh interpreter imports verl
# `verl` first: tests/integrations/test_verl_plugin.py::test_entry_point_is_discoverable_and_import_verl_alone_registers_tpo
@pytest.mark.parametrize("first", ["targetpo.integrations.verl_trainer", "targetpo.integrations.verl_plugin"])
def test_the_tpo_trainer_is_registered_whichever_module_is_imported_first(first):
    """Importing verl_trainer first (a user's own driver) imported verl_plugin, whose registration imported the
    half-loaded verl_trainer: "could not register ... circular import", and no tpo_sync trainer."""
    code = (f"import {first}\nimport targetpo.integrations.verl_trainer\n"
            "from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY\nprint('tpo_sync' in TRAINER_REGISTRY)")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "True", proc.stderr[-2000:]
    assert "could not register" not in proc.stderr


def test_launcher_hands_a_valid_config_with_eta_to_verls_main(tmp_path, monkeypatch):
    import verl.trainer.main_ppo as verl_main

    seen = {}

    def fake_main(config):  # stands in for verl's main_ppo body (Ray, GPUs)
        seen["config"], seen["env"] = config, os.environ.get(verl_plugin.ETA_ENV)

    monkeypatch.setattr(verl_main.main, "__wrapped__", fake_main)
    registered = []  # the real one needs verl's TransferQueue, not installed for the CPU tests
    monkeypatch.setattr(verl_trainer, "register_tpo_trainer", lambda: registered.append(True))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(verl_plugin.ETA_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", ["verl_trainer", *TPO_LAYOUT, "+tpo.eta=0.3"])
    verl_trainer.main()
    cfg = seen["config"]
    assert seen["env"] == "0.3" and cfg.ray_kwargs.ray_init.runtime_env.env_vars[verl_plugin.ETA_ENV] == "0.3"
    assert cfg.trainer.v1.trainer_mode == "tpo_sync" and cfg.tpo.eta == 0.3 and registered == [True]


TRAINER_PROBE = r'''
import importlib.machinery, os, sys, types

class _Any:
    def __init__(self, *a, **k): pass
    def __getattr__(self, n):
        if n.startswith("__"): raise AttributeError(n)
        return _Any
    def __call__(self, *a, **k): return _Any()

def _getattr(n):
    if n.startswith("__"): raise AttributeError(n)
    return _Any

# verl's v1 trainer imports its rollout/serving stack at module level; none of it runs here.
for name in ("transfer_queue", "cachetools", "uvicorn", "fastapi"):
    m = types.ModuleType(name)
    m.__file__, m.__path__, m.__spec__ = "<stub>", [], importlib.machinery.ModuleSpec(name, None)
    m.__getattr__ = _getattr
    sys.modules[name] = m

import verl  # the plugin sees transfer_queue and registers tpo_sync
from hydra import compose, initialize_config_module
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

cls = TRAINER_REGISTRY["tpo_sync"]
assert issubclass(cls, PPOTrainerSync) and cls.__module__ == "targetpo.integrations.verl_trainer", cls
with initialize_config_module(config_module="verl.trainer.config", version_base=None):
    cfg = compose(config_name="ppo_trainer", overrides=sys.argv[1:] + ["+tpo.eta=0.3"])

class Batch:  # verl's KVBatchMeta interface used by _balance_batch
    def __init__(self, keys, lens):
        self.keys, self.tags = keys, [{"seq_len": n} for n in lens]
    def __len__(self):
        return len(self.keys)
    def reorder(self, order):
        self.keys, self.tags = [self.keys[i] for i in order], [self.tags[i] for i in order]

trainer = cls.__new__(cls)  # no Ray: only the balancing method and verl's own batch-multiple helper
trainer.config, trainer.use_critic, trainer.global_steps = cfg, False, 1
trainer.actor_rollout_wg = types.SimpleNamespace(_dispatch_info={"actor": [0, 1]})
keys = [f"u{g}_{s}_0" for s in range(4) for g in range(4)]
batch, metrics = Batch(keys, [10 + 7 * i for i in range(16)]), {}
out = cls._balance_batch(trainer, batch, metrics)
uids = [k.split("_")[0] for k in out.keys]
assert all(len(set(uids[i:i + 4])) == 1 for i in range(0, 16, 4)) and set(uids[:8]).isdisjoint(uids[8:]), uids
assert any(k.startswith("global_seqlen") for k in metrics), metrics
os.environ["TARGETPO_TPO_ETA"] = "1.0"
try:
    cls(cfg)
except ValueError as e:
    assert "tpo.eta=0.3" in str(e), e
else:
    raise AssertionError("a config whose eta differs from the workers' was accepted")
print("PROBE OK")
'''


@pytest.mark.slow  # a fresh interpreter imports verl's v1 trainer
def test_tpo_sync_trainer_balances_whole_groups_through_verls_own_trainer_class(tmp_path):
    """The registered tpo_sync class on verl's real PPOTrainerSync: _balance_batch with verl's own
    _get_required_batch_multiple, and the η check of its constructor. verl's TransferQueue, cachetools and
    serving modules are stubbed (not installed for the CPU tests; the code under test does not call them)."""
    probe = tmp_path / "probe.py"
    probe.write_text(TRAINER_PROBE)
    proc = subprocess.run([sys.executable, str(probe), *TPO_LAYOUT], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert proc.returncode == 0 and "PROBE OK" in proc.stdout, proc.stderr[-3000:]


def test_the_recommended_sequence_parallel_key_sets_the_data_parallel_size():
    """fsdp_config.ulysses_sequence_parallel_size (verl's key; the actor-level one is deprecated) was not read: 4 GPUs
    with sequence parallel 2 (2 data-parallel ranks) refused a 2-prompt mini-batch as needing a multiple of 4."""
    layout = [o for o in TPO_LAYOUT if not o.startswith(("data.train_batch_size", "actor_rollout_ref.actor.ppo_mini",
                                                          "trainer.n_gpus"))]
    layout += ["data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "trainer.n_gpus_per_node=4"]
    verl_trainer.check_config(compose_verl(layout + ["actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2"]))
    with pytest.raises(ValueError, match="fsdp_config.ulysses_sequence_parallel_size=3: must divide the 4 GPUs"):
        verl_trainer.check_config(compose_verl(layout + ["actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=3"]))


def test_the_tpo_trainer_runs_verls_synchronous_paths(monkeypatch):
    """trainer_mode=tpo_sync was copied into self.trainer_mode, and every `== "sync"` test in verl's base class
    then took the async path (ReplayBufferAsync, one prompt per fetch, TransferQueue state in checkpoints)."""
    monkeypatch.setenv(verl_trainer.ETA_ENV, "1.0")
    trainer = verl_trainer.register_tpo_trainer()(compose_verl(TPO_LAYOUT))  # builds on the CPU, nothing started
    assert trainer.trainer_mode == "sync" and type(trainer.replay_buffer).__name__ == "ReplayBuffer"


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
    monkeypatch.delenv(verl_plugin.ETA_ENV, raising=False)
    with pytest.raises(ValueError, match="tpo.eta=1.0 but the Ray workers' TARGETPO_TPO_ETA=None"):
        verl_trainer.register_tpo_trainer()(compose_verl(TPO_LAYOUT))
