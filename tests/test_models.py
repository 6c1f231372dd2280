"""explr.models.PreResNet: depth, the scale-invariant mode, BN statistics under rescaling."""

import pytest
import torch
import torch.nn.functional as F

from explr.invariance import check_scale_invariance
from explr.models import PreResNet, rescale_running_statistics

from cifar10_helpers import tiny_arrays, tiny_npz

pytestmark = pytest.mark.usefixtures("one_thread")
arrays = pytest.fixture(tiny_arrays, scope="module", name="arrays")
npz = pytest.fixture(tiny_npz, scope="module", name="npz")


@pytest.mark.parametrize("depth", [8, 20, 32])
def test_preresnet_has_depth_weighted_layers_and_the_invariant_mode_freezes_bn_and_fc(depth):
    model = PreResNet(depth, seed=0)
    convs3 = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)]
    assert len(convs3) + 1 == depth  # 6n + 1 convolutions and the linear layer
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d) for n in [n + ".weight"]}
    assert all(not p.requires_grad for p in model.fc.parameters())
    ordinary = PreResNet(depth, invariant=False, seed=0)
    assert all(p.requires_grad for p in ordinary.parameters())
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_preresnet_rejects_bad_depth():
    for bad in (21, 2, 32.0, True, "32"):
        with pytest.raises(ValueError, match=rf"^depth = {bad!r}: must be 6n \+ 2 with n >= 1 \(8, 14, "):
            PreResNet(bad)


def test_invariant_preresnet_is_jointly_scale_invariant_and_bn_stats_follow_rescaling():
    torch.manual_seed(0)  # 8×8 inputs (the network pools globally): float64 convolutions are slow on a CPU
    x, y = torch.randn(16, 3, 8, 8, dtype=torch.float64), torch.randint(0, 10, (16,))
    model = PreResNet(8, eps=1e-300, seed=0).double()
    rows = check_scale_invariance(model, F.cross_entropy, x, y, scales=(0.1, 10.0), rtol=1e-10)
    assert rows[-1].group == "all trainable" and rows[-1].invariant and rows[-1].grad_alignment < 1e-10
    ordinary = PreResNet(8, eps=1e-300, invariant=False, seed=0).double()
    assert not check_scale_invariance(ordinary, F.cross_entropy, x, y, scales=(0.1, 10.0), rtol=1e-6)[-1].invariant
    # eval mode uses running statistics: they must be rescaled with θ to keep the function
    for _ in range(3):
        model(x)  # fill the running statistics
    model.eval()
    before = model(x)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.mul_(7.0)
    stale = model(x)
    rescale_running_statistics(model, 7.0)
    torch.testing.assert_close(model(x), before, rtol=1e-10, atol=1e-10)
    assert (stale - before).abs().max() > 1e-3
