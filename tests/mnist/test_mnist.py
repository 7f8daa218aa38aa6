"""MNIST: the IDX loader, the batched policy bank, each method's MNIST loss against the App. C closed forms,
and smoke runs of the three MNIST experiments on the real test digits."""

import dataclasses
import gzip
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from targetpo.mnist.mlp import bank_forward, bank_forward_shared, init_bank, network_params
from targetpo.objectives.tpo import one_hot_lambda
from targetpo.runs.data import MissingDataError
from targetpo.mnist import data as D
from targetpo.mnist import bandit as MB


# ----------------------------------------------------------------------------- synthetic IDX files

def idx_bytes(arr: np.ndarray, magic: int | None = None) -> bytes:
    magic = magic if magic is not None else (0x0800 | arr.ndim)
    head = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    return head + arr.astype(np.uint8).tobytes()


def write_split(directory, split, n, *, gz=True, seed=0, images=None, labels=None):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, 28, 28)) if images is None else images
    y = rng.integers(0, 10, n) if labels is None else labels
    for kind, arr in (("images", x), ("labels", y)):
        name = D.FILES[f"{split}_{kind}"]
        data = arr if isinstance(arr, bytes) else idx_bytes(arr)
        if gz:
            (directory / (name + ".gz")).write_bytes(gzip.compress(data, compresslevel=1))
        else:
            (directory / name).write_bytes(data)
    return x, y


def test_loader_official_protocol_reads_values_exactly(tmp_path):
    x, y = write_split(tmp_path, "train", 30, gz=True)
    xt, yt = write_split(tmp_path, "test", 12, gz=False, seed=1)
    data = D.load(tmp_path)
    assert data.protocol == "official" and data.train_x.shape == (30, 784) and data.test_x.shape == (12, 784)
    assert data.train_x.dtype == torch.float32 and data.train_y.dtype == torch.int64
    torch.testing.assert_close(data.train_x, torch.tensor(x.reshape(30, 784) / 255.0, dtype=torch.float32))
    assert data.test_y.tolist() == yt.tolist()
    assert "official split" in data.description


def test_loader_test_only_uses_fixed_seeded_split(tmp_path):
    _, y = write_split(tmp_path, "test", 10_000, gz=False)
    a, b = D.load(tmp_path), D.load(tmp_path)
    assert a.protocol == "test-split" and len(a.train_y) == 8000 and len(a.test_y) == 2000
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)  # fixed split
    # A partition of the 10,000 test images: every label count is preserved.
    both = torch.cat([a.train_y, a.test_y]).bincount(minlength=10)
    assert both.tolist() == np.bincount(y, minlength=10).tolist()
    assert "TEST SPLIT ONLY" in a.description and "8,000 train / 2,000 test" in a.description


@pytest.mark.parametrize("case, match", [
    ("truncated", "truncated"), ("truncated_gzip", "truncated or not a gzip"), ("wrong_magic", "magic number 2049"),
    ("mismatched", "10 images but .* 9 labels"), ("bad_label", "label 12 outside"), ("no_labels", "not t10k-labels"),
    ("trailing", "trailing bytes"), ("wrong_shape", r"shape \(28, 27\)"),
])
def test_loader_rejects_broken_files(tmp_path, case, match):
    good = np.zeros((10, 28, 28), dtype=np.uint8)
    img_name, lab_name = D.FILES["test_images"], D.FILES["test_labels"]
    (tmp_path / img_name).write_bytes(idx_bytes(good))
    (tmp_path / lab_name).write_bytes(idx_bytes(np.zeros(10)))
    if case == "truncated":
        (tmp_path / img_name).write_bytes(idx_bytes(good)[:-100])
    elif case == "truncated_gzip":
        (tmp_path / img_name).unlink()
        (tmp_path / (img_name + ".gz")).write_bytes(gzip.compress(idx_bytes(good))[:-30])
    elif case == "wrong_magic":
        (tmp_path / img_name).write_bytes(idx_bytes(good.reshape(-1), magic=2049)[:8] + good.tobytes())
    elif case == "mismatched":
        (tmp_path / lab_name).write_bytes(idx_bytes(np.zeros(9)))
    elif case == "bad_label":
        (tmp_path / lab_name).write_bytes(idx_bytes(np.full(10, 12)))
    elif case == "no_labels":
        (tmp_path / lab_name).unlink()
        with pytest.raises(MissingDataError, match="lacks"):  # no test labels: nothing to evaluate on
            D.load(tmp_path)
        (tmp_path / lab_name).write_bytes(idx_bytes(np.zeros(10)))
        (tmp_path / D.FILES["train_images"]).write_bytes(idx_bytes(good))  # train images, no train labels
        match = "not train-labels"
    elif case == "trailing":
        (tmp_path / img_name).write_bytes(idx_bytes(good) + b"\0")
    elif case == "wrong_shape":
        (tmp_path / img_name).write_bytes(idx_bytes(np.zeros((10, 28, 27), dtype=np.uint8)))
    with pytest.raises(ValueError, match=match):
        D.load(tmp_path)


def test_loader_missing_data_says_how_to_provide_it(tmp_path, monkeypatch):
    monkeypatch.delenv("TARGETPO_MNIST_DIR", raising=False)
    with pytest.raises(MissingDataError, match="--data-dir DIR.*TARGETPO_MNIST_DIR.*--download"):
        D.load(None)
    with pytest.raises(MissingDataError, match="does not exist"):
        D.load(tmp_path / "nope")
    (tmp_path / "afile").write_text("")
    with pytest.raises(MissingDataError, match="afile is a file, not a directory"):
        D.check_available(tmp_path / "afile", "mnist")
    with pytest.raises(MissingDataError, match="lacks t10k-images"):
        D.load(tmp_path)
    assert isinstance(MissingDataError("x"), FileNotFoundError)
    write_split(tmp_path, "test", 9001)
    monkeypatch.setenv("TARGETPO_MNIST_DIR", str(tmp_path))  # the environment variable is a data dir too
    assert len(D.load(None).test_y) == 1001
    with pytest.raises(ValueError, match="dataset must be one of"):
        D.load(tmp_path, "cifar")


def test_fashion_mnist_reads_its_own_environment_variable_as_the_help_says(tmp_path, monkeypatch, capsys):
    from targetpo.cli import build_parser

    monkeypatch.delenv("TARGETPO_FASHION_MNIST_DIR", raising=False)
    hint = D.how_to_provide("fashion-mnist")
    assert "TARGETPO_FASHION_MNIST_DIR=DIR" in hint and "shared/data/mnist" not in hint  # no MNIST folder offered
    write_split(tmp_path, "test", 9001)
    monkeypatch.setenv("TARGETPO_FASHION_MNIST_DIR", str(tmp_path))
    assert D.check_available(None, "fashion-mnist") == tmp_path
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "fashion-mnist defaults to $TARGETPO_FASHION_MNIST_DIR" in text
    assert "fashion-mnist: $TARGETPO_FASHION_MNIST_DIR" in text  # the data_dir field of every MNIST experiment


def test_download_verifies_checksums_on_local_files(tmp_path):
    server = tmp_path / "server"
    server.mkdir()
    write_split(server, "test", 9000)
    write_split(server, "train", 20, seed=3)
    sums = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in server.iterdir()}
    dest = D.fetch("mnist", tmp_path / "dl", base_url=server.as_uri(), checksums=sums, quiet=True)
    assert sorted(p.name for p in dest.iterdir()) == sorted(sums)
    assert D.load(dest).protocol == "official"
    bad = dict(sums, **{"t10k-images-idx3-ubyte.gz": "0" * 32})
    with pytest.raises(ValueError, match="MD5 .* does not match"):
        D.fetch("mnist", tmp_path / "dl2", base_url=server.as_uri(), checksums=bad, quiet=True)
    assert not (tmp_path / "dl2" / "t10k-images-idx3-ubyte.gz").exists()
    assert not any(p.name.startswith(".") for p in (tmp_path / "dl2").iterdir())  # no temp file left behind
    assert set(D.MD5["mnist"]) == {f + ".gz" for f in D.FILES.values()}


def test_load_with_download_fills_the_cache_dir(tmp_path, monkeypatch):
    server = tmp_path / "server"
    server.mkdir()
    write_split(server, "test", 9000)
    write_split(server, "train", 20, seed=3)
    monkeypatch.setitem(D.URLS, "mnist", server.as_uri())
    monkeypatch.setitem(D.MD5, "mnist", {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in server.iterdir()})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TARGETPO_MNIST_DIR", raising=False)
    data = D.load(None, "mnist", download=True)
    assert data.directory == tmp_path / "cache" / "targetpo" / "mnist" and data.protocol == "official"
    assert len(data.train_y) == 20 and len(data.test_y) == 9000


def test_loader_reads_the_real_mnist_test_split(mnist_dir):
    data = D.load(mnist_dir)
    counts = torch.cat([data.train_y, data.test_y]).bincount().tolist()
    assert counts == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]  # data/README.md
    assert data.train_x.max() == 1.0 and data.train_x.min() == 0.0


# ----------------------------------------------------------------------------- policy bank

def test_bank_matches_independent_networks_and_shares_init_per_seed():
    gens = MB.seed_generators([4, 7], MB.STREAM_INIT)
    params = init_bank((784, 50, 50, 10), gens, copies=3)
    x = torch.rand(2, 5, 784, dtype=torch.float32)
    out = bank_forward(params, x, 3)
    shared = bank_forward_shared(params, x[0], 3)
    for s in range(2):
        for m in range(3):
            w1, b1, w2, b2, w3, b3 = network_params(params, s, m, 3)
            ref = torch.relu(torch.relu(x[s] @ w1 + b1) @ w2 + b2) @ w3 + b3
            torch.testing.assert_close(out[s, m], ref)
            torch.testing.assert_close(network_params(params, s, m, 3)[0], network_params(params, s, 0, 3)[0])
    torch.testing.assert_close(shared[0], out[0])
    assert not torch.equal(network_params(params, 0, 0, 3)[0], network_params(params, 1, 0, 3)[0])
    # Lecun normal: truncated at 2σ with variance 1/fan_in; zero biases.
    w1 = network_params(params, 0, 0, 3)[0]
    assert abs(w1.var().item() * 784 - 1.0) < 0.05 and w1.abs().max() <= 2 * (1 / 28) / 0.8796 + 1e-6
    assert all(float(p.detach().abs().sum()) == 0 for p in params[1::2])
    # A seed's weights depend only on its seed value, not on which seeds run beside it.
    alone = init_bank((784, 50, 50, 10), MB.seed_generators([7], MB.STREAM_INIT), copies=1)
    torch.testing.assert_close(network_params(alone, 0, 0, 1)[2], network_params(params, 1, 2, 3)[2])


def test_a_network_on_the_inked_pixels_is_the_full_network_on_the_same_data():
    """MnistData.inked drops the pixels blank in every image, train and test; init_bank(inputs=) keeps the rows of W1
    the full network draws for the rest. The two compute the same logits on every image the data holds, get the
    same gradients for the kept weights (the blank pixels' rows get exactly zero: Adam leaves them where they
    started), and so train to the same weights, up to the rounding of the first layer's shorter sums."""
    from targetpo.mnist import train as T

    g = torch.Generator().manual_seed(0)
    blank = torch.zeros(784, dtype=torch.bool)
    blank[torch.randperm(784, generator=g)[:120]] = True
    train_x, test_x = torch.rand(40, 784, generator=g), torch.rand(12, 784, generator=g)
    train_x[:, blank], test_x[:, blank] = 0.0, 0.0
    test_x[3, 17 if not blank[17] else 18] = 0.0  # a pixel blank in one image only stays
    data = D.MnistData(train_x, torch.randint(0, 10, (40,), generator=g), test_x,
                       torch.randint(0, 10, (12,), generator=g), "mnist", "test-split", Path("."))
    inked = data.inked()
    assert torch.equal(inked.pixels, (~blank).nonzero().squeeze(1)) and inked.inked() is inked
    assert torch.equal(inked.train_x, train_x[:, ~blank]) and torch.equal(inked.test_x, test_x[:, ~blank])
    assert inked.train_x.is_contiguous() and data.pixels is None

    methods = list(T.METHODS)
    gens = lambda: MB.seed_generators([0, 1], MB.STREAM_INIT)  # noqa: E731
    full = init_bank((784, 8, 8, 10), gens(), copies=len(methods))
    part = init_bank((784, 8, 8, 10), gens(), copies=len(methods), inputs=inked.pixels)
    assert torch.equal(part[0], full[0][:, ~blank]) and all(torch.equal(a, b) for a, b in zip(part[1:], full[1:]))
    idx = torch.randint(0, 40, (2, 16), generator=g)
    noise = torch.rand(2, 16, generator=g)
    torch.testing.assert_close(T.test_probs(part, inked.test_x, len(methods)),
                               T.test_probs(full, data.test_x, len(methods)))
    nets = []
    for params, d in ((full, data), (part, inked)):
        params = [p.detach().clone().requires_grad_(True) for p in params]
        opt = torch.optim.Adam(params, lr=1e-2)
        for _ in range(3):
            T.bandit_step(params, opt, methods, *T.gather_batch(d, idx), noise, eta=0.7)
        nets.append(params)
    (f, p) = nets
    assert torch.equal(f[0][:, blank], full[0][:, blank])           # the blank pixels' weights never moved
    torch.testing.assert_close(p[0], f[0][:, ~blank], rtol=1e-4, atol=1e-5)
    for a, b in zip(p[1:], f[1:]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"inputs must be ascending indices in \[0, 784\)"):
        init_bank((784, 8, 10), gens(), 1, inputs=torch.tensor([3, 2]))
    with pytest.raises(ValueError, match=r"inputs must be ascending indices in \[0, 784\), one or more; got \[0, 784\]"):
        init_bank((784, 8, 10), gens(), 1, inputs=torch.tensor([0, 784]))
    with pytest.raises(ValueError, match=r"got 10 values, \[9, 8, 7, 6\] …"):
        init_bank((784, 8, 10), gens(), 1, inputs=torch.arange(9, -1, -1))
    blank_data = dataclasses.replace(data, train_x=torch.zeros(40, 784), test_x=torch.zeros(12, 784))
    assert torch.equal(blank_data.inked().pixels, torch.arange(784))    # no ink anywhere: every pixel stays


def test_the_stacked_update_is_each_methods_loss_on_its_own_logits_bit_for_bit():
    """forward_losses hands every method its slice of the stacked logits (one unbind, one backward node): the loss
    and every parameter's gradient are those of the per-method sum written out with indexing, bit for bit."""
    from targetpo.mnist import train as T

    methods = list(T.METHODS)
    x, y = torch.rand(2, 16, 784), torch.randint(0, 10, (2, 16), generator=torch.Generator().manual_seed(3))
    noise = torch.rand(2, 16, generator=torch.Generator().manual_seed(4))
    grads = []
    for stacked in (True, False):
        params = init_bank((784, 8, 8, 10), MB.seed_generators([0, 1], 0), copies=len(methods))
        if stacked:
            loss, actions = T.forward_losses(params, methods, x, y, noise, eta=0.7)
        else:
            logits = bank_forward(params, x, len(methods))
            logp = MB.log_softmax(logits.detach())
            actions = MB.sample_actions(logp.exp(), noise.unsqueeze(1))
            loss = sum(MB.bandit_loss(m, logits[:, i], actions[:, i], y, logp[:, i], eta=0.7)
                       for i, m in enumerate(methods))
        loss.backward()
        grads.append((loss.detach(), actions, [p.grad for p in params]))
    (l1, a1, g1), (l2, a2, g2) = grads
    assert torch.equal(l1, l2) and torch.equal(a1, a2)
    assert all(torch.equal(u, v) for u, v in zip(g1, g2)) and all(u.abs().sum() > 0 for u in g1)


def test_per_network_gradients_are_independent():
    params = init_bank((784, 8, 8, 10), MB.seed_generators([0, 1], 0), copies=2)
    x = torch.rand(2, 4, 784, dtype=torch.float32)
    out = bank_forward(params, x, 2)
    out[1, 0].sum().backward()  # only network (seed 1, copy 0)
    g = [p.grad for p in params]
    assert g[0][0].abs().sum() == 0 and g[0][1, :, 8:].abs().sum() == 0 and g[0][1, :, :8].abs().sum() > 0
    assert g[2][[0, 1, 3]].abs().sum() == 0 and g[2][2].abs().sum() > 0


def test_streams_and_action_sampling():
    a = MB.BatchStream([3, 5], 1000, 7)
    b = MB.BatchStream([5], 1000, 7)
    for _ in range(150):  # crosses a block boundary
        (ia, na), (ib, nb) = a.next(), b.next()
        assert torch.equal(ia[1], ib[0]) and torch.equal(na[1], nb[0])
    probs = torch.tensor([[0.2, 0.5, 0.3]]).expand(200_000, 3)
    acts = MB.sample_actions(probs, torch.rand(200_000, generator=torch.Generator().manual_seed(0)))
    freq = acts.bincount(minlength=3).double() / 200_000
    torch.testing.assert_close(freq, torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64), atol=4e-3, rtol=0)
    assert MB.sample_actions(torch.tensor([0.5, 0.5]), torch.tensor(0.9999999)).item() == 1


# ----------------------------------------------------------------------------- losses vs App. C closed forms

def expected_descent(method: str, logits: torch.Tensor, y: int, eta: float = 1.0) -> torch.Tensor:
    """E_a[−∇_logits loss] by enumerating all 10 actions, each weighted by π(a) (float64)."""
    c = logits.shape[-1]
    z = logits.expand(c, c).clone().requires_grad_(True)  # row a: the same context, action a
    actions = torch.arange(c)
    labels = torch.full((c,), y)
    old = torch.log_softmax(logits, -1).expand(c, c)
    loss = MB.bandit_loss(method, z[None], actions[None], labels[None], old[None], eta=eta)
    loss.backward()
    per_action = -z.grad * c  # the loss averages the c rows
    return (torch.softmax(logits, -1)[:, None] * per_action).sum(0)


@pytest.mark.parametrize("method", ["ce", "pg", "group_pg", "dg", "tpo", "reinforce", "pg_is", "ppo"])
@pytest.mark.parametrize("eta", [1.0, 0.5, 1e-3])  # 1e-3: λ = e^3333, beyond a float (the closed forms take 1/λ)
def test_each_mnist_loss_matches_appendix_c_in_expectation(method, eta):
    gen = torch.Generator().manual_seed(11)
    for trial in range(6):
        logits = (torch.randn(10, generator=gen, dtype=torch.float64) * (0.5 + trial))
        y = trial % 10
        got = expected_descent(method, logits, y, eta)
        closed = "pg" if method in ("pg_is", "ppo") else method  # on-policy: ratio 1, PPO's clip is inactive
        want = MB.expected_update(closed, torch.softmax(logits, -1), torch.tensor(y), eta)
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-10)


def test_appendix_c_special_values():
    probs = torch.softmax(torch.randn(5, 10, dtype=torch.float64), -1)
    y = torch.arange(5)
    pg = MB.expected_update("pg", probs, y)
    torch.testing.assert_close(MB.expected_update("group_pg", probs, y), 6.0 * pg)  # Group PG = 6·PG
    assert abs(one_hot_lambda(10) - math.exp(10 / 3)) < 1e-12
    # On the symmetric policy (wrong mass spread evenly) the exact and the scalar gains coincide.
    p = torch.tensor([0.05, 0.3, 0.7], dtype=torch.float64)
    sym = ((1 - p) / 9)[:, None].expand(3, 10).clone()
    sym[:, 0] = p
    for m in ("pg", "dg", "tpo", "group_pg", "ce"):
        exact, scalar = MB.first_order_gains(m, sym, torch.zeros(3, dtype=torch.long))
        torch.testing.assert_close(exact, scalar)
    # Concentrating the wrong mass on one class raises TPO's exact gain above the scalar one.
    conc = torch.tensor([[0.1, 0.85] + [0.05 / 8] * 8], dtype=torch.float64)
    exact, scalar = MB.first_order_gains("tpo", conc, torch.tensor([0]))
    assert exact.item() > scalar.item() > 0
    c = MB.concentration(conc, torch.tensor([0]))
    assert abs(c.item() - 0.85 / 0.9) < 1e-12


def test_grpo_standardizes_within_each_seed_batch():
    logp = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    r = (torch.rand(3, 8) < 0.5).double()
    r[:, 0], r[:, 1] = 1.0, 0.0
    from targetpo.objectives import batch_standardized_pg_loss as bs

    got = bs(logp, r).loss
    want = sum(bs(logp[i], r[i]).loss for i in range(3)) / 3
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError, match="batches of >= 2"):
        bs(torch.zeros(3, 1), torch.zeros(3, 1))


def test_staleness_losses_use_the_behaviour_policy():
    """pg_is carries π_θ(a)/π_b(a); TPO's target is anchored on the behaviour probabilities."""
    torch.manual_seed(3)
    logits = torch.randn(1, 4, 10, dtype=torch.float64, requires_grad=True)
    beh = torch.log_softmax(torch.randn(1, 4, 10, dtype=torch.float64), -1)
    a, y = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 0, 3, 0]])
    MB.bandit_loss("pg_is", logits, a, y, beh).backward()
    g_is = logits.grad.clone()
    logits.grad = None
    MB.bandit_loss("reinforce", logits, a, y, beh).backward()
    ratio = (torch.log_softmax(logits, -1) - beh).exp().gather(-1, a[..., None]).detach()
    torch.testing.assert_close(g_is, logits.grad * ratio)
    logits.grad = None
    MB.bandit_loss("tpo", logits, a, y, beh).backward()
    adv = (a == y).double() - beh.exp().square().sum(-1)
    u = torch.where(torch.nn.functional.one_hot(a, 10).bool(), torch.where(adv[..., None] > 0, 3.0, -3.0),
                    torch.where(adv[..., None] > 0, -1 / 3, 1 / 3))
    q = torch.softmax(beh + u, -1)
    torch.testing.assert_close(logits.grad, (torch.softmax(logits, -1) - q).detach() / 4)


def test_staleness_baseline_and_anchor_can_be_the_learners():
    """baseline_logp sets the Σπ² of every method's advantage, anchor_logp TPO's p_old; the ratio of pg_is
    stays against the behaviour policy."""
    torch.manual_seed(4)
    logits = torch.randn(1, 4, 10, dtype=torch.float64, requires_grad=True)
    beh = torch.log_softmax(torch.randn(1, 4, 10, dtype=torch.float64), -1)
    own = torch.log_softmax(logits.detach(), -1)
    a, y = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 0, 3, 0]])
    adv = (a == y).double() - own.exp().square().sum(-1)
    MB.bandit_loss("pg_is", logits, a, y, beh, baseline_logp=own).backward()
    ratio = (own - beh).exp().gather(-1, a[..., None]).squeeze(-1)
    lp = torch.log_softmax(logits, -1).gather(-1, a[..., None]).squeeze(-1)
    want = torch.autograd.grad(-(ratio * adv * lp).mean(), logits)[0]
    torch.testing.assert_close(logits.grad, want)
    logits.grad = None
    MB.bandit_loss("tpo", logits, a, y, beh, baseline_logp=own, anchor_logp=own).backward()
    u = torch.where(torch.nn.functional.one_hot(a, 10).bool(), torch.where(adv[..., None] > 0, 3.0, -3.0),
                    torch.where(adv[..., None] > 0, -1 / 3, 1 / 3))
    q = torch.softmax(own + u, -1)
    torch.testing.assert_close(logits.grad, (torch.softmax(logits, -1) - q).detach() / 4)
    # The default is still the behaviour policy for both.
    logits.grad = None
    MB.bandit_loss("tpo", logits, a, y, beh).backward()
    assert not torch.allclose(logits.grad, (torch.softmax(logits, -1) - q).detach() / 4)


# ----------------------------------------------------------------------------- experiments (real digits)

def metric_lines(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_mnist_smoke_run_report_and_determinism(tmp_path, mnist_dir):
    from targetpo.experiments import run_experiment
    from targetpo.report import write_report

    run_dir = run_experiment("mnist", "smoke", out=tmp_path / "a", progress=False, quiet=True, threads=1,
                             overrides=[f"data_dir={mnist_dir}"])
    meta = json.loads((run_dir / "run.json").read_text())
    assert "TEST SPLIT ONLY" in meta["data_source"] and "8,000 train / 2,000 test" in meta["data_source"]
    recs = [r for r in metric_lines(run_dir) if "step" in r]
    assert [r["step"] for r in recs] == [20, 40, 60, 80, 100] and [r["label"] for r in recs] == [0, 20, 40, 60, 80]
    first, last = recs[0], recs[-1]
    for m in ("ce", "pg", "dg", "tpo", "grpo", "group_pg"):
        assert len(last[f"{m}.error"]) == 2
    # Learning happens: the oracle and TPO beat chance (90 % error) well within 100 updates.
    assert max(last["ce.error"]) < 0.3 and max(last["tpo.error"]) < 0.5
    assert np.mean(last["tpo.error"]) < np.mean(first["tpo.error"])
    text = write_report(run_dir).read_text()
    assert "TEST SPLIT ONLY" in text and "mnist_error.png" in text and (run_dir / "mnist_error.png").exists()
    # The protocol text says "every 200 steps" (the paper's); the run's own grid is stated beside it.
    assert "**This run:** 100 steps, batch 100, Adam(0.001), hidden 50, η = 1, greedy test error every 20 steps" in text
    assert "TPO reaches 5 % test error before DG" in text
    # Neither reaches 5 % in 100 updates: the evidence says so instead of a lead of "0 [0, 0]" or nothing.
    assert "neither reaches it in this run" in text and "no level reached by both in this run" in text
    assert "(bootstrap):  |" not in text
    # Same seed + config -> identical metrics; a seed's results do not depend on the seeds beside it.
    short = [f"data_dir={mnist_dir}", "steps=40"]
    b, c, d = (run_experiment("mnist", "smoke", out=tmp_path / n, progress=False, quiet=True, threads=1, overrides=o)
               for n, o in (("b", short), ("c", short), ("d", short + ["seeds=1"])))
    rb, rc, rd = metric_lines(b), metric_lines(c), metric_lines(d)
    assert rb == rc and rb[:2] == [r for r in metric_lines(run_dir) if "step" in r][:2]
    assert [r["tpo.error"][0] for r in rb if "step" in r] == [r["tpo.error"][0] for r in rd if "step" in r]


def test_cli_data_flags(tmp_path, monkeypatch, capsys):
    from targetpo.cli import main

    monkeypatch.delenv("TARGETPO_MNIST_DIR", raising=False)
    assert main(["run", "tabular-single", "--preset", "smoke", "--data-dir", "x", "--out", str(tmp_path / "t")]) == 2
    assert "reads no external data set" in capsys.readouterr().err
    assert main(["run", "mnist", "--preset", "smoke", "--out", str(tmp_path / "m"), "--no-progress"]) == 2
    assert "--data-dir DIR" in capsys.readouterr().err
    # reproduce without data: loud, and the report lists the experiment as not run with the command to run it.
    assert main(["reproduce", "--only", "mnist", "--preset", "smoke", "--out", str(tmp_path / "r"),
                 "--no-progress"]) == 0
    assert "mnist NOT RUN" in capsys.readouterr().err
    report = (tmp_path / "r" / "REPORT.md").read_text()
    hint = f"targetpo reproduce --out {tmp_path / 'r'} --only mnist --preset smoke --data-dir DIR"  # the same folder
    assert "**NOT RUN.**" in report and hint in report


def test_mnist_mechanism_smoke(tmp_path, mnist_dir):
    from targetpo.experiments import run_experiment
    from targetpo.report import write_report

    run_dir = run_experiment("mnist-mechanism", "smoke", out=tmp_path / "m", progress=False, quiet=True, threads=1,
                             overrides=[f"data_dir={mnist_dir}", "steps=60", "checkpoint_label=20"])
    recs = [r for r in metric_lines(run_dir) if "step" in r]
    last = recs[-1]
    for m in ("pg", "group_pg"):  # exactly scalar: no surplus (NaN only where a bin is empty)
        v = np.array(last[f"{m}.surplus"], dtype=float)
        assert np.all(np.abs(v[np.isfinite(v)]) < 1e-12)
    assert np.all(np.isnan(np.array(last["grpo.surplus"], dtype=float)))
    # The bins count exactly the misclassified test images (2,000 of them in the test split).
    for m in ("pg", "dg", "tpo", "grpo", "group_pg"):
        counts = np.array(last[f"{m}.count"]).sum(-1)
        np.testing.assert_allclose(counts, np.array(last[f"{m}.error"]) * 2000, atol=1e-6)
    tpo = np.nanmean(np.array(last["tpo.surplus"], dtype=float), 0)
    assert tpo[-1] > tpo[0] and tpo[-1] > 0  # TPO gains most where the wrong mass is concentrated
    text = write_report(run_dir).read_text()
    assert "label 20 (measured after 40 updates)" in text and "mnist_mechanism.png" in text
    assert "| [0.75, 1] |" in text and "[0.75, 1.01]" not in text  # the concentration c is at most 1
    assert "above the CE oracle" not in text  # CE is not among this experiment's methods
    table = text.split("| concentration bin |", 1)[1].split("\n\n", 1)[0]
    assert "nan" not in table.lower()  # an empty bin reads '– (n=0)' in every column


def test_mnist_staleness_smoke(tmp_path, mnist_dir):
    from targetpo.experiments import run_experiment
    from targetpo.report import write_report

    run_dir = run_experiment("mnist-staleness", "smoke", out=tmp_path / "s", progress=False, quiet=True, threads=1,
                             overrides=[f"data_dir={mnist_dir}", "steps=40", "delays=0,1000"])
    recs = [r for r in metric_lines(run_dir) if "step" in r]
    assert [r["step"] for r in recs] == [20, 40]
    for r in recs:
        # D = 0: REINFORCE, PG (IS) and PPO are the same update (ratio 1), so their runs coincide exactly.
        assert r["reinforce.error.D0"] == r["pg_is.error.D0"] == r["ppo.error.D0"]
        # D >= steps: every batch is acted by θ_0, the same for every method (same init and noise), so the
        # actors' rewards coincide across methods while the learners differ.
        assert r["reinforce.reward.D1000"] == r["tpo.reward.D1000"] == r["dg.reward.D1000"] == r["ppo.reward.D1000"]
    assert recs[-1]["tpo.error.D1000"] != recs[-1]["reinforce.error.D1000"]
    assert recs[-1]["tpo.reward.D0"] != recs[-1]["reinforce.reward.D0"]
    text = write_report(run_dir).read_text()
    assert "D=1000" in text and "REINFORCE collapses" in text and "mnist_staleness.png" in text


@pytest.mark.parametrize("reference", ["learner", "behaviour"])
def test_staleness_actor_uses_the_parameters_from_d_updates_ago(mnist_dir, reference):
    """The queue formulation against a direct one that keeps every parameter snapshot θ_0, θ_1, ...; the
    baseline and TPO's anchor come from the learner (default) or the behaviour snapshot."""
    from dataclasses import replace

    from targetpo.mnist import train as E
    from targetpo.mnist import staleness as ST

    cfg = replace(ST.PRESETS["smoke"], seeds=1, steps=6, eval_every=3, delays=(0, 2, 4), lr=0.05,
                  methods=("reinforce", "tpo"), data_dir=str(mnist_dir), baseline=reference, anchor=reference)

    class Ctx:
        records = []

        def log(self, r):
            self.records.append({k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in r.items()})

        def advance(self, n):
            pass

        def check_finite(self, step, values):
            pass

        def set_data_source(self, s, fingerprint=None):
            pass

    ctx = Ctx()
    ST.run_unit(cfg, ST.UNIT, ctx)

    data = D.load(mnist_dir).inked()
    groups, per = len(cfg.delays), len(cfg.methods)
    params, opt = E.init_policies(cfg, groups * per, inputs=data.pixels)
    stream = MB.BatchStream(E.seed_values(cfg), len(data.train_y), cfg.batch)
    batches = [stream.next() for _ in range(cfg.steps)]
    history = [[p.detach().clone() for p in params]]  # history[k] = θ_k
    want = []
    for t in range(1, cfg.steps + 1):
        idx, noise = batches[t - 1]
        x, y = E.gather_batch(data, idx)
        loss = 0
        logits = bank_forward(params, x, groups * per).view(1, groups, per, cfg.batch, 10)
        rewards = []
        for g, d in enumerate(cfg.delays):
            theta = history[max(t - 1 - d, 0)]
            with torch.no_grad():
                beh = MB.log_softmax(bank_forward(ST.group_params(theta, g, groups, per), x, per))
            acts = MB.sample_actions(beh.exp(), noise.unsqueeze(1))
            rewards.append((acts == y[:, None]).float().mean(-1))
            for i, m in enumerate(cfg.methods):
                ref = MB.log_softmax(logits[:, g, i].detach()) if reference == "learner" else beh[:, i]
                loss = loss + MB.bandit_loss(m, logits[:, g, i], acts[:, i], y, beh[:, i], eta=cfg.eta,
                                             baseline_logp=ref, anchor_logp=ref)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append([p.detach().clone() for p in params])
        want.append(torch.stack(rewards, 1))  # [1, G, K]
    for k, rec in enumerate(ctx.records):
        block = torch.stack(want[3 * k: 3 * k + 3]).mean(0)
        for g, d in enumerate(cfg.delays):
            for i, m in enumerate(cfg.methods):
                assert rec[f"{m}.reward.D{d}"] == pytest.approx([block[0, g, i].item()], abs=1e-6), (k, m, d)
    probs = E.test_probs(params, data.test_x, groups * per)
    err = (probs.argmax(-1) != data.test_y).float().mean(-1).view(1, groups, per)
    for g, d in enumerate(cfg.delays):
        for i, m in enumerate(cfg.methods):
            assert ctx.records[-1][f"{m}.error.D{d}"] == pytest.approx(err[:, g, i].tolist(), abs=1e-6)
    # The delays matter: a stale actor chose different actions than a fresh one.
    assert ctx.records[-1]["tpo.reward.D0"] != ctx.records[-1]["tpo.reward.D4"]


def test_a_failed_download_leaves_no_run_folder(tmp_path, monkeypatch, capsys):
    """`run mnist --download` failed inside the run: its folder said "generated (no external data)" and blocked
    the retry with --data-dir ("already holds a run", then "download: stored True" on --resume)."""
    from targetpo.cli import main

    monkeypatch.setitem(D.URLS, "mnist", (tmp_path / "no-server").as_uri())  # nothing to fetch there
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TARGETPO_MNIST_DIR", raising=False)
    out = tmp_path / "run"
    assert main(["run", "mnist", "--preset", "smoke", "--download", "--out", str(out), "--no-progress"]) == 2
    assert "targetpo: error:" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("name, override", [("mnist-replay", "is_clips=1,1.000001"),
                                            ("mnist-friction", "flip_fractions=0.3,0.3000001")])
def test_list_values_that_share_a_name_are_refused(name, override):
    """Both items were named tpo_is1 (flip0.3): one condition's metrics overwrote the other's, and the run exited 0."""
    from targetpo.experiments import load
    from targetpo.runs.config import make_config

    with pytest.raises(ValueError, match="must be written with at most 6 significant digits"):
        make_config(load(name), "smoke", overrides=[override])


@pytest.mark.parametrize("methods, expected", [
    ("klinf", "must be one of"),                  # refused only inside the run, after the folder was written
    ("alpha1e-320", "must be one of"),            # a denormal α: NaN probabilities at step 0, the run failed
    ("alpha0.5,alpha0.50", "'alpha0.50' is the same setting as 'alpha0.5'"),  # one setting run twice
])
def test_mnist_projection_settings_are_checked_like_the_token_ones(methods, expected):
    from targetpo.experiments import load
    from targetpo.runs.config import make_config

    with pytest.raises(ValueError, match=expected):
        make_config(load("mnist-projections"), "smoke", overrides=[f"methods={methods}"])


def test_group_pg_at_an_eta_adam_cannot_hold_is_refused_before_the_run(tmp_path, capsys):
    """eta=1e-24: Group PG's u/η gradient overflowed Adam's float32 second moment, so its weights never moved and
    it 'completed' at the untrained 90 % error. TPO and DG at the same η are fine, so only Group PG is refused."""
    from targetpo.cli import main

    out = tmp_path / "run"
    code = main(["run", "mnist", "--preset", "smoke", "--out", str(out), "--no-progress", "methods=group_pg,tpo",
                 "eta=1e-24"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and "eta=1e-24 with method group_pg: below 1e-15" in err[0], err
    assert not out.exists()


def test_a_folder_of_mnist_digits_is_not_run_as_fashion_mnist(tmp_path, capsys, mnist_dir):
    """`--dataset fashion-mnist` on the MNIST files trained on digits and labelled every number Fashion-MNIST."""
    import shutil

    from targetpo.cli import main

    code = main(["run", "mnist", "--preset", "smoke", "--dataset", "fashion-mnist", "--data-dir", str(mnist_dir),
                 "--out", str(tmp_path / "r"), "--no-progress"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and "holds mnist, not fashion-mnist" in err[0], err
    assert not (tmp_path / "r").exists()
    raw = tmp_path / "raw"  # the same labels uncompressed are recognised too; a user's own labels are not
    raw.mkdir()
    for f in mnist_dir.glob("t10k-*"):
        (raw / f.name.removesuffix(".gz")).write_bytes(gzip.decompress(f.read_bytes()))
    assert D.official_dataset_of(raw / "t10k-labels-idx1-ubyte") == "mnist"
    mine = tmp_path / "mine"
    shutil.copytree(raw, mine)
    labels = bytearray((mine / "t10k-labels-idx1-ubyte").read_bytes())
    labels[8] = (labels[8] + 1) % 10  # one label changed: no longer the official file
    (mine / "t10k-labels-idx1-ubyte").write_bytes(bytes(labels))
    assert D.official_dataset_of(mine / "t10k-labels-idx1-ubyte") is None
    assert D.check_available(mine, "fashion-mnist") == mine


def test_a_checkpoint_the_run_cannot_reach_is_refused_before_it_starts(tmp_path, capsys):
    """checkpoint_label=10000 on a 100-step run ran, and the report quietly read label 80 instead."""
    from targetpo.cli import main

    code = main(["run", "mnist-mechanism", "--preset", "smoke", "checkpoint_label=10000", "--data-dir",
                 str(tmp_path), "--out", str(tmp_path / "r"), "--no-progress"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1, err
    assert "checkpoint_label=10000: is measured after 10,020 updates, more than steps=100" in err[0]
    assert not (tmp_path / "r").exists()


def test_every_mnist_experiment_runs_without_onednn():
    """With 2 threads 2 of 16 identical mnist-staleness runs took another numerical path (oneDNN); 24 of 24 agree
    with it off. The wrapper turns it off for the unit only, whatever else the flags hold."""
    from targetpo.experiments import EXPERIMENTS, load
    from targetpo.mnist.train import without_onednn

    mkldnn = torch.backends.mkldnn
    before = (mkldnn.enabled, mkldnn.deterministic, mkldnn.allow_tf32, mkldnn.fp32_precision)
    assert without_onednn(lambda: mkldnn.enabled)() is False
    assert (mkldnn.enabled, mkldnn.deterministic, mkldnn.allow_tf32, mkldnn.fp32_precision) == before
    mnist = [n for n, module in EXPERIMENTS.items() if module.startswith("targetpo.mnist.")]
    assert len(mnist) == 6
    for name in mnist:
        assert getattr(load(name).run_unit, "__wrapped__", None) is not None, name
