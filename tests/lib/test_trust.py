"""Tests for lib/attnbook/trust.py: the first-use check behind ``backend="auto"``.

The check decides what ``auto`` does on CUDA, and this machine has no GPU. So the CUDA branch
runs with stand-ins: ``cuda_like`` makes CPU tensors that say ``is_cuda`` (``choose_backend``
takes its CUDA branch; the check itself runs on their real device, the CPU), and the registered
``"triton"`` backend is replaced by fakes: one that passes, ones that fail to compile or run out
of shared memory, and deliberately broken kernels, each wrong in one place only (head-dim
padding, rows >= 128, keys >= 128 in the backward, ragged tails, one tile configuration, a
single query, TF32 products). Each is rejected by the check; the first ones are shown to pass the
check as it was before (at a power-of-two head dim and 70 x 53 inputs). The real kernel is
checked at every tile configuration the autotuner can pick, under Triton's interpreter
(``TRITON_INTERPRET=1``, set for the import as in tests/lib/test_triton_flash.py).
"""
import functools
import re
import warnings

import pytest
import torch

import attnbook
from attnbook import attention, attention_tiled, choose_backend, dispatch
from attnbook import trust
from attnbook.testing import import_triton_flash

tf = import_triton_flash()  # TRITON_INTERPRET set for this import only, as in test_triton_flash.py

INTERPRETER = tf.triton is not None and tf._INTERPRETED and not torch.cuda.is_available()
needs_interpreter = pytest.mark.skipif(not INTERPRETER, reason=(
    "needs triton imported under TRITON_INTERPRET=1 (run this file on its own or with TRITON_INTERPRET=1) "
    "on a machine without CUDA"))
OLD_SHAPE = {"the old check's inputs": (2, 2, 70, 53)}  # CHECK_SHAPE before this change


@pytest.fixture(autouse=True)
def _fresh_verdicts(monkeypatch):
    trust.clear_verdicts()
    if INTERPRETER:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield
    trust.clear_verdicts()


@pytest.fixture
def small_shapes(monkeypatch):
    """For tests of the gate's logic (caching, warnings), not of what the check covers: quick shapes."""
    monkeypatch.setattr(trust, "CHECK_SHAPES", {"small": (1, 2, 20, 13), "one query": (1, 2, 1, 13)})


class CudaLike(torch.Tensor):
    """A CPU tensor that says it is on CUDA: ``auto`` takes its CUDA branch on a machine without a GPU."""

    @property
    def is_cuda(self):
        return True


def cuda_like(*shape, dtype=torch.float32, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).as_subclass(CudaLike).requires_grad_(grad)


def qkv_like(d=64, dv=None, tq=9, tk=9, dtype=torch.float32, grad=False):
    return (cuda_like(1, 2, tq, d, dtype=dtype, grad=grad), cuda_like(1, 2, tk, d, dtype=dtype, seed=1, grad=grad),
            cuda_like(1, 2, tk, dv or d, dtype=dtype, seed=2, grad=grad))


def _plain(*ts):
    return tuple(None if t is None else t.as_subclass(torch.Tensor) for t in ts)


def exact(q, k, v, mask, causal, scale):
    q, k, v, mask = _plain(q, k, v, mask)
    return attention_tiled(q, k, v, mask=mask, causal=causal, scale=scale).out


class FakeTriton:
    """A stand-in for the registered "triton" kernel: exact (attention_tiled) unless told otherwise."""

    def __init__(self, fail=None, forward_factor=1.0, grad_factor=1.0):
        self.fail, self.forward_factor, self.grad_factor, self.calls = fail, forward_factor, grad_factor, 0

    def __call__(self, q, k, v, mask, causal, scale):
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return _ScaleGrad.apply(exact(q, k, v, mask, causal, scale) * self.forward_factor, self.grad_factor, 0)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by ``factor`` (rows >= ``first_row`` only)."""

    @staticmethod
    def forward(ctx, out, factor, first_row):
        ctx.factor, ctx.first_row = factor, first_row
        return out.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        grad[..., ctx.first_row:, :] *= ctx.factor
        return grad, None, None


def install(monkeypatch, fake):
    monkeypatch.setitem(dispatch.BACKENDS, "triton", dispatch.Backend(fake, lambda *a: (True, "")))
    # these tests are about the gate, in float32 (exact fakes); auto's dtype policy
    # (16-bit only) has its own test in test_dispatch.py
    monkeypatch.setattr(dispatch, "AUTO_TRITON_DTYPES", (torch.float16, torch.bfloat16, torch.float32))
    return fake


def auto_choices(*calls):
    """choose_backend for each (q, k, v, mask, causal); return the choices and the RuntimeWarnings raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        choices = [choose_backend(q, k, v, mask, causal=causal) for q, k, v, mask, causal in calls]
    return choices, [w for w in caught if issubclass(w.category, RuntimeWarning)]


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------

def test_check_key_names_the_kind_with_the_callers_head_dims():
    q, k, v = qkv_like(d=40, dv=20, grad=True)
    key = trust.check_key(q, k, v, None, True)
    assert key == ("cpu", torch.float32, 40, 20, True, False, True)  # D itself, not its tile of 64
    with torch.no_grad():  # no graph, no backward
        assert trust.check_key(q, k, v, torch.ones(9, dtype=torch.bool), False)[-2:] == (True, False)


# ---------------------------------------------------------------------------------------------
# The CUDA branch of "auto", with stand-ins
# ---------------------------------------------------------------------------------------------

def test_a_passing_kernel_is_trusted_and_checked_once_per_kind(monkeypatch, small_shapes):
    fake = install(monkeypatch, FakeTriton())
    q, k, v = qkv_like()
    choices, warned = auto_choices((q, k, v, None, False), (q, k, v, None, False))
    assert choices == ["triton", "triton"] and not warned
    assert fake.calls == 2  # once per check shape (forward only), then cached
    (key, verdict), = trust.verdicts().items()
    assert key == trust.check_key(q, k, v, None, False) and verdict.ok and verdict.reason == ""
    attention(q, k, v)  # attention(..., backend="auto") itself runs the kernel that passed
    assert fake.calls > 2


@pytest.mark.parametrize("error, words", [
    (type("CompilationError", (Exception,), {})("at 12:8: unsupported tl.dot shape"), "failed to compile"),
    (type("OutOfResources", (Exception,), {})("out of resource: shared memory, Required: 131072, "
                                              "Hardware limit: 65536"), "no configuration fits this GPU"),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), "raised an error"),
])
def test_a_kernel_that_raises_warns_once_then_tiled(monkeypatch, error, words, small_shapes):
    install(monkeypatch, FakeTriton(fail=error))
    q, k, v = qkv_like()
    choices, warned = auto_choices(*[(q, k, v, None, True)] * 3)
    assert choices == ["tiled"] * 3
    assert len(warned) == 1, [str(w.message) for w in warned]
    message = str(warned[0].message)
    assert words in message and type(error).__name__ in message and "first-use self-check" in message
    assert "causal" in message and "float32" in message and "head dim 64" in message and "'tiled'" in message
    assert warned[0].filename == __file__  # points at the caller's line, not at the library


def test_a_kernel_that_disagrees_warns_once_then_tiled(monkeypatch, small_shapes):
    install(monkeypatch, FakeTriton(forward_factor=1 + 1e-3))  # 0.1% off: far above float32 rounding
    q, k, v = qkv_like()
    choices, warned = auto_choices((q, k, v, None, False), (q, k, v, None, False))
    assert choices == ["tiled", "tiled"] and len(warned) == 1
    assert "disagree with attention_ref" in str(warned[0].message) and "out: max error" in str(warned[0].message)
    # control: the same check passes a kernel that is off by float32 rounding only
    trust.clear_verdicts()
    install(monkeypatch, FakeTriton(forward_factor=1 + 1e-7))
    assert auto_choices((q, k, v, None, False)) == (["triton"], [])


def test_a_wrong_backward_is_caught_only_when_gradients_are_needed(monkeypatch, small_shapes):
    install(monkeypatch, FakeTriton(grad_factor=1.01))
    q, k, v = qkv_like(grad=True)
    with torch.no_grad():  # inference: the forward is right, so the kernel is trusted
        assert auto_choices((q, k, v, None, False)) == (["triton"], [])
    choices, warned = auto_choices((q, k, v, None, False), (q, k, v, None, False))
    assert choices == ["tiled", "tiled"] and len(warned) == 1 and "dq: max error" in str(warned[0].message)
    with torch.no_grad():  # the forward-only verdict stands
        assert choose_backend(q, k, v, causal=False) == "triton"


def test_a_failed_forward_needs_no_second_check_for_the_backward(monkeypatch, small_shapes):
    fake = install(monkeypatch, FakeTriton(forward_factor=2.0))
    q, k, v = qkv_like(grad=True)
    with torch.no_grad():
        choices, warned = auto_choices((q, k, v, None, False))
    calls = fake.calls
    choices2, warned2 = auto_choices((q, k, v, None, False))
    assert choices == choices2 == ["tiled"] and len(warned) == 1 and not warned2 and fake.calls == calls


def test_verdicts_are_cached_per_kind(monkeypatch, small_shapes):
    install(monkeypatch, FakeTriton())
    mask = torch.ones(9, dtype=torch.bool)
    calls = [qkv_like(d=64) + (None, False), qkv_like(d=64, tq=5, tk=7) + (None, False),  # lengths: one kind
             qkv_like(d=40) + (None, False), qkv_like(d=48) + (None, False),  # D itself (one tile of 64)
             qkv_like(d=64, dv=16) + (None, False),                            # v's head dim
             qkv_like(d=64) + (None, True),                                    # causal
             qkv_like(d=64) + (mask, False),                                   # masked
             qkv_like(d=64, dtype=torch.float16) + (None, False)]              # dtype
    choices, warned = auto_choices(*calls)
    assert choices == ["triton"] * len(calls) and not warned
    assert len(trust.verdicts()) == len(calls) - 1


def test_causal_unknown_checks_both_kinds(monkeypatch, small_shapes):
    install(monkeypatch, FakeTriton())
    q, k, v = qkv_like()
    assert attnbook.choose_backend(q, k, v) == "triton"  # the public helper does not know `causal`
    assert {key[4] for key in trust.verdicts()} == {False, True}


def test_no_check_while_compiling(monkeypatch):
    fake = install(monkeypatch, FakeTriton())
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    q, k, v = qkv_like()
    assert auto_choices((q, k, v, None, False)) == (["tiled"], [])
    assert fake.calls == 0 and not trust.verdicts()  # nothing ran, nothing cached: the next eager call checks


def test_explicit_triton_backend_runs_no_check(monkeypatch):
    error = type("CompilationError", (Exception,), {})("boom")
    fake = install(monkeypatch, FakeTriton(fail=error))
    q, k, v = _plain(*qkv_like())
    with pytest.raises(type(error), match="boom"):
        attention(q, k, v, backend="triton")  # the kernel's own error, not a fallback
    assert fake.calls == 1 and not trust.verdicts()


def test_auto_on_plain_cpu_tensors_never_checks(monkeypatch):
    fake = install(monkeypatch, FakeTriton())
    q = torch.randn(1, 1, 4, 16)
    assert choose_backend(q, q, q) == "tiled" and fake.calls == 0 and not trust.verdicts()


# ---------------------------------------------------------------------------------------------
# Deliberately broken kernels: each is rejected
# ---------------------------------------------------------------------------------------------

def padding_bug(q, k, v, mask, causal, scale):
    """Pads q, k to the kernels' power-of-two head dim with ones instead of zeros: right only when D is one."""
    d = q.shape[-1]
    pad = tf.head_dim_bucket(d) - d
    if pad:
        q, k = (torch.cat([t, torch.ones(*t.shape[:-1], pad, dtype=t.dtype)], -1) for t in (q, k))
    return exact(q, k, v, mask, causal, scale)


def rows_from_128_bug(q, k, v, mask, causal, scale):
    """Right for the first 128 query rows (the first tile); rows >= 128 use the wrong scale."""
    out = exact(q, k, v, mask, causal, scale)
    if q.shape[-2] <= 128:
        return out
    late = exact(q[..., 128:, :], k, v, mask, causal, scale * 1.05)  # (causal rows are shifted: wrong too)
    return torch.cat([out[..., :128, :], late], -2)


def backward_keys_from_128_bug(q, k, v, mask, causal, scale):
    """Right forward; the gradient of v is 1% off for keys >= 128 (a second key tile of dK, dV)."""
    return exact(q, k, _ScaleGrad.apply(v, 1.01, 128), mask, causal, scale)


def ragged_tail_bug(q, k, v, mask, causal, scale):
    """Ignores the keys after the last multiple of 16: right whenever Tk is a multiple of 16."""
    tk = k.shape[-2] // 16 * 16 or k.shape[-2]
    mask = None if mask is None else mask[..., :tk]
    return exact(q, k[..., :tk, :], v[..., :tk, :], mask, causal, scale)


def single_query_bug(q, k, v, mask, causal, scale):
    """Right for every Tq > 1; a single query (decoding) drops the first key."""
    if q.shape[-2] == 1:
        return exact(q, k[..., 1:, :], v[..., 1:, :], None if mask is None else mask[..., 1:], causal, scale)
    return exact(q, k, v, mask, causal, scale)


def tf32_kernel(q, k, v, mask, causal, scale):
    """float32 products with TF32's 10 mantissa bits, as a GPU's tensor cores would give them."""
    def tf32(t):
        return (t.view(torch.int32) & ~0x1FFF).view(torch.float32) if t.dtype == torch.float32 else t
    return exact(tf32(q), tf32(k), tf32(v), mask, causal, scale)


BROKEN = {  # name: (kernel, dtype, D, causal, masked, backward, the old check passed it)
    "head-dim padding": (padding_bug, torch.float32, 80, False, False, False, True),
    "rows >= 128": (rows_from_128_bug, torch.float32, 64, False, False, False, True),
    "backward, keys >= 128": (backward_keys_from_128_bug, torch.float32, 64, True, True, True, True),
    "single query (decoding)": (single_query_bug, torch.float32, 64, False, True, False, True),
    "ragged tail of keys": (ragged_tail_bug, torch.float32, 64, True, False, False, False),
    "TF32 products": (tf32_kernel, torch.float32, 64, False, False, False, False),
}


@functools.lru_cache
def exact_passes(dtype, d, causal, masked, backward):
    """The control of a broken kernel: the exact kernel passes the same check (cached per kind)."""
    return trust.check(exact, "cpu", dtype, d, causal=causal, masked=masked, backward=backward).ok


@pytest.mark.parametrize("name", BROKEN)
def test_a_broken_kernel_is_rejected(name):
    kernel, dtype, d, causal, masked, backward, passed_before = BROKEN[name]
    kind = dict(causal=causal, masked=masked, backward=backward)
    verdict = trust.check({name: kernel}, "cpu", dtype, d, **kind)
    assert not verdict.ok and "disagree with attention_ref" in verdict.reason, verdict
    assert exact_passes(dtype, d, **kind)  # control: the exact kernel passes the same check
    if passed_before:  # the check as it was: 70 x 53 inputs at the power-of-two bucket of D
        assert trust.check(kernel, "cpu", dtype, tf.head_dim_bucket(d), shapes=OLD_SHAPE, **kind).ok


def test_a_kernel_wrong_for_one_tile_config_is_rejected(monkeypatch):
    """The built-in kernel is checked once per tile configuration: one bad config is enough to fail."""
    configs = tf.tile_configs(torch.float16)
    bad = configs[3]
    seen = []

    def kernel(q, k, v, mask, causal, scale, blocks=None):  # stands in for dispatch's built-in _triton
        seen.append(blocks)
        return exact(q, k, v, mask, causal, scale) * (1.01 if blocks == bad else 1.0)

    monkeypatch.setattr(dispatch, "_triton", kernel)
    install(monkeypatch, kernel)
    under_check = dispatch._under_check(torch.float16)
    assert len(under_check) == len(configs) == 5
    verdict = trust.check(under_check, "cpu", torch.float16, 32, shapes={"small": (1, 2, 20, 13)})
    assert not verdict.ok and "tile config 4 of 5" in verdict.reason and "fwd 64x64/4 warps/3 stages" in verdict.reason
    assert seen[-1] == bad  # configs 1-3 passed every shape, then 4 failed
    assert {str(b) for b in seen} == {str(c) for c in configs[:4]}


def test_configs_that_do_not_fit_are_skipped_as_the_autotuner_skips_them(small_shapes):
    too_big = type("OutOfResources", (Exception,), {})("out of resource: shared memory, Required: 196608")

    def does_not_fit(q, k, v, mask, causal, scale):
        raise too_big

    verdict = trust.check({"big tiles": does_not_fit, "small tiles": exact}, "cpu", torch.float32, 16)
    assert verdict.ok and len(verdict.skipped) == 1 and "big tiles" in verdict.skipped[0]
    verdict = trust.check({"big tiles": does_not_fit}, "cpu", torch.float32, 16)
    assert not verdict.ok and "no configuration fits this GPU" in verdict.reason


def test_the_check_runs_in_true_fp32_and_restores_the_callers_setting(small_shapes):
    seen = []

    def spy(q, k, v, mask, causal, scale):
        seen.append((torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32))
        return exact(q, k, v, mask, causal, scale)

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # what many training scripts set: TF32 allowed
    try:
        assert trust.check(spy, "cpu", torch.float32, 16).ok
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
    assert seen and set(seen) == {("highest", False)}


def test_the_check_covers_multi_tile_ragged_shapes_with_the_callers_head_dims():
    seen = []

    def spy(q, k, v, mask, causal, scale):
        seen.append((q.shape, v.shape[-1], mask is not None))
        return exact(q, k, v, mask, causal, scale)

    assert trust.check(spy, "cpu", torch.float32, 80, 24, masked=True).ok
    tq, tk = [s[0][2] for s in seen], [trust.CHECK_SHAPES[n][3] for n in trust.CHECK_SHAPES]
    assert {s[0][-1] for s in seen} == {80} and {s[1] for s in seen} == {24} and all(s[2] for s in seen)
    assert max(tq) >= 128 + 16 and 1 in tq  # a second query tile of 128 rows, and decoding
    for block in (16, 32, 64, 128):  # ragged tails at every tile size, along both axes
        assert any(t % block for t in tq) and any(t % block for t in tk)
    assert any(t % 16 == 0 for t in tq) and any(t % 16 for t in tq)  # Triton specialises on multiples of 16
    seen.clear()
    assert trust.check(spy, "cpu", torch.float32, 8, causal=True, shapes={"a": (1, 1, 20, 13), "b": (1, 1, 1, 13)}).ok
    assert [s[0][2] for s in seen] == [20]  # a single top-left causal query is one-hot: not judged


def test_the_fa_margin_is_smaller_than_one_rounding_step_at_the_largest_magnitude():
    from attnbook.testing import fa_rounding_margin, rounding_step

    r = torch.tensor([0.1, -0.2, 0.05], dtype=torch.float64)
    assert fa_rounding_margin(r, torch.float16) < rounding_step(r, torch.float16) / 2
    assert fa_rounding_margin(torch.zeros(3, dtype=torch.float64), torch.float16) == 0.0


# ---------------------------------------------------------------------------------------------
# The real kernel under the interpreter
# ---------------------------------------------------------------------------------------------

SMALL = {"two query tiles of 128, ragged": (1, 1, 150, 77)}


@needs_interpreter
@pytest.mark.parametrize("dtype, index", [(torch.float16, i) for i in range(5)] + [(torch.float32, 0)],
                         ids=[f"float16-config{i + 1}" for i in range(5)] + ["float32-tile"])
def test_the_real_kernel_passes_at_every_tile_config(dtype, index):
    configs = tf.tile_configs(dtype)
    label, fn = list(dispatch._under_check(dtype).items())[index]
    assert str(configs[index]["fwd"][0]) in label  # the built-in kernel, at that config
    kind = dict(causal=index % 2 == 0, masked=index < 3, backward=index in (0, 4) or dtype == torch.float32)
    verdict = trust.check({label: fn}, "cpu", dtype, 24, 40, shapes=SMALL, **kind)
    assert verdict.ok, verdict.reason


@needs_interpreter
def test_the_real_kernel_with_a_bug_fails_its_check(monkeypatch):
    real = tf._attention_triton

    def off_by_one_key(q, k, v, mask, causal, scale, blocks=None):  # drops the last key
        return real(q, k[:, :, :-1], v[:, :, :-1], None if mask is None else mask[..., :-1], causal, scale, blocks)

    monkeypatch.setattr(tf, "_attention_triton", off_by_one_key)
    label, fn = next(iter(dispatch._under_check(torch.float32).items()))
    verdict = trust.check({label: fn}, "cpu", torch.float32, 16, shapes=SMALL)
    assert not verdict.ok and "out: max error" in verdict.reason and label in verdict.reason


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_gpu_the_real_kernel_passes_the_check_auto_runs(dtype):
    # On a GPU: every tile config the autotuner can pick, compiled and run at the check's shapes.
    if dtype == torch.bfloat16 and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("bfloat16 needs compute capability >= 8.0")
    for d, dv, causal, masked in ((80, 80, True, True), (64, 48, False, False), (128, 128, False, True)):
        verdict = trust.check(dispatch._under_check(dtype), "cuda", dtype, d, dv, causal=causal, masked=masked,
                              backward=True)
        assert verdict.ok, verdict.reason


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(kernels=None), TypeError, "check: `kernels` must be a function"),
    (dict(kernels={}), TypeError, "check: `kernels` must be a function"),
    (dict(dtype=torch.int64), TypeError, "check: `dtype` must be a floating torch.dtype"),
    (dict(d=0), ValueError, "check: `d` must be an int >= 1, got 0"),
    (dict(dv="8"), TypeError, "check: `dv` must be an int >= 1"),
    (dict(causal=1), TypeError, "check: `causal` must be a bool"),
    (dict(shapes={"x": (1, 1, 0, 4)}), TypeError, "check: `shapes` must be a non-empty dict"),
    (dict(device="nope"), ValueError, "check: `device` must name a torch device, got 'nope'"),
    (dict(device=3.5), TypeError, "check: `device` must be a torch.device or str"),
])
def test_check_arguments_get_clear_errors(kwargs, exc, message):
    args = dict(kernels=exact, device="cpu", dtype=torch.float32, d=8)
    with pytest.raises(exc, match=re.escape(message)):
        trust.check(**{**args, **kwargs})


def _scales_q_in_place(q, k, v, mask, causal, scale):
    with torch.no_grad():
        q.mul_(2.0)                              # the bug: the caller's q is changed
    return attention_tiled(q / 2.0, k, v, mask=mask, causal=causal, scale=scale).out


def test_run_gives_each_kernel_its_own_clones_and_leaves_the_callers_tensors_alone():
    q, k, v, do, mask = trust.inputs((1, 1, 5, 7), 4, 4, masked=False)
    q32 = q.float()
    before = q32.clone()
    trust.run(_scales_q_in_place, q32, k.float(), v.float(), None, mask, False, 0.5, torch.float32, "cpu")
    assert torch.equal(q32, before)              # float32 in, float32 run: .to() alone was no copy
    with torch.no_grad():                         # control: the kernel does mutate what it is given
        direct = q32.clone()
        _scales_q_in_place(direct, k.float(), v.float(), None, False, 0.5)
    assert torch.equal(direct, 2 * before)


def test_check_does_not_blame_an_honest_kernel_after_a_mutating_one():
    """check's inputs are float64: the float64 run once handed the kernel the truth's own tensors."""
    shapes = {"small": (1, 1, 9, 7)}
    kernels = {"mutating": _scales_q_in_place, "honest": exact}
    verdict = trust.check(kernels, "cpu", torch.float64, 8, shapes=shapes)
    assert verdict.ok, verdict.reason            # the mutating kernel returns the right output
    assert trust.check({"honest": exact}, "cpu", torch.float64, 8, shapes=shapes).ok
