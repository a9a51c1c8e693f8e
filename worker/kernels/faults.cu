// What a tenant's buggy or chatty kernel does: prints (device printf), fails a
// device-side assert, traps. Compiled to faults.ptx (see its header); the
// sim executor models each by name.
#include <cassert>
#include <cstdio>
extern "C" __global__ void fvg_printf(int tag) { printf("kernel %d thread %d\n", tag, (int)threadIdx.x); }
extern "C" __global__ void fvg_assert(const int *p) { assert(p == nullptr); }
extern "C" __global__ void fvg_trap() { asm volatile("trap;"); }
