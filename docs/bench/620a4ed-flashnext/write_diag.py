"""Where hyper_kernels.write departs from torch's composition on the GPU, with and without PDL."""
import torch
from tfd_kernels import hyper as hk, pdl

torch.manual_seed(0)
for width in (40, 2560):
    for enabled in (True, False):
        pdl.ENABLED = enabled
        stack = torch.randn(33, 4 * width, device="cuda").bfloat16()
        output = torch.randn(33, width, device="cuda").bfloat16()
        scale = (torch.rand(33, 4, device="cuda") + 0.5).bfloat16()
        torch.cuda.synchronize()
        got = hk.write(stack, output, scale)
        torch.cuda.synchronize()
        want = stack + (output[:, None, :] * scale[:, :, None]).flatten(-2)
        prod = (output[:, None, :] * scale[:, :, None]).flatten(-2)
        f32 = (stack.float() + output.float()[:, None, :].mul(scale.float()[:, :, None]).flatten(-2)).bfloat16()
        f32r = (stack.float() + prod.float()).bfloat16()
        bad = (got != want).nonzero()
        print(f"width {width} pdl {enabled}: {len(bad)} of {got.numel()} differ; got==fp32-unrounded-product "
              f"{torch.equal(got, f32)}; want==fp32(rounded product) {torch.equal(want, f32r)}")
        for r, c in bad[:4].tolist():
            s, k = divmod(c, width)
            print(f"  row {r} stream {s} col {k}: stack {stack[r, c].item()!r} out {output[r, k].item()!r} "
                  f"scale {scale[r, s].item()!r} got {got[r, c].item()!r} want {want[r, c].item()!r} "
                  f"prod {prod[r, c].item()!r}")
