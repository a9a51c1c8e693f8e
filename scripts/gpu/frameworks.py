"""One framework's checks, run by scripts/gpu/frameworks.sh natively and
through the stand-in: prints `name value` lines to compare, and `time_ms`
lines; exits 0 if everything ran.

usage: python3 frameworks.py torch|cupy|jax
"""
import sys
import time


def torch_checks():
    t0 = time.perf_counter()
    import torch

    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    print(f"time_ms startup {1000 * (time.perf_counter() - t0):.1f}")
    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(256, 256, device="cuda")
    print("matmul_sum", float((a @ a).sum()))
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(8 * 16 * 16, 10),
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
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
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    print(f"time_ms cnn_step {1000 * (time.perf_counter() - t) / 100:.3f}")
    print("cnn_loss_first", losses[0])
    print("cnn_loss_last", losses[-1])
    # A CUDA graph replay of the forward pass.
    static = torch.randn(32, 3, 16, 16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        model(static)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = model(static)
    static.copy_(data)
    g.replay()
    torch.cuda.synchronize()
    print("graph_out_sum", float(out.sum()))


def cupy_checks():
    import cupy as cp
    import numpy as np

    rng = np.random.default_rng(0)
    a = cp.asarray(rng.standard_normal((128, 128)))
    print("sum", float(a.sum()))
    print("matmul_sum", float((a @ a).sum()))
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
    print("loss", float(loss(w, x)))


if __name__ == "__main__":
    {"torch": torch_checks, "cupy": cupy_checks, "jax": jax_checks}[sys.argv[1]]()
    print("done")
