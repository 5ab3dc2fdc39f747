"""The backend conformance suite: every op slot of ``llaisys/backend.h`` x dtype x layout class, run through the
public ``llaisys.ops`` frontends on a device and compared with float64 references (numpy; no torch).

From the command line::

    llaisys check-backend NAME [--ops add,linear] [--dtypes f32,bf16] [--perf] [-v]

prints an op x dtype table (``pass N`` / ``FAIL <max error> (F/N)`` / ``not impl`` / ``fallback`` / ...; see
``llaisys.testing.report``), then every failed case by op, dtype and case name; exits 1 on any failure, 2 on a bad
name or a device whose backend is not loaded. From Python::

    report = llaisys.testing.check_backend("mydev", ops=["add", "rms_norm"])   # a Report
    print(report); assert report.ok

From pytest (an out-of-tree backend's tests; ``llaisys new-backend`` writes them), one test per case::

    import pytest
    import llaisys.testing

    @pytest.mark.parametrize("case", llaisys.testing.cases(), ids=lambda c: c.id)
    def test_conformance(case):
        case.run("mydev")      # AssertionError naming op, dtype and case; pytest.skip where the op is not native

``cases(ops=..., dtypes=...)`` selects as ``check_backend`` does (``cases("add,rms_norm", "f32")``).

Layout classes (a case's name starts with one): contiguous, odd shape (sizes 1, 3, 17, ...), strided (views:
rearrange, the one op that takes any strides), in-place (an output that is an input, where the op allows it),
aliasing refused (an output partly overlapping an input: core must refuse it before any kernel runs), batch-
invariant (a row's result bit for bit the same alone or in a batch: linear, the quantized linears, moe_linear,
paged_attention), property (what the contract fixes without a numeric reference: argmax's first index on ties,
sample's seeded draws, errors for out-of-range indices, ...). Tolerances are the repository's
(docs/design/numerics.md, ``llaisys.testing.compare``); outputs start as NaN so that unwritten elements show.
"""

from .case import Case, Ctx, Outcome, op_support
from .compare import ADD_TOLERANCE, ROPE_TOLERANCE, TOLERANCE, CaseFailed
from .report import PerfRow, Report, Result
from .runner import OPS, cases, check_backend, suite_dtypes

__all__ = ["ADD_TOLERANCE", "OPS", "ROPE_TOLERANCE", "TOLERANCE", "Case", "CaseFailed", "Ctx", "Outcome", "PerfRow",
           "Report", "Result", "cases", "check_backend", "op_support", "suite_dtypes"]
