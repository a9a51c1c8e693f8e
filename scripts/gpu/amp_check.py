"""Mixed-precision checks for scripts/gpu/mixed-precision.sh: each prints
`name value` lines, the same natively and through the stand-in when the
stand-in is right. usage: amp_check.py torch_mm|torch_amp|cupy|jax"""
import sys

mode = sys.argv[1]

if mode == "torch_mm":
    import torch
    g = torch.Generator().manual_seed(0)
    a = torch.randn(512, 512, generator=g)
    b = torch.randn(512, 512, generator=g)
    ref = (a.double() @ b.double())
    for dt in (torch.float16, torch.bfloat16):
        c = (a.to("cuda", dt) @ b.to("cuda", dt)).double().cpu()
        rel = (c - ref).norm() / ref.norm()
        print(f"mm_{str(dt)[6:]}_relerr {rel:.3e}", flush=True)
        assert rel < 1e-2, rel
    torch.backends.cuda.preferred_blas_library("cublas")
    c = (a.to("cuda", torch.float16) @ b.to("cuda", torch.float16)).double().cpu()
    print(f"mm_float16_cublas_relerr {(c - ref).norm() / ref.norm():.3e}", flush=True)
    print("torch_mm ok")
elif mode == "torch_amp":
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    for dt, scaler in ((torch.bfloat16, False), (torch.float16, True)):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                            nn.Linear(16 * 16 * 16, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        sc = torch.amp.GradScaler("cuda") if scaler else None
        x = torch.randn(64, 3, 16, 16, device="cuda")
        y = torch.randint(0, 10, (64,), device="cuda")
        for step in range(5):
            with torch.autocast("cuda", dtype=dt):
                loss = nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            if sc:
                sc.scale(loss).backward(); sc.step(opt); sc.update()
            else:
                loss.backward(); opt.step()
            print(f"amp_{str(dt)[6:]}_loss_{step} {loss.item():.6f}", flush=True)
    print("torch_amp ok")
elif mode == "cupy":
    import cupy as cp
    cp.random.seed(0)
    a = cp.random.rand(512, 512).astype(cp.float16)
    b = cp.random.rand(512, 512).astype(cp.float16)
    c = (a @ b).astype(cp.float64)
    ref = a.astype(cp.float64) @ b.astype(cp.float64)
    print(f"cupy_fp16_relerr {float(cp.linalg.norm(c - ref) / cp.linalg.norm(ref)):.3e}")
    print("cupy ok")
elif mode == "jax":
    import jax, jax.numpy as jnp
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(k1, (512, 512))
    b = jax.random.normal(k2, (512, 512))
    c = (a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16)).astype(jnp.float32)
    ref = a @ b
    print(f"jax_bf16_relerr {float(jnp.linalg.norm(c - ref) / jnp.linalg.norm(ref)):.3e}")
    print("jax ok")
