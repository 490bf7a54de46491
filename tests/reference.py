"""The single-device reference the parallel-training tests compare with: loss and gradients
of the whole batch on one device (grad_accum=1), and the comparison itself."""

import jax
import numpy as np

from shardkit.strategies import DataParallel


def single_device(trainer_for, batch):
    """(loss, gradients) of `batch` for `trainer_for(DataParallel(), devices=[one])`."""
    one = trainer_for(DataParallel(), devices=jax.devices()[:1])
    state = one.init(0)
    (loss, _), grads = one.loss_and_grads(state.params, one.place_batch(batch))
    return float(loss), jax.device_get(grads)


def assert_equal_to(reference, loss, grads, *, rtol=2e-5):
    """Loss to 1e-6 and every gradient leaf to `rtol` (float32 sums in another order)."""
    ref_loss, ref_grads = reference
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-6)
    flat_ref = dict(jax.tree_util.tree_leaves_with_path(ref_grads))
    for path, g in jax.tree_util.tree_leaves_with_path(jax.device_get(grads)):
        np.testing.assert_allclose(g, flat_ref[path], rtol=rtol, atol=1e-7, err_msg=str(path))
