"""Which fp32 convolutions PyTorch's precision settings make TF32 (a GPU diagnostic, issue 20 item 9).

    python -m kstrata.tools.conv_tf32_probe

One 3x3 convolution (8 -> 32 channels over 8x8x256x256) in eager NCHW, eager channels-last and torch.compile,
with `torch.backends.cudnn.allow_tf32` on (PyTorch's default) and off; prints each one's relative L2 error
against float64. Measured on the H200 (testsuite/results/verify-holes-gpu-2026-12-01-conv-tf32.md): with the
default, eager NCHW 1.5e-7 but channels-last and torch.compile 2.9e-4 (TF32).
"""

from __future__ import annotations


def main() -> int:
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("error: needs an NVIDIA GPU (cuDNN's algorithm choice is what this measures)")
        return 2
    torch.manual_seed(0)
    x = torch.randn(8, 8, 256, 256, device="cuda")
    w = torch.randn(32, 8, 3, 3, device="cuda") * 0.1
    ref = F.conv2d(x.double(), w.double(), padding=1)

    def rel(y: torch.Tensor) -> float:
        return float((y.double() - ref).norm() / ref.norm())

    saved = torch.backends.cudnn.allow_tf32
    try:
        for tf32 in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            a = rel(F.conv2d(x, w, padding=1))
            cl = torch.channels_last
            b = rel(F.conv2d(x.to(memory_format=cl), w.to(memory_format=cl), padding=1))
            c = rel(torch.compile(lambda x, w: F.conv2d(x, w, padding=1))(x, w))
            torch._dynamo.reset()
            print(f"cudnn.allow_tf32={tf32}: eager NCHW {a:.3g}  eager channels_last {b:.3g}  torch.compile {c:.3g}")
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
