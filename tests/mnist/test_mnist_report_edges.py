"""The MNIST report on hand-made runs whose verdicts and cells are known in advance, and the data and stream
checks at their edges (a label of 10, a test file of exactly 8,000 digits, the fingerprint's reach)."""

import gzip
import struct
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from targetpo.mnist import bandit, train
from targetpo.mnist import data as mnist_data
from targetpo.report import Section, Verdict
from targetpo.runs.store import Run

SEEDS = 3
NOISE = np.array([0.0, 1e-4, -1e-4])  # paired gaps with a small spread (a t-interval needs one)


def _run(tmp_path, curves: dict[str, list], eval_every=200):
    """A cpu-preset MNIST run: curves {method: [per-point seed values or a scalar]} evaluated every `eval_every`
    updates (labels i·eval_every, as the paper's)."""
    n = len(next(iter(curves.values())))
    records = []
    for i in range(n):
        rec = {"unit": train.UNIT, "step": (i + 1) * eval_every, "label": i * eval_every}
        for m, points in curves.items():
            rec[f"{m}.error"] = list(np.broadcast_to(np.asarray(points[i], dtype=float), (SEEDS,)))
        records.append(rec)
    cfg = {"methods": list(curves), "seeds": SEEDS, "seed": 0, "steps": n * eval_every, "batch": 32, "lr": 1e-3,
           "hidden": 100, "eta": 1.0, "eval_every": eval_every}
    run = Run(tmp_path, {"preset": "cpu", "experiment": "mnist", "config": cfg, "status": "complete"}, records)
    section = Section("t", run, tmp_path)
    train.report(run, section)
    return run, section


def _verdicts(section) -> dict[str, Verdict | None]:
    return {c.text.split(" (")[0].split(":")[0]: c.verdict for c in section.claims}


def _text(section) -> str:
    return "\n".join(section.blocks)


def test_a_run_with_the_papers_ordering_passes_its_claims_and_fills_its_cells(tmp_path):
    tpo = np.array([0.02, 0.03, 0.04])
    final = {"ce": tpo - 0.01 + NOISE, "tpo": tpo, "dg": tpo + 0.03 + NOISE, "pg": tpo + 0.022 - NOISE,
             "grpo": tpo + 0.072 + NOISE, "group_pg": tpo + 0.04 + NOISE}
    run, section = _run(tmp_path, {m: [0.5, v] for m, v in final.items()})
    v = _verdicts(section)
    assert v["TPO has the lowest final error of the bandit methods"] is Verdict.PASS
    assert v["removing target matching hurts"] is Verdict.PASS
    assert v["TPO reaches 5 % test error before DG"] is Verdict.PASS
    assert v["single-sample GRPO performs comparably to PG"] is Verdict.FAIL  # 5 points apart
    text = _text(section)
    tpo_row = next(line for line in text.splitlines() if line.startswith("| TPO |"))
    cells = [c.strip() for c in tpo_row.split("|")[1:-1]]
    assert cells[1].startswith("3.00")        # the final evaluation's mean, not the one before
    assert cells[2].startswith("1.00")        # TPO − CE, paired, in points: above the oracle
    assert cells[3] == "3.0 [2.0, 4.0]"       # median [min, max]
    assert train.summary(run).startswith("final test error: CE (oracle) 2.0 %")


def test_the_5_percent_race_counts_a_method_that_never_gets_there_as_last(tmp_path):
    _, section = _run(tmp_path, {"tpo": [0.5, 0.2, 0.1, 0.1], "dg": [0.5, 0.2, 0.04, 0.03]})
    assert _verdicts(section)["TPO reaches 5 % test error before DG"] is not Verdict.PASS
    _, section = _run(tmp_path, {"tpo": [0.5, 0.2, 0.04, 0.03], "dg": [0.5, 0.2, 0.04, 0.03]})
    assert _verdicts(section)["TPO reaches 5 % test error before DG"] is not Verdict.PASS  # a tie is not before


def test_first_at_or_below_includes_the_threshold():
    assert train.first_at_or_below(np.array([0, 200]), np.array([0.06, 0.05]), 0.05) == 200
    assert train.first_at_or_below(np.array([0, 200]), np.array([0.06, 0.051]), 0.05) is None


def test_seed_values_start_at_the_configured_seed():
    assert train.seed_values(SimpleNamespace(seed=3, seeds=2)) == [3, 4]


def test_a_table_has_one_delimiter_cell_per_column(tmp_path):
    run = Run(tmp_path, {"preset": "cpu", "experiment": "mnist", "config": {"seeds": 1}}, [])
    section = Section("t", run, tmp_path)
    section.table(["a", "b"], [[1, 2]])
    assert section.blocks[-1].splitlines()[:3] == ["| a | b |", "|---|---|", "| 1 | 2 |"]


# ----------------------------------------------------------------------------- data and streams

def _idx(path, magic, dims, payload: bytes):
    path.write_bytes(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload)


def test_a_label_of_10_is_refused(tmp_path):
    _idx(tmp_path / "labels", mnist_data.LABELS_MAGIC, [3], bytes([0, 9, 10]))
    with pytest.raises(ValueError, match="label 10 outside 0..9"):
        mnist_data.read_labels(tmp_path / "labels")
    _idx(tmp_path / "ok", mnist_data.LABELS_MAGIC, [2], bytes([0, 9]))
    assert mnist_data.read_labels(tmp_path / "ok").tolist() == [0, 9]


def test_a_test_file_of_exactly_8000_digits_cannot_be_split(tmp_path):
    n = mnist_data.SPLIT_TRAIN
    with gzip.open(tmp_path / "t10k-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", mnist_data.IMAGES_MAGIC, n, 28, 28) + bytes(n * 784))
    with gzip.open(tmp_path / "t10k-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", mnist_data.LABELS_MAGIC, n) + bytes(n))
    with pytest.raises(ValueError, match="needs more than 8,000"):
        mnist_data.load(tmp_path)


def _data(protocol="official", **changes):
    base = dict(train_x=torch.zeros(3, 784), train_y=torch.tensor([0, 1, 2]), test_x=torch.zeros(2, 784),
                test_y=torch.tensor([3, 4]), dataset="mnist", protocol=protocol, directory=mnist_data.Path("/d"))
    return mnist_data.MnistData(**(base | changes))


def test_the_fingerprint_covers_every_array_and_the_description_its_counts():
    fps = {_data().fingerprint, _data(test_y=torch.tensor([3, 5])).fingerprint,
           _data(train_y=torch.tensor([0, 1, 3])).fingerprint, _data(test_x=torch.ones(2, 784)).fingerprint}
    assert len(fps) == 4
    assert "3 train / 2 test" in _data().description


def test_the_data_and_the_networks_go_to_the_device_asked():
    """What `train` does for `--device cuda` (mnist, mnist-mechanism), checked on the meta device, which every torch
    build has: the four arrays move and nothing else changes; the networks are leaves on that device, drawn on the
    CPU first (so a seed starts from the same weights everywhere), and Adam holds those very tensors."""
    data, moved = _data(), _data().to("meta")
    assert {t.device.type for t in (moved.train_x, moved.train_y, moved.test_x, moved.test_y)} == {"meta"}
    assert (moved.dataset, moved.protocol, moved.directory) == (data.dataset, data.protocol, data.directory)
    assert data.to("cpu").train_x is data.train_x                      # already there: no copy
    cfg = train.Config(seeds=2, steps=20, eval_every=20)
    params, opt = train.init_policies(cfg, 3, "meta", inputs=None)
    on_cpu, _ = train.init_policies(cfg, 3, inputs=None)
    assert [p.shape for p in params] == [p.shape for p in on_cpu]
    assert all(p.device.type == "meta" and p.is_leaf and p.requires_grad for p in params)
    assert all(a is b for a, b in zip(opt.param_groups[0]["params"], params, strict=True))


def test_the_test_split_of_the_shared_data_is_pinned(mnist_dir):
    """The seeded 8,000 / 2,000 split every cpu number was computed on (a changed split seed moves them all)."""
    d = mnist_data.load(mnist_dir)
    assert d.protocol == "test-split" and (len(d.train_y), len(d.test_y)) == (8000, 2000)
    assert d.train_y[:10].tolist() == [1, 7, 7, 5, 9, 1, 8, 6, 7, 8]


def test_batch_indices_reach_the_last_example_and_streams_differ():
    idx, _ = bandit.BatchStream([0], 3, 1000).next()
    assert idx.max().item() == 2 and idx.min().item() == 0
    a, b = bandit.seed_generators([0], 0)[0], bandit.seed_generators([0], 1)[0]
    assert not torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))


def test_a_numpy_bool_is_a_point_estimate_verdict(tmp_path):
    _, section = _run(tmp_path, {"tpo": [0.5, 0.03], "dg": [0.5, 0.06]})
    section.claim("a claim decided on point estimates", np.bool_(True), "evidence")
    assert section.claims[-1].interval is False and section.claims[-1].verdict is Verdict.PASS


# ----------------------------------------------------------------------------- train's records and GRPO's seeds

def test_train_logs_the_mean_reward_per_update_and_the_unclamped_test_error(logged):
    """With a learning rate of 1e-12 the policy stays at its initial weights, so (i) the logged reward of an
    evaluation is the mean over its `eval_every` updates of the batch-mean reward, whose expectation is
    mean_n π(y_n | x_n) over the training set (batches are uniform with replacement), and (ii) test labels chosen
    as (argmax + 1) mod 10 make every greedy answer wrong: an error of exactly 1."""
    g = torch.Generator().manual_seed(0)
    cfg = train.Config(seeds=2, steps=40, eval_every=20, batch=100, lr=1e-12, methods=["pg"])
    params, _ = train.init_policies(cfg, 1, inputs=None)
    train_x, test_x = torch.rand(300, 784, generator=g), torch.rand(50, 784, generator=g)
    train_y = torch.randint(0, 10, (300,), generator=g)
    greedy = train.test_probs(params, test_x, 1).argmax(-1)                    # [S, 1, T]
    test_y = (greedy[0, 0] + 1) % 10
    data = _data(train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y)
    train.train(cfg, data, logged)
    records = logged.records
    assert [r["step"] for r in records] == [20, 40] and [r["label"] for r in records] == [0, 20]
    assert records[-1]["pg.error"][0].item() == 1.0                            # seed 0: every answer wrong
    expected = train.test_probs(params, train_x, 1)[:, 0].gather(-1, train_y.expand(2, -1).unsqueeze(-1)).mean((1, 2))
    for r in records:                                                           # 2,000 samples: s.e. ≈ 0.007
        assert r["pg.reward"].shape == (2,) and ((r["pg.reward"] - expected).abs() < 0.04).all()


def test_single_sample_grpo_standardizes_each_seeds_batch_on_its_own():
    """Seed 0's loss gradient must not depend on seed 1's rewards (each seed's batch is its own group)."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 8, 10, generator=g)
    actions = torch.randint(0, 10, (2, 8), generator=g)
    labels = actions.clone()
    labels[0, ::2] = (labels[0, ::2] + 1) % 10                                  # seed 0: half right

    def grad_seed0(labels_seed1):
        x = logits.clone().requires_grad_(True)
        lab = torch.stack([labels[0], labels_seed1])
        bandit.bandit_loss("grpo", x, actions, lab, bandit.log_softmax(x.detach())).backward()
        return x.grad[0]

    all_right, one_right = actions[1].clone(), (actions[1] + 1) % 10
    one_right[0] = actions[1, 0]
    assert torch.allclose(grad_seed0(all_right), grad_seed0(one_right), atol=1e-7)
    assert grad_seed0(all_right).abs().sum() > 0
