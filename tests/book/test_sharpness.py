"""explr.book.sharpness: the Hessian's top eigenvalue by Lanczos and by power iteration, against
known spectra, a dense Hessian and the c⁻² scaling along a ray of a scale-invariant loss."""
import pytest
import torch

from explr.book.sharpness import power_iteration, top_eigenvalue
from flow_problems import invariant_problem, quadratic_problem

pytestmark = pytest.mark.usefixtures("one_thread")


def test_sharpness_scales_like_inverse_square_along_a_ray(digits64):
    p = invariant_problem(digits64, n=64, hidden=3)
    theta = p.theta0
    base = top_eigenvalue(p, theta)
    for c in (0.5, 3.0):
        assert top_eigenvalue(p, c * theta) == pytest.approx(base / c**2, rel=1e-8)

def test_power_iteration_and_top_eigenvalue_against_known_spectra():
    p, _ = quadratic_problem([-5.0, 3.0, 1.0, 0.5, -0.2, 0.1])
    res = power_iteration(p, p.theta0, tol=1e-12)
    assert res.converged and res.eigenvalue == pytest.approx(-5.0, rel=1e-9) and res.norm == pytest.approx(5.0, rel=1e-9)
    assert top_eigenvalue(p, p.theta0) == pytest.approx(3.0, rel=1e-8)
    tie, _ = quadratic_problem([-4.0, 4.0, 1.0, 0.3])        # ±λ tie: the Rayleigh quotient cannot settle
    res = power_iteration(tie, tie.theta0, iters=200)
    assert res.norm == pytest.approx(4.0, rel=1e-9)
    assert top_eigenvalue(tie, tie.theta0) == pytest.approx(4.0, rel=1e-8)
    one, _ = quadratic_problem([2.5])                      # too small for ARPACK: the dense Hessian
    assert top_eigenvalue(one, one.theta0) == pytest.approx(2.5, rel=1e-12)
    with pytest.raises(ValueError, match="iters"):
        power_iteration(p, p.theta0, iters=0)
    with pytest.raises(ValueError, match="tol"):
        top_eigenvalue(p, p.theta0, tol=0)


@pytest.mark.slow
def test_power_iteration_matches_the_dense_hessian_of_a_network(digits64):
    p = invariant_problem(digits64, n=64, hidden=3)
    theta = p.theta0
    dense = torch.stack([p.hvp(theta, e) for e in torch.eye(p.n, dtype=torch.float64)])
    assert torch.allclose(dense, dense.T, atol=1e-12)
    eig = torch.linalg.eigvalsh((dense + dense.T) / 2)
    assert top_eigenvalue(p, theta) == pytest.approx(eig[-1].item(), rel=1e-7)
    assert power_iteration(p, theta).norm == pytest.approx(eig.abs().max().item(), rel=1e-6)
