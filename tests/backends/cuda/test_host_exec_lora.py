"""lora_shrink / lora_expand of the CUDA sources (ops/lora.cu), run on CPU threads (host execution) at warp 32 and 64
under ASan / UBSan, against float64 references: h = scales[s] * x @ a[s].T (0 without an adapter) within f32's
tolerance, out + h @ b[s] within the dtype's (rows without an adapter bit for bit untouched); rows alone and in a batch
bit for bit; an adapter out of range reported at the next synchronizing call."""

import pytest
import torch

import llaisys
from llaisys.testing.compare import TOLERANCE, close

pytestmark = pytest.mark.slow  # compiles the CUDA sources under ASan for host execution (cached; minutes of CPU)
CODE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
LLAISYS = {torch.float32: llaisys.float32, torch.float16: llaisys.float16, torch.bfloat16: llaisys.bfloat16}


class Lora:
    def __init__(self, dev, m, k, r, n, s, dtype, seed, adapters=None):
        g = torch.Generator().manual_seed(seed)
        self.dev, self.dtype, self.m, self.r, self.n = dev, dtype, m, r, n
        a = torch.randn((s, r, k), generator=g, dtype=torch.float64) / max(k, 1) ** 0.5
        b = torch.randn((s, r, n), generator=g, dtype=torch.float64) / max(r, 1) ** 0.5
        for i in range(s):  # a lower rank padded with zero rows
            rank = int(torch.randint(1, r + 1, (1,), generator=g)) if r else 0
            a[i, rank:], b[i, rank:] = 0, 0
        self.a, self.b = a.to(dtype), b.to(dtype)
        self.x = torch.randn((m, k), generator=g, dtype=torch.float64).to(dtype)
        self.scales = torch.rand(s, generator=g, dtype=torch.float64).add(0.25).mul(
            torch.randint(0, 2, (s,), generator=g) * 2 - 1).float()
        if adapters is None:
            adapters = torch.randint(-1, s, (m,), generator=g)
            adapters[1::3] = adapters[0::3][:len(adapters[1::3])]  # segments of consecutive rows
        self.adapters = torch.as_tensor(adapters, dtype=torch.int64)
        self.h = torch.randn((m, r), generator=g)
        self.out0 = torch.randn((m, n), generator=g, dtype=torch.float64).to(dtype)
        self.da, self.db, self.dscales = dev.upload(self.a), dev.upload(self.b), dev.upload(self.scales)

    def shrink(self, rows=None):
        rows = torch.arange(self.m) if rows is None else rows
        h = self.dev.empty((len(rows), self.r), torch.float32)
        self.dev.op("lora_shrink", CODE[self.dtype], len(rows), self.x.shape[1], self.r, self.a.shape[0], h,
                    self.dev.upload(self.x[rows]), self.da, self.dev.upload(self.adapters[rows]), self.dscales)
        return self.dev.download(h)

    def expand(self, rows=None):
        rows = torch.arange(self.m) if rows is None else rows
        out = self.dev.upload(self.out0[rows])
        self.dev.op("lora_expand", CODE[self.dtype], len(rows), self.r, self.n, self.b.shape[0], out,
                    self.dev.upload(self.h[rows]), self.db, self.dev.upload(self.adapters[rows]))
        return self.dev.download(out)

    def shrink_reference(self):
        h = torch.zeros((self.m, self.r), dtype=torch.float64)
        for i, s in enumerate(self.adapters.tolist()):
            if s >= 0:
                h[i] = float(self.scales[s]) * (self.a[s].double() @ self.x[i].double())
        return h.numpy()

    def expand_reference(self):
        out = self.out0.double()
        for i, s in enumerate(self.adapters.tolist()):
            if s >= 0:
                out[i] += self.h[i].double() @ self.b[s].double()
        return out.numpy()


# (M, K, R, N, S): odd sizes, K not a multiple of the warp, R across tiles of 8 r, N across blocks of 256 n
SHAPES = [(1, 1, 1, 1, 1), (3, 7, 8, 5, 2), (17, 200, 16, 300, 4), (5, 64, 20, 257, 3), (2, 1536, 64, 40, 2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
def test_lora_ops_match_the_float64_reference(dev, dtype):
    for i, (m, k, r, n, s) in enumerate(SHAPES):
        case = Lora(dev, m, k, r, n, s, dtype, seed=i)
        what = f"{(m, k, r, n, s)} adapters {case.adapters.tolist()}"
        close(case.shrink().numpy(), case.shrink_reference(), llaisys.float32, TOLERANCE[llaisys.float32],
              f"lora_shrink {what}")
        got = case.expand()
        close(got.to(torch.float64).numpy(), case.expand_reference(), LLAISYS[dtype], TOLERANCE[LLAISYS[dtype]],
              f"lora_expand {what}")
        idle = case.adapters < 0
        assert torch.equal(got[idle].view(torch.int16 if dtype != torch.float32 else torch.int32),
                           case.out0[idle].view(torch.int16 if dtype != torch.float32 else torch.int32)), what


def test_rows_do_not_depend_on_the_batch(dev):
    case = Lora(dev, 11, 100, 12, 270, 3, torch.bfloat16, seed=7, adapters=[0, 0, 0, 2, -1, 2, 2, 1, 1, -1, 0])
    h, out = case.shrink(), case.expand()
    for start, m in ((0, 1), (10, 1), (3, 1), (2, 4), (5, 6)):
        rows = torch.arange(start, start + m)
        assert torch.equal(case.shrink(rows), h[rows]), (start, m)
        assert torch.equal(case.expand(rows).view(torch.int16), out[rows].view(torch.int16)), (start, m)


def test_rows_without_an_adapter(dev):
    case = Lora(dev, 3, 16, 4, 8, 2, torch.float32, seed=9, adapters=[-1, 1, -1])
    case.out0[0, :3] = torch.tensor([float("nan"), -0.0, float("inf")])
    h, out = case.shrink(), case.expand()
    assert not h[[0, 2]].view(torch.int32).any() and torch.isfinite(h).all()
    assert torch.equal(out[[0, 2]].view(torch.int32), case.out0[[0, 2]].view(torch.int32))


@pytest.mark.parametrize("op", ["lora_shrink", "lora_expand"])
@pytest.mark.parametrize("bad", [2, -2])
def test_an_adapter_out_of_range_is_reported(dev, op, bad):
    from host_exec.device import SlotError

    case = Lora(dev, 3, 16, 4, 8, 2, torch.float32, seed=10, adapters=[0, bad, 1])
    with pytest.raises(SlotError) as info:
        case.shrink() if op == "lora_shrink" else case.expand()
    assert info.value.status == 1 and f"{op}: adapters[1] = {bad}" in info.value.message, info.value.message
    # with nothing to compute (R = 0) the adapters are still checked
    buffer, adapters = dev.empty((8,), torch.float32), dev.upload(torch.tensor([0, 1, bad]))
    sizes = (3, 16, 0, 2) if op == "lora_shrink" else (3, 0, 8, 2)
    dev.op(op, CODE[torch.float32], *sizes, buffer, buffer, buffer, adapters, *([buffer] if op == "lora_shrink" else []))
    with pytest.raises(SlotError) as info:
        dev.synchronize()
    assert f"{op}: adapters[2] = {bad}" in info.value.message, info.value.message
