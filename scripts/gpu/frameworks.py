"""One framework's checks, run by scripts/gpu/frameworks.sh natively and
through the stand-in: prints `name value` lines to compare, and `time_ms`
lines; exits 0 if everything ran.

usage: python3 frameworks.py torch|amp|cupy|jax
       python3 frameworks.py torch-times [amp]            (the transformer's step time)
       python3 frameworks.py share START_EPOCH SECONDS   (the two-VM run)
       python3 frameworks.py share-ref                    (its losses, alone)
       python3 frameworks.py compare A B                  (two outputs' values)
"""
import os
import statistics
import sys
import time


def transformer(torch, width=64, seq=32, batch=16):
    """A transformer classifier, its data and its optimizer, made the same
    way on every call (fixed seed). The default is small (its steps are
    bound by launches); the shared run's is large enough that its steps
    are bound by the GPU, so that two VMs training at once both keep work
    queued and the scheduler's weights decide their shares."""
    torch.manual_seed(1)
    layer = torch.nn.TransformerEncoderLayer(width, 4, dim_feedforward=2 * width,
                                             dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 2),
                                torch.nn.Flatten(), torch.nn.Linear(width * seq, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(batch, seq, width, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    return model, opt, x, y


# The shared run's transformer: about 10 ms of GPU time per step on an H100.
SHARED = dict(width=512, seq=256, batch=64)
# The shared run's steps whose loss and parameters are checked against the
# run alone's (by step 20 its loss is 0 in float32: a weak check alone).
LOSS_STEP, PARAMS_STEP = 3, 20


def param_sum(model):
    """The parameters' magnitudes summed in float64: a checksum of the
    training so far."""
    return sum(float(p.detach().double().abs().sum()) for p in model.parameters())


def train_step(torch, model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def deterministic(torch):
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # Attention by the math kernels: the fused ones' backward passes may
    # add in any order.
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)


def torch_checks():
    t0 = time.perf_counter()
    import torch

    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    print(f"time_ms startup {1000 * (time.perf_counter() - t0):.1f}")
    torch.manual_seed(0)
    deterministic(torch)
    a = torch.randn(256, 256, device="cuda")
    print("matmul_sum", float((a @ a).sum()))
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(8 * 16 * 16, 10),
    ).cuda()
    opt = torch.optim.SGD(cnn.parameters(), lr=0.01)
    data = torch.randn(32, 3, 16, 16, device="cuda")
    target = torch.randint(0, 10, (32,), device="cuda")
    losses = []
    t = 0.0
    for i in range(110):
        if i == 10:
            # The first steps choose algorithms and warm caches: untimed.
            torch.cuda.synchronize()
            t = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(cnn(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    print(f"time_ms cnn_step {1000 * (time.perf_counter() - t) / 100:.3f}")
    print("cnn_loss_first", losses[0])
    print("cnn_loss_last", losses[-1])
    # The transformer: 300 steps (the first 20 untimed), then inference.
    model, opt, tx, ty = transformer(torch)
    tl = []
    for i in range(300):
        if i == 20:
            torch.cuda.synchronize()
            t = time.perf_counter()
        tl.append(train_step(torch, model, opt, tx, ty))
    torch.cuda.synchronize()
    print(f"time_ms transformer_step {1000 * (time.perf_counter() - t) / 280:.3f}")
    tl = [float(v) for v in tl]
    print("transformer_loss_first", tl[0])
    print("transformer_loss_100", tl[99])
    print("transformer_loss_last", tl[-1])
    model.eval()
    with torch.no_grad():
        print("transformer_infer_sum", float(model(tx).sum()))
        print("cnn_infer_sum", float(cnn(data).sum()))
    if os.environ.get("FW_COMPILE") == "1":
        # torch.compile of the transformer (Triton kernels, CUDA graphs).
        cm = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(3):
                out = cm(tx)
            torch.cuda.synchronize()
            print("compiled_infer_sum", float(out.sum()))
    # A CUDA graph replay of the forward pass.
    static = torch.randn(32, 3, 16, 16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        cnn(static)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = cnn(static)
    static.copy_(data)
    g.replay()
    torch.cuda.synchronize()
    print("graph_out_sum", float(out.sum()))


def amp_step(torch, model, opt, x, y, dtype, scaler=None):
    """A training step under autocast to `dtype`; with `scaler`, fp16's
    loss scaling (GradScaler)."""
    opt.zero_grad()
    with torch.autocast("cuda", dtype=dtype):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return loss


def amp_checks():
    """Mixed precision: fp16 and bf16 products, and the CNN and the
    transformer trained under bf16 autocast and under fp16 autocast with
    GradScaler, every step's loss printed (cuBLASLt's Hopper kernels,
    clusters and all)."""
    import torch

    deterministic(torch)
    torch.manual_seed(0)
    a = torch.randn(512, 512, device="cuda")
    ref = a.double() @ a.double()
    for dt in (torch.float16, torch.bfloat16):
        c = (a.to(dt) @ a.to(dt)).double()
        print(f"mm_{str(dt)[6:]}_sum", float(c.sum()))
        rel = float((c - ref).norm() / ref.norm())
        assert rel < 1e-2, rel
    for name, dt, scaled in (("bf16", torch.bfloat16, False), ("fp16", torch.float16, True)):
        torch.manual_seed(0)
        cnn = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
            torch.nn.Linear(8 * 16 * 16, 10),
        ).cuda()
        opt = torch.optim.SGD(cnn.parameters(), lr=0.01)
        data = torch.randn(32, 3, 16, 16, device="cuda")
        target = torch.randint(0, 10, (32,), device="cuda")
        scaler = torch.amp.GradScaler("cuda") if scaled else None
        for i in range(10):
            loss = amp_step(torch, cnn, opt, data, target, dt, scaler)
            print(f"amp_{name}_cnn_loss_{i}", float(loss))
        model, opt, tx, ty = transformer(torch)
        scaler = torch.amp.GradScaler("cuda") if scaled else None
        for i in range(10):
            loss = amp_step(torch, model, opt, tx, ty, dt, scaler)
            print(f"amp_{name}_transformer_loss_{i}", float(loss))


def torch_times(amp=False):
    """The small transformer's training step: five blocks of 50 steps after
    20 untimed, each block's ms a step and their median (the ratio of two
    processes' medians is what frameworks.sh reports, paired run by run).
    With `amp`, under bf16 autocast."""
    import torch

    deterministic(torch)
    model, opt, x, y = transformer(torch)

    def step():
        if amp:
            return amp_step(torch, model, opt, x, y, torch.bfloat16)
        return train_step(torch, model, opt, x, y)

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    blocks = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(50):
            step()
        torch.cuda.synchronize()
        blocks.append(1000 * (time.perf_counter() - t) / 50)
    print("time_ms step_blocks", " ".join(f"{b:.3f}" for b in blocks))
    print(f"time_ms transformer_step_median {statistics.median(blocks):.3f}")


def cupy_checks():
    import cupy as cp
    import numpy as np

    rng = np.random.default_rng(0)
    a = cp.asarray(rng.standard_normal((128, 128)))
    print("sum", float(a.sum()))
    print("matmul_sum", float((a @ a).sum()))
    h = a.astype(cp.float16)
    print("matmul_fp16_sum", float((h @ h).astype(cp.float64).sum()))
    print("fft_abs_sum", float(cp.abs(cp.fft.fft(a[0])).sum()))
    b = cp.asarray(rng.standard_normal(128))
    print("solve_sum", float(cp.linalg.solve(a, b).sum()))
    sq = cp.ElementwiseKernel("float64 x", "float64 y", "y = x * x", "sq")
    print("elementwise_sum", float(sq(a).sum()))
    raw = cp.RawKernel(r'''
    extern "C" __global__ void twice(const double* x, double* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = 2.0 * x[i];
    }''', "twice")
    y = cp.empty_like(b)
    raw((1,), (128,), (b, y, cp.int32(128)))
    print("raw_sum", float(y.sum()))


def jax_checks():
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    w = jax.random.normal(key, (64, 64))
    x = jax.random.normal(jax.random.PRNGKey(1), (32, 64))

    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    step = jax.jit(lambda w, x: w - 0.1 * jax.grad(loss)(w, x))
    for _ in range(20):
        w = step(w, x)
    print("devices", jax.devices()[0].platform)
    b = w.astype(jnp.bfloat16)
    print("matmul_bf16_sum", float((b @ b).astype(jnp.float32).sum()))
    print("loss", float(loss(w, x)))


def share(start, seconds):
    """One of the VMs of the shared run: trains the large transformer from
    `start` (a wall-clock time both wait for) for `seconds`; prints its
    steps, its loss at LOSS_STEP and its parameters' sum at PARAMS_STEP
    (which must equal `share_ref`'s)."""
    import torch

    deterministic(torch)
    model, opt, x, y = transformer(torch, **SHARED)
    loss = train_step(torch, model, opt, x, y)
    torch.cuda.synchronize()
    while time.time() < start:
        time.sleep(0.001)
    end = time.perf_counter() + seconds
    steps, checked = 1, {}
    while time.perf_counter() < end:
        loss = train_step(torch, model, opt, x, y)
        steps += 1
        if steps == LOSS_STEP:
            checked[f"share_loss_{LOSS_STEP}"] = float(loss.detach())
        if steps == PARAMS_STEP:
            checked[f"share_params_{PARAMS_STEP}"] = param_sum(model)
        if steps % 10 == 0:
            torch.cuda.synchronize()
    print("share_steps", steps)
    for k, v in checked.items():
        print(k, v)


def share_ref():
    """The shared run's transformer alone: the values `share` checks, and
    its step time."""
    import torch

    deterministic(torch)
    model, opt, x, y = transformer(torch, **SHARED)
    for step in range(1, PARAMS_STEP + 1):
        loss = train_step(torch, model, opt, x, y)
        if step == LOSS_STEP:
            print(f"share_loss_{LOSS_STEP}", float(loss.detach()))
    print(f"share_params_{PARAMS_STEP}", param_sum(model))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        train_step(torch, model, opt, x, y)
    torch.cuda.synchronize()
    print(f"time_ms share_step {1000 * (time.perf_counter() - t0) / 20:.3f}")


def compare(a, b):
    """Exit 0 if outputs `a` and `b` have the same names and every value
    within 1e-5 relative (strings: equal)."""
    def values(path):
        out = {}
        for line in open(path):
            parts = line.split()
            if len(parts) == 2 and parts[0].islower() and not line.startswith("time_ms"):
                out[parts[0]] = parts[1]
        return out
    va, vb = values(a), values(b)
    bad = sorted(k for k in va.keys() | vb.keys()
                 if k not in va or k not in vb or not close(va[k], vb[k]))
    for k in bad:
        print(f"differs: {k} {va.get(k)} {vb.get(k)}")
    sys.exit(1 if bad or not va else 0)


def close(x, y):
    try:
        fx, fy = float(x), float(y)
    except ValueError:
        return x == y
    return abs(fx - fy) <= 1e-5 * max(abs(fx), abs(fy), 1e-30)


if __name__ == "__main__":
    if sys.argv[1] == "share":
        share(float(sys.argv[2]), float(sys.argv[3]))
    elif sys.argv[1] == "share-ref":
        share_ref()
    elif sys.argv[1] == "torch-times":
        torch_times(amp=sys.argv[2:] == ["amp"])
    elif sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    else:
        {"torch": torch_checks, "amp": amp_checks, "cupy": cupy_checks, "jax": jax_checks}[sys.argv[1]]()
    print("done")
