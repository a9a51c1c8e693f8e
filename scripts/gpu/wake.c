// How long a thread asleep in poll(2) on an eventfd takes to run after
// another thread writes it (issue 33: a worker asleep between a program's
// bursts of GPU work is woken this way by its guest's doorbell). Measured
// after the waker paused 0 us to 10 ms (spinning, as a program computing on
// the CPU does), with the sleeper on another CPU; then again while holding
// /dev/cpu_dma_latency at 0 (no deep idle state on any CPU), if it opens;
// then with the sleeper's poll given a timeout of 50 and 200 us.
// Prints per pause the median and 90th percentile in microseconds.
// build: cc -O2 -pthread -o wake wake.c
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static int efd;
static _Atomic uint64_t woke;
// The sleeper's poll timeout in microseconds (-1: none): a sleep that a
// timer ends soon keeps the CPU in a shallow idle state.
static _Atomic int timeout_us = -1;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + t.tv_nsec;
}

static void *sleeper(void *arg) {
  (void)arg;
  for (;;) {
    struct pollfd p = {.fd = efd, .events = POLLIN};
    int to = atomic_load(&timeout_us);
    struct timespec ts = {0, (long)to * 1000};
    if (ppoll(&p, 1, to < 0 ? NULL : &ts, NULL) == 0) continue;
    uint64_t v;
    if (read(efd, &v, 8) != 8) continue;
    if (v == 2) return NULL;
    atomic_store(&woke, now_ns());
  }
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void round_of(const char *mode) {
  const double pauses[] = {0, 100, 1000, 10000};
  enum { N = 300 };
  double t[N];
  for (int p = 0; p < 4; p++) {
    for (int i = 0; i < N; i++) {
      uint64_t end = now_ns() + (uint64_t)(pauses[p] * 1000);
      while (now_ns() < end) {
      }
      atomic_store(&woke, 0);
      uint64_t one = 1, s = now_ns();
      if (write(efd, &one, 8) != 8) exit(1);
      while (atomic_load(&woke) == 0) {
      }
      t[i] = (atomic_load(&woke) - s) / 1000.0;
    }
    qsort(t, N, sizeof t[0], cmp);
    printf("%-22s pause %6.0f us: wake median %7.1f us  p90 %7.1f us\n", mode,
           pauses[p], t[N / 2], t[N * 9 / 10]);
  }
}

int main(void) {
  efd = eventfd(0, 0);
  pthread_t th;
  pthread_create(&th, NULL, sleeper, NULL);
  usleep(10000);
  round_of("default");
  int q = open("/dev/cpu_dma_latency", O_RDWR);
  if (q >= 0) {
    int32_t zero = 0;
    if (write(q, &zero, 4) == 4) round_of("cpu_dma_latency=0");
    close(q);
  } else {
    printf("/dev/cpu_dma_latency: cannot open\n");
  }
  atomic_store(&timeout_us, 50);
  round_of("poll timeout 50 us");
  atomic_store(&timeout_us, 200);
  round_of("poll timeout 200 us");
  atomic_store(&timeout_us, -1);
  round_of("default again");
  uint64_t two = 2;
  if (write(efd, &two, 8) != 8) return 1;
  pthread_join(th, NULL);
  return 0;
}
