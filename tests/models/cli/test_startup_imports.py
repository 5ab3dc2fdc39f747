"""Start-up: each command imports only what it uses (issue 35).

ml_dtypes' extension alone takes ~1 s to import; transformers 2-3 s, and 5-8 s with torch, which
transformers 5 imports whenever it is installed; FastAPI and uvicorn are for ``serve``; gguf for .gguf
files. Each test runs its steps in a fresh interpreter, which reports the heavy packages each step
added to ``sys.modules``.
"""

from __future__ import annotations

from helpers.startup_imports import heavy_imports


def test_imports_and_commands_that_load_no_model_import_nothing_heavy():
    steps = ["import llaisys", "import llaisys, numpy; llaisys.from_numpy(numpy.ones(3, numpy.float32)).numpy()",
             "import llaisys_models", "cli('--version')", "cli('devices')", "cli('generate', '--help')",
             "cli('infer', '--help')", "cli('serve', '--help')"]
    imported, out = heavy_imports(*steps)
    assert imported == {step: [] for step in steps}
    assert "llaisys-models" in out and "available devices" in out and "--max-new-tokens" in out  # they ran


def test_the_demo_imports_its_tokenizer_and_nothing_else_heavy():
    """The demo's bf16 weights are read straight into the model's buffers (no numpy bf16 array, so no
    ml_dtypes); its tokenizer is transformers'. Run as the README's install leaves it, without torch
    (transformers would import it: 5-25 s here). A bf16 numpy array still converts once ml_dtypes is imported."""
    no_torch = "sys.modules['torch'] = None"  # unimportable, as on a machine without it
    demo = "cli('generate', '--prompt', '1234+5678=', '--max-new-tokens', '8')"
    bf16 = ("import ml_dtypes, numpy, llaisys; t = llaisys.from_numpy(numpy.arange(4, dtype=ml_dtypes.bfloat16)); "
            "print(t.dtype, t.numpy().dtype, llaisys.as_dtype(ml_dtypes.bfloat16) is llaisys.bfloat16)")
    imported, out = heavy_imports(no_torch, demo, bf16)
    assert out.split()[0] == "6912" and out.split()[-3:] == ["llaisys.bfloat16", "bfloat16", "True"]
    assert "transformers" in imported[demo]  # the tokenizer's
    assert not set(imported[demo]) & {"ml_dtypes", "fastapi", "uvicorn", "gguf"}
