"""CuPy through the stand-in on the sim (run by tests/tests/frameworks.rs):
its device, the vGPU's memory limit as its memory, copies both ways, a
memset, a stream, and an allocation over the limit as CuPy's own
OutOfMemoryError. The sim runs none of CuPy's kernels, so nothing here
launches one. Prints `cupy: ...` lines; exits 0 only if all is right."""
import sys

import numpy as np
import cupy as cp


def main(limit):
    assert cp.cuda.runtime.getDeviceCount() == 1
    props = cp.cuda.runtime.getDeviceProperties(0)
    print("cupy: device", props["name"].decode(), props["multiProcessorCount"], "SMs")
    free, total = cp.cuda.runtime.memGetInfo()
    assert total == limit, (total, limit)
    a = cp.asarray(np.arange(1 << 16, dtype=np.float32))
    assert (a.get() == np.arange(1 << 16, dtype=np.float32)).all()
    z = cp.zeros(1000, dtype=cp.float32)
    assert (z.get() == 0).all()
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        c = cp.asarray(np.full(4096, 0.5))
        s.synchronize()
    assert float(c.get().sum()) == 2048.0
    print("cupy: copies, memset and a stream correct")
    try:
        cp.empty(limit, dtype=cp.uint8)
    except cp.cuda.memory.OutOfMemoryError:
        print("cupy: an allocation over the vGPU's limit is CuPy's OutOfMemoryError")
    else:
        sys.exit("an allocation over the limit succeeded")
    # What CuPy's pool held is given back; the memory is there again.
    cp.get_default_memory_pool().free_all_blocks()
    b = cp.empty(limit // 2, dtype=cp.uint8)
    del b
    print("cupy: all checks passed")


if __name__ == "__main__":
    main(int(sys.argv[1]))
