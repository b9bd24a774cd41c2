"""Library-test set-up that must happen before any test module is imported.

Triton reads ``TRITON_INTERPRET`` once, when ``triton`` is first imported in the process, and
torch imports triton as a side effect of several modules (``torch.nn.attention.bias`` imports
``torch._dynamo``, which probes for triton). A test module collected before
tests/lib/test_triton_flash.py that touches one of them would otherwise fix triton in compiled
mode, and every later kernel test on a machine without a GPU fails with "Cannot call
@triton.jit'd outside of the scope of a kernel" (found when tests/lib/test_exercises_redteam.py
began to import ``causal_lower_right``). So the kernels are imported here first, under the
interpreter when there is no GPU (``import_triton_flash`` sets the variable for this import
only and restores it). Without triton installed this does nothing.
"""
from attnbook.testing import import_triton_flash

try:
    import_triton_flash()
except ImportError:  # triton missing: the kernel tests skip on their own
    pass
