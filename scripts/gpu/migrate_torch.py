"""PyTorch training whose vGPU moves mid-run (scripts/gpu/migrate-torch.sh):
a small transformer trained with fresh seeded batches, first in float32
(TF32 off), then under bf16 autocast (with MT_GRAPH=1, each phase's
whole training step captured once in a CUDA graph and replayed); every
step's loss is printed as
`name value`, and the parameters' checksum at the end. With a progress file
given, the last step done is written there after each step (the script
moves the vGPU once a phase is well under way).

usage: python3 migrate_torch.py STEPS [PROGRESS_FILE]
       python3 migrate_torch.py compare A B
       python3 migrate_torch.py control SOCKET   (a line in, its answer out)
       python3 migrate_torch.py link MIB         (loopback TCP alone, GiB/s)
"""
import sys


def graphed_step(model, opt, batch, seq, width, dtype):
    """The whole training step captured once in a CUDA graph (PyTorch's
    whole-network capture), fed through static tensors: a function that
    copies a batch in, replays the graph and gives the loss back."""
    import torch
    x = torch.zeros(batch, seq, width, device="cuda")
    y = torch.zeros(batch, dtype=torch.long, device="cuda")

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=dtype or torch.float32,
                            enabled=dtype is not None, cache_enabled=False):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    # Warm up on a side stream, as capture wants, on zeros (the same in
    # every run), then capture.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            warm = step()
    torch.cuda.current_stream().wait_stream(s)
    print(f"warm-up loss {float(warm)!r}", flush=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        loss = step()

    def run(bx, by):
        x.copy_(bx)
        y.copy_(by)
        g.replay()
        return loss
    return run


def train(steps, progress):
    import os
    import torch
    graphed = os.environ.get("MT_GRAPH") == "1"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(1)
    width, seq, batch = 128, 32, 16
    layer = torch.nn.TransformerEncoderLayer(width, 4, dim_feedforward=2 * width,
                                             dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, 2),
                                torch.nn.Flatten(),
                                torch.nn.Linear(width * seq, 10)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=graphed)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(2)
    for phase, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        run = graphed_step(model, opt, batch, seq, width, dtype) if graphed else None
        for i in range(steps):
            x = torch.randn(batch, seq, width, device="cuda", generator=gen)
            y = torch.randint(0, 10, (batch,), device="cuda", generator=gen)
            if run:
                loss = run(x, y)
            else:
                opt.zero_grad()
                with torch.autocast("cuda", dtype=dtype or torch.float32,
                                    enabled=dtype is not None):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
            print(f"{phase}_loss_{i} {float(loss)!r}", flush=True)
            if progress:
                with open(progress, "w") as f:
                    f.write(f"{phase} {i}\n")
    total = sum(float(p.detach().double().abs().sum()) for p in model.parameters())
    print(f"params {total!r}", flush=True)


def values(path):
    out = {}
    for line in open(path):
        parts = line.split()
        if len(parts) == 2 and (parts[0].endswith(tuple("0123456789")) or parts[0] == "params"):
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return out


def compare(a, b):
    """Prints how the two runs' values agree; exits 0 if every one is there
    in both and within 1e-5 relative (a NaN on either side is not)."""
    import math
    va, vb = values(a), values(b)
    names = sorted(set(va) | set(vb))
    exact = sum(1 for n in names if va.get(n) == vb.get(n))

    def close(x, y):
        return abs(x - y) <= 1e-5 * max(abs(x), abs(y), 1e-30)
    bad = [n for n in names if n not in va or n not in vb or not close(va[n], vb[n])]
    nan = sum(1 for n in names if math.isnan(vb.get(n, 0.0)) or math.isnan(va.get(n, 0.0)))
    if nan:
        print(f"nan={nan}")
    for n in bad[:10]:
        print(f"differs: {n} native={va.get(n)} standin={vb.get(n)}")
    print(f"values={len(names)} exact={exact} within_1e-5={len(names) - len(bad)}")
    sys.exit(0 if names and not bad else 1)


def control(path):
    """Relays each line of stdin to a guest process's control socket
    (FAIRVGPU_CONTROL) over one connection, printing each answer: a pause
    lasts while the connection does."""
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    answers = s.makefile("r")
    for line in sys.stdin:
        s.sendall(line.encode())
        print(answers.readline().strip(), flush=True)


def link(mib):
    """MIB MiB through a loopback TCP connection alone: the link's rate."""
    import socket
    import threading
    import time
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    chunk = bytes(4 << 20)

    def sink():
        c, _ = srv.accept()
        while c.recv_into(bytearray(4 << 20)):
            pass
    t = threading.Thread(target=sink)
    t.start()
    out = socket.create_connection(srv.getsockname())
    t0 = time.perf_counter()
    for _ in range(mib // 4):
        out.sendall(chunk)
    out.close()
    t.join()
    print(f"{(mib / 1024) / (time.perf_counter() - t0):.2f}")


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "control":
        control(sys.argv[2])
    elif sys.argv[1] == "link":
        link(int(sys.argv[2]))
    else:
        train(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
