// How fast can a guest copy 4 MiB chunks out of a DMA target (the response
// arena) into its own 64 MiB buffer? It decides how the guest library should
// copy a device-to-host transfer out of the arena. Built and run by
// scripts/gpu/copy-probe.sh.
//
// Each round: the GPU writes a chunk (256 KiB, 1 MiB or 4 MiB) into a
// registered (pinned) ring of four chunks with cuMemcpyDtoH, then the CPU copies it into the destination; only
// the CPU copies are timed. Methods: memcpy; SSE2 non-temporal stores
// (_mm_stream_si128, no read of the destination's lines before writing them).
#include "probe.h"
#include <emmintrin.h>
#include <stdint.h>
#include <string.h>

static void stream_copy(void *dst, const void *src, size_t n) {
  char *d = dst;
  const char *s = src;
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > n) head = n;
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)s);
    __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
    _mm_stream_si128((__m128i *)d, a);
    _mm_stream_si128((__m128i *)(d + 16), b);
    _mm_stream_si128((__m128i *)(d + 32), c);
    _mm_stream_si128((__m128i *)(d + 48), e);
  }
  memcpy(d, s, n);
  _mm_sfence();
}

int main(void) {
  const size_t total = 64 << 20, ring = 16 << 20;
  CUdevice dev;
  CUcontext ctx;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuCtxCreate(&ctx, NULL, 0, dev));
  CUdeviceptr d;
  CK(cuMemAlloc(&d, total));
  unsigned char *pattern = malloc(total);
  for (size_t i = 0; i < total; i++) pattern[i] = (unsigned char)(i * 7 + 3);
  CK(cuMemcpyHtoD(d, pattern, total));
  unsigned char *arena = aligned_alloc(4096, ring);
  memset(arena, 0, ring);
  CK(cuMemHostRegister(arena, ring, CU_MEMHOSTREGISTER_PORTABLE));
  const char *names[] = {"memcpy", "stream"};
  printf("%-8s %8s %10s %10s %10s\n", "method", "chunk_k", "copy_ms", "copy_gbps", "wrong");
  const size_t chunks[] = {256 << 10, 1 << 20, 4 << 20};
  for (int ci = 0; ci < 3; ci++) {
    const size_t chunk = chunks[ci];
    for (int m = 0; m < 2; m++) {
      unsigned char *dst = malloc(total);
      memset(dst, 0xff, total);  // resident, and not what comes
      double cpu = 0;
      for (int it = 0; it < 5; it++) {
        for (size_t off = 0; off < total; off += chunk) {
          // The ring holds four chunks, as the worker's arena does.
          unsigned char *slot = arena + (off % (4 * chunk));
          CK(cuMemcpyDtoH(slot, d + off, chunk));
          double t0 = now();
          if (m == 0) memcpy(dst + off, slot, chunk); else stream_copy(dst + off, slot, chunk);
          cpu += now() - t0;
        }
      }
      size_t wrong = 0;
      for (size_t i = 0; i < total; i++) wrong += dst[i] != pattern[i];
      printf("%-8s %8zu %10.3f %10.2f %10zu\n", names[m], chunk >> 10, cpu / 5 * 1e3,
             total / (cpu / 5) / 1e9, wrong);
      fflush(stdout);
      free(dst);
    }
  }
  return 0;
}
